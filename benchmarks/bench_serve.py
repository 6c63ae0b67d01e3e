"""One engine, many programs: four SIS programs with their own models vs one `genlm serve`.

Four client processes each run the SIS workload (16 particles x 20 tokens, genlm_core.tools.sis's
``run_sis``; SmolLM2-135M float32 on CPU by default), started together:

  (a) each process loads its own genlm-hf backend;
  (b) all four go through one ``genlm serve hf`` over the same-host transport (rows
      through each client's ``/dev/shm`` buffer);
  (c) the same server, rows in the network frame over loopback.

Reported per layout: total next-token calls per second over the four (all calls / the
span from the first start to the last finish), per-call latency (median and p99 over
every call of every client), and the total resident memory of all processes (each
client's VmRSS at its end, plus the server's with its children). Also: a single-client
batch of 16 fresh contexts, in process vs through the server (the per-call overhead of
the wire), and the memory model::

    (a) = N * (M + R)          (b) = (M + R) + N * C

M: the weights in memory, R: an engine process's runtime (torch, transformers,
allocator), C: a client's footprint (torch + genlm-core, no engine). (b)/(a) tends to
1/N as M grows; the JSON holds the measured M, R and C of this run.

Where the cycle goes, for (b) and (c) (``accounting`` in the JSON, the second table):
a client's step is one round trip (its particles' calls batched into one request) plus
its own work. Every round trip is cut at the client's stamps and the server's (the ROWS
frame carries them; one monotonic clock on one host,
``genlm_core.serve.phases.round_trip_phases``): client encode, request transport,
read (body and decoding), held (by the gatherer), queued, computing (the forward
passes), delivered, encoding, response transport, client decode; what is left of the
client's span between its round trips is its own time (``client``: its program's
masking and sampling, its batcher, its particles resuming). From the server's
``/v1/stats`` before and after a
layout: rows per forward pass (histogram) and the forward passes' share of the span.
The parts tile each client's span; ``accounted`` sets them against the cycle the
throughput figure sees (the layout's span over a client's steps), which also holds the
clients' staggered starts and ends. ``unwaited_cycle_ms`` is the cycle if no request
waited for another's pass (the client's own time, the wire, one pass of the measured
length), and ``figures.b_over_a_calls_per_s_unwaited`` the (b)/(a) it would give: the
most a better schedule of the same passes can reach (a floor on the cycle only while the
server has room: passes a cycle times their length within the cycle).

``--device``, ``--dtype`` and ``--model`` pick the engines' device, dtype and model folder
(default: the embedded SmolLM2-135M, float32, CPU). On a GPU each layout also reports the
GPU memory of all its processes: every process's own use as ``nvidia-smi`` lists it per
process (CUDA context included), where ``nvidia-smi`` is present and sees this host's
pids; each client with its own backend also reports ``torch.cuda.max_memory_allocated``
and ``max_memory_reserved`` (``gpu`` in the JSON). The memory model above then holds for
GPU memory too, M the weights on the GPU.

Results: ``benchmarks/out/serve.json`` and ``serve.md`` (both name the device and
dtype). Run on a quiet machine.

Usage::

    .venv/bin/python benchmarks/bench_serve.py                       # SmolLM2-135M, 4 clients
    .venv/bin/python benchmarks/bench_serve.py --quick               # tiny model, smoke run
    python benchmarks/bench_serve.py --device cuda --dtype bfloat16 --model DIR --runs 1

Kept in one module: it is one benchmark script (one workload in its three set-ups and
its report), run as a file; its shared pieces already live in common.py.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import verdicts  # noqa: E402
from common import OUT_DIR, device_info, markdown_table, write_results  # noqa: E402
from serve_accounting import ACCOUNTING_COLS, accounting, accounting_rows  # noqa: E402

PROMPT = "Montreal is"


def log(msg: str) -> None:
    print(f"[bench_serve {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def rss_bytes(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def tree_rss(pid: int) -> int:
    """RSS of ``pid`` and its descendants (a server's engine may fork)."""
    import psutil

    proc = psutil.Process(pid)
    total = proc.memory_info().rss
    for child in proc.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def gpu_memory_by_pid() -> dict[int, float] | None:
    """MiB of GPU memory each process uses (CUDA context included), as ``nvidia-smi``
    lists compute processes; None where ``nvidia-smi`` is absent or fails."""
    import shutil

    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    used: dict[int, float] = {}
    for line in out.splitlines():
        pid, _, mib = line.partition(",")
        try:
            used[int(pid)] = used.get(int(pid), 0.0) + float(mib)
        except ValueError:  # "[N/A]" where the driver does not account per process
            continue
    return used


def device_used_mb(device: str) -> float | None:
    """MiB in use on the whole GPU of ``device`` (every process, ``nvidia-smi``'s
    ``memory.used``): the fallback where per-process figures are missing (a VM or sandbox
    whose driver does not list processes); None without ``nvidia-smi``."""
    import shutil

    if not shutil.which("nvidia-smi"):
        return None
    index = int(device.split(":")[1]) if ":" in device else 0
    visible = [v for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible and index < len(visible) and visible[index].strip().isdigit():
        index = int(visible[index])
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--id={index}", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
        return float(out.strip().splitlines()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def tree_gpu_mb(pid: int) -> float | None:
    """GPU memory (MiB, ``nvidia-smi``) of ``pid`` and its descendants; None when unknown."""
    import psutil

    used = gpu_memory_by_pid()
    if used is None:
        return None
    proc = psutil.Process(pid)
    pids = [pid] + [c.pid for c in proc.children(recursive=True)]
    return sum(used.get(p, 0.0) for p in pids)


def is_cuda(device: str) -> bool:
    return device.split(":")[0] == "cuda"


# ---------------------------------------------------------------------- client process
def load_backend(args: argparse.Namespace) -> Any:
    import genlm_core

    if args.mode == "local":
        return genlm_core.load("hf", model=args.model, dtype=args.dtype, device=args.device, batch_size=64)
    return genlm_core.load("remote", url=args.url, transport=args.mode)


def client_gpu(args: argparse.Namespace) -> dict[str, Any] | None:
    """A client's GPU memory: torch's peaks (a client with its own backend) and its
    process's use as ``nvidia-smi`` lists it; None off a GPU."""
    if not is_cuda(args.device):
        return None
    import torch

    used = gpu_memory_by_pid()
    # a process nvidia-smi does not list uses none (a remote client never touches the GPU)
    out: dict[str, Any] = {"nvidia_smi_mb": None if used is None else used.get(os.getpid(), 0.0)}
    # the whole GPU while this layout's processes are alive (each client samples at its end;
    # the first to end sees them all): the layout's use is the largest sample less the baseline
    out["device_used_mb"] = device_used_mb(args.device)
    if args.mode == "local":
        out["max_allocated_mb"] = torch.cuda.max_memory_allocated(args.device) / 2**20
        out["max_reserved_mb"] = torch.cuda.max_memory_reserved(args.device) / 2**20
        if not out["nvidia_smi_mb"] and out["max_reserved_mb"]:
            out["nvidia_smi_mb"] = None  # not listed: nvidia-smi sees another pid namespace
    return out


class TimedCalls:
    """``llm`` with every ``next_token_logprobs`` call timed (what run_sis calls)."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.latencies: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.llm, name)

    async def next_token_logprobs(self, ids: Any) -> Any:
        t0 = time.perf_counter()
        out = await self.llm.next_token_logprobs(ids)
        self.latencies.append(time.perf_counter() - t0)
        return out


def client_main(args: argparse.Namespace) -> int:
    import torch

    from genlm_core.tools.sis import run_sis

    torch.set_num_threads(args.threads)
    llm = load_backend(args)
    # warm-up in the timed runs' shape: in (a) the client's own engine meets every batch
    # size and length once (a GPU's decode graphs captured, kept by clear_cache), as the
    # server meets them in its discarded round
    asyncio.run(
        run_sis(llm, PROMPT, n_particles=args.particles, max_tokens=args.max_tokens, seed=args.seed + 50)
    )
    llm.clear_cache()
    if args.mode != "local":
        llm.engine.reset_timing()  # the warm-up's round trips are not the layout's
    print("READY", flush=True)
    sys.stdin.readline()  # the orchestrator starts every client at once
    timed = TimedCalls(llm)
    start = time.time()
    calls = 0
    held: dict[str, Any] | None = None
    for r in range(args.runs):
        res = asyncio.run(
            run_sis(timed, PROMPT, n_particles=args.particles, max_tokens=args.max_tokens, seed=args.seed + r)
        )
        calls += res.calls
        if args.mode == "local" and r == args.runs - 1:  # what its own backend holds after a run
            held = held_mb(llm.stats())
        llm.clear_cache()
    end = time.time()
    out = {"start": start, "end": end, "calls": calls, "latencies": timed.latencies, "rss": rss_bytes()}
    out["gpu"] = client_gpu(args)
    if args.mode == "local":
        out["held_mb"] = held
    if args.mode != "local":
        out["transport"] = llm.stats()["transport"]  # with the round trips' phases ("timing")
    print("RESULT " + json.dumps(out), flush=True)
    llm.close()
    return 0


# ---------------------------------------------------------------------- orchestration
def clear_server(url: str) -> None:
    """The server's caches dropped, so a layout gets no row computed for an earlier one."""
    import urllib.request

    req = urllib.request.Request(
        url + "/v1/clear_cache", data=b"{}", method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        r.read()


def held_mb(stats: dict[str, Any]) -> dict[str, float | None]:
    """MiB a backend holds, from its ``stats()``: its output cache's rows and its KV (the
    prefix cache's, or hf's pool: the pages it has written); the memory model's parts of M + R."""
    cache = (stats.get("output_cache") or {}).get("bytes")
    engine = stats.get("engine") or {}
    kv = engine.get("kv_pool_bytes_touched", (stats.get("prefix_cache") or {}).get("kv_bytes"))
    return {
        name: (value / 2**20 if isinstance(value, (int, float)) else None)
        for name, value in (("output_cache", cache), ("prefix_kv", kv))
    }


def held_line(model: dict[str, Any]) -> str:
    """The memory model's held parts, one line: the server's backend and one own backend."""

    def parts(held: dict[str, Any] | None) -> str:
        if not held:
            return "-"
        return ", ".join(f"{k} {v:.2f}" if v is not None else f"{k} -" for k, v in held.items())

    return (
        f"held (MiB): the server's backend after (b): {parts(model.get('server_held_mb'))}; "
        f"a client's own backend after its last run (a): {parts(model.get('own_backend_held_mb'))}"
    )


def server_stats(url: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(url + "/v1/stats", timeout=600) as r:
        return json.loads(r.read())


def run_clients(
    args: argparse.Namespace, mode: str, url: str = "", seed0: int = 0, before_go: Any = None
) -> list[dict[str, Any]]:
    """Start the clients, wait until each is warm, call ``before_go()`` (the server's
    counters before the layout), start them together, collect their results."""
    if url:
        clear_server(url)
    cmd = [sys.executable, __file__, "--client", "--mode", mode, "--model", args.model, "--url", url]
    cmd += ["--device", args.device, "--dtype", args.dtype]
    cmd += [
        "--particles",
        str(args.particles),
        "--max-tokens",
        str(args.max_tokens),
        "--runs",
        str(args.runs),
    ]
    # (a): the cores split between the clients' engines; (b), (c): the engine (the server)
    # has them all and a client, which only masks and samples, one thread
    threads = max(1, args.threads // args.clients) if mode == "local" else args.client_threads
    cmd += ["--threads", str(threads)]
    procs = []
    for i in range(args.clients):
        procs.append(
            subprocess.Popen(
                [*cmd, "--seed", str(seed0 + 100 * i)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                cwd=HERE.parent,
            )
        )
    try:
        for p in procs:
            line = p.stdout.readline()
            if line.strip() != "READY":
                raise RuntimeError(f"a {mode} client did not get ready: {line!r}")
        if before_go is not None:
            before_go()
        for p in procs:
            p.stdin.write("GO\n")
            p.stdin.flush()
        results = []
        for p in procs:
            for line in p.stdout:
                if line.startswith("RESULT "):
                    results.append(json.loads(line[len("RESULT ") :]))
            p.wait(timeout=args.timeout)
        if len(results) != len(procs):
            raise RuntimeError(f"{len(procs) - len(results)} {mode} client(s) gave no result")
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=60)


def summarise(
    layout: str,
    results: list[dict[str, Any]],
    server_rss: int = 0,
    server_gpu_mb: float | None = None,
    baseline_gpu_mb: float | None = None,
) -> dict[str, Any]:
    lat = sorted(x for r in results for x in r["latencies"])
    span = max(r["end"] for r in results) - min(r["start"] for r in results)
    calls = sum(r["calls"] for r in results)
    row = {
        "layout": layout,
        "clients": len(results),
        "calls": calls,
        "calls_per_s": calls / span,
        "latency_median_ms": 1e3 * statistics.median(lat),
        "latency_p99_ms": 1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
        "client_rss_mb": sum(r["rss"] for r in results) / 2**20,
        "server_rss_mb": server_rss / 2**20,
        "total_rss_mb": (sum(r["rss"] for r in results) + server_rss) / 2**20,
    }
    tr = [r["transport"] for r in results if "transport" in r]
    if tr:
        row["bytes_received_per_row"] = sum(t["bytes_received"] for t in tr) / max(1, calls)
    gpus = [r.get("gpu") for r in results]
    if any(gpus):  # on a GPU: every process's use (nvidia-smi) where known, torch's peaks
        smi = [g.get("nvidia_smi_mb") for g in gpus if g]
        known = all(v is not None for v in smi) and (server_rss == 0 or server_gpu_mb is not None)
        row["client_gpu_mb"] = sum(v or 0.0 for v in smi) if known else None
        row["server_gpu_mb"] = server_gpu_mb
        row["total_gpu_mb"] = (sum(v or 0.0 for v in smi) + (server_gpu_mb or 0.0)) if known else None
        seen = [g["device_used_mb"] for g in gpus if g and g.get("device_used_mb") is not None]
        if seen and baseline_gpu_mb is not None:
            row["device_gpu_mb"] = max(seen) - baseline_gpu_mb
        peaks = [g["max_allocated_mb"] for g in gpus if g and "max_allocated_mb" in g]
        if peaks:
            row["client_max_allocated_mb"] = sum(peaks)
            row["client_max_reserved_mb"] = sum(g.get("max_reserved_mb", 0.0) for g in gpus if g)
    return row


def per_call_overhead(args: argparse.Namespace, url: str) -> dict[str, Any]:
    """One client, batches of 16 fresh contexts: in process vs through the server (shm
    and frame). Fresh contexts every repeat, so no cache answers on either side.

    Each side first runs the same sequence of batches on other contexts, untimed: what a
    backend prepares once per shape is then prepared on both sides alike. On a GPU each
    repeat's 16 new rows join the resident rows, whose block grows 16 -> 32 -> 64 rows, a
    graph captured at each size: the H100 check of b86b065 timed those captures on the
    in-process side only (the server had met the sizes in its warm-up round), 128 ms a
    batch against 16 through the server."""
    import genlm_core

    def timed(llm: Any, offset: int) -> float:
        prompt = list(llm.tokenizer.encode(PROMPT, add_special_tokens=False))
        vocab = len(llm.byte_vocab)
        times = []
        for base, timing in ((offset + 5000, False), (offset, True)):
            for rep in range(args.repeat):
                ctxs = [prompt + [(base + 16 * rep + i) % vocab] for i in range(16)]
                t0 = time.perf_counter()
                llm.batch_next_token_logprobs_sync(ctxs)
                if timing:
                    times.append(time.perf_counter() - t0)
        return statistics.median(times)

    import torch

    torch.set_num_threads(args.threads)  # as many as the server has
    local = genlm_core.load("hf", model=args.model, dtype=args.dtype, device=args.device, batch_size=64)
    t_local = timed(local, 300)
    local.close()
    out = {"batch": 16, "in_process_ms": 1e3 * t_local, "in_process_ms_per_row": 1e3 * t_local / 16}
    for transport in ("shm", "frame"):
        remote = genlm_core.load("remote", url=url, transport=transport, cache_size=0)
        t = timed(remote, 600 if transport == "shm" else 900)
        stats = remote.stats()["transport"]
        out[f"{transport}_ms"] = 1e3 * t
        out[f"{transport}_ratio"] = t / t_local
        out[f"{transport}_ms_per_row"] = 1e3 * t / 16
        out[f"{transport}_bytes_per_row"] = stats["bytes_received"] / (16 * args.repeat)
        remote.close()
    return out


def orchestrate(args: argparse.Namespace) -> int:
    from genlm_core.serve.testing import ServerProcess

    rows = []
    # the GPU in use before any of this benchmark's processes (the device-wide fallback's zero)
    baseline = device_used_mb(args.device) if is_cuda(args.device) else None
    log(f"(a) {args.clients} clients, each with its own genlm-hf backend ({args.model})")
    own_results = run_clients(args, "local")
    rows.append(summarise("(a) own backend each", own_results, baseline_gpu_mb=baseline))
    opts: dict[str, Any] = {"dtype": args.dtype, "device": args.device, "batch_size": 64}
    for kv in args.server_opt or []:
        key, _, value = kv.partition("=")
        try:
            opts[key] = json.loads(value)
        except json.JSONDecodeError:
            opts[key] = value
    env = {"OMP_NUM_THREADS": str(args.threads)}
    with ServerProcess("hf", model=args.model, opts=opts, env=env) as srv:
        log(f"server ready at {srv.url}; warm-up round (discarded)")
        # the server's first batches of each shape are slow (allocator, KV buffers): measured
        # 1.9 s per call in the first round after start against 30-70 ms in the next ones
        run_clients(args, "frame", srv.url, seed0=10_000)
        accounts = {}
        server_held: dict[str, Any] | None = None
        for mode, name in (
            ("shm", "(b) one server, shared memory"),
            ("frame", "(c) one server, network frame"),
        ):
            log(name)
            before: list[dict[str, Any]] = []
            take = functools.partial(lambda into, url: into.append(server_stats(url)), before, srv.url)
            res = run_clients(args, mode, srv.url, before_go=take)
            after = server_stats(srv.url)
            accounts[name] = accounting(res, before[0], after)
            if mode == "shm":  # what the server's backend holds after (b)'s runs
                server_held = held_mb(after.get("backend") or {})
            gpu_mb = tree_gpu_mb(srv.proc.pid) if is_cuda(args.device) else None
            rows.append(summarise(name, res, tree_rss(srv.proc.pid), gpu_mb, baseline))
        server_rss = tree_rss(srv.proc.pid)
        server_gpu_mb = tree_gpu_mb(srv.proc.pid) if is_cuda(args.device) else None
        overhead = per_call_overhead(args, srv.url)
    a = rows[0]
    figures = {
        "b_over_a_calls_per_s": rows[1]["calls_per_s"] / a["calls_per_s"],
        "c_over_a_calls_per_s": rows[2]["calls_per_s"] / a["calls_per_s"],
        "b_over_a_memory": rows[1]["total_rss_mb"] / a["total_rss_mb"],
        "per_call_overhead_b_at_batch16": overhead["shm_ratio"],
        "targets": {"b_over_a_calls_per_s": ">= 1.5", "b_over_a_memory": "<= 0.6", "overhead": "<= 1.2"},
        # memory model: (a) = N (M + R), (b) = (M + R) + N C
        "memory_model": {
            "N": args.clients,
            "engine_process_mb (M + R)": server_rss / 2**20,
            "client_process_mb (C)": rows[1]["client_rss_mb"] / args.clients,
            "own_backend_process_mb": a["client_rss_mb"] / args.clients,
            # what the server's backend holds after (b), and one of (a)'s after its last run
            "server_held_mb": server_held,
            "own_backend_held_mb": next((r.get("held_mb") for r in own_results if r.get("held_mb")), None),
        },
    }
    if is_cuda(args.device):
        total = [r.get("total_gpu_mb") for r in rows]
        device = [r.get("device_gpu_mb") for r in rows]
        if device[0] and device[1] is not None:
            figures["b_over_a_gpu_memory_device"] = device[1] / device[0]
        if all(t is not None for t in total):
            figures["b_over_a_gpu_memory"] = total[1] / total[0]
            figures["gpu_memory"] = "per process (nvidia-smi compute apps)"
            figures["memory_model"]["engine_process_gpu_mb (M + R)"] = server_gpu_mb
            figures["memory_model"]["own_backend_process_gpu_mb"] = total[0] / args.clients
        elif "b_over_a_gpu_memory_device" in figures:
            figures["b_over_a_gpu_memory"] = figures["b_over_a_gpu_memory_device"]
            figures["gpu_memory"] = (
                "the whole GPU's memory.used while each layout ran, less the baseline before any "
                "process (nvidia-smi lists no processes here)"
            )
        else:
            figures["gpu_memory"] = "nvidia-smi absent or without figures: torch's peaks only"
    b_acc = accounts.get("(b) one server, shared memory")
    if b_acc:  # what (b) could reach if no request waited (serve_accounting: unwaited cycle)
        figures["b_over_a_calls_per_s_unwaited"] = (
            figures["b_over_a_calls_per_s"] * b_acc["cycle_ms"] / b_acc["unwaited_cycle_ms"]
        )
    table = accounting_rows(accounts)
    gpu_cols = ["total_gpu_mb", "device_gpu_mb", "client_max_allocated_mb"] if is_cuda(args.device) else []
    write_results(
        "serve",
        rows,
        {"config": vars(args), "figures": figures, "batch16": overhead, "accounting": accounts},
        cols=[
            "layout",
            "calls_per_s",
            "latency_median_ms",
            "latency_p99_ms",
            "total_rss_mb",
            *gpu_cols,
            "bytes_received_per_row",
        ],
        device=device_info(args.device, args.dtype, args.model),
    )
    md = OUT_DIR / "serve.md"
    md.write_text(
        md.read_text()
        + "\n### Where a step goes, (b) and (c): ms per step and client\n\n"
        + markdown_table(table, ACCOUNTING_COLS)
        + "\n\nrows per pass: "
        + "; ".join(f"{k}: {v['server']['rows_per_pass_histogram']}" for k, v in accounts.items())
        + "\n\n"
        + held_line(figures["memory_model"])
        + "\n"
    )
    print(json.dumps(figures, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2-135M)")
    ap.add_argument(
        "--device", default="cpu", help="the engines' device: cpu, cuda, cuda:1, ... (default: cpu)"
    )
    ap.add_argument("--dtype", default="float32", help="the engines' dtype (float32, bfloat16, float16)")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--particles", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=20)
    ap.add_argument("--runs", type=int, default=3, help="SIS runs per client (run r: seed + r; < 50)")
    ap.add_argument("--repeat", type=int, default=10, help="batches of 16 for the per-call overhead")
    ap.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="cores for the engines: split over (a)'s clients",
    )
    ap.add_argument("--client-threads", type=int, default=1, help="torch threads of a remote client")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument(
        "--server-opt",
        action="append",
        metavar="KEY=VALUE",
        help="option of the served hf backend (repeatable)",
    )
    ap.add_argument("--quick", action="store_true", help="tiny model, 2 clients, 4 particles x 4 tokens")
    # client-process arguments
    ap.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="local", help=argparse.SUPPRESS)
    ap.add_argument("--url", default="", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.client:
        return client_main(args)
    if args.quick:
        sys.path.insert(0, str(HERE.parent / "tests"))
        import model_paths

        args.model = args.model or str(model_paths.tiny_llama())
        args.clients, args.particles, args.max_tokens, args.runs, args.repeat = 2, 4, 4, 1, 3
    if args.model is None:
        from genlm_core import models

        args.model = str(models.smollm2_path(progress=True))
    return orchestrate(args)


# ---------------------------------------------------------------------- verdict
def smoke(result: dict) -> list[str]:
    """Counters that show a path was lost (never timings): (b)'s rows arrive through shared
    memory (bytes per row far below (c)'s frame, which carries every float32 row), and the
    server's passes hold several rows (its batcher, the gatherer)."""
    rows = {r["layout"][:3]: r for r in result.get("rows", [])}
    problems = []
    b, c = rows.get("(b)", {}), rows.get("(c)", {})
    # a frame carries every float32 row (4 KB for the tiny model's 1,024 tokens, 196 KB for
    # SmolLM2) plus the response's own fields (~1 KB per row of a small request, as (b)'s)
    if not b.get("bytes_received_per_row", 1) * 2 < c.get("bytes_received_per_row", 0):
        problems.append(
            f"serve: (b) received {b.get('bytes_received_per_row')} bytes per row against (c)'s "
            f"{c.get('bytes_received_per_row')} (shared memory not used)"
        )
    for name, acc in result.get("accounting", {}).items():
        if acc["server"]["rows_per_pass_mean"] < 2:
            problems.append(
                f"serve {name}: {acc['server']['rows_per_pass_mean']:.1f} rows per pass (batching lost)"
            )
    return problems


def headline(result: dict) -> list[dict]:
    """The summary's rows from ``serve.json``: four SIS clients, one `genlm serve hf`
    (b: shared memory) against a backend each (a)."""
    f = result.get("figures", {})
    a, b = result["rows"][0], result["rows"][1]
    return [
        verdicts.row(
            "serve: 4 SIS clients, calls/s (b) one server over shm vs (a) own backend each",
            b["calls_per_s"],
            a["calls_per_s"],
            f.get("b_over_a_calls_per_s"),
            ">= 1.5",
            f.get("b_over_a_calls_per_s", 0) >= 1.5,
        ),
        verdicts.row(
            "serve: total RSS MB, (b) vs (a)",
            b["total_rss_mb"],
            a["total_rss_mb"],
            f.get("b_over_a_memory"),
            "<= 0.6",
            f.get("b_over_a_memory", 9) <= 0.6,
        ),
        verdicts.row(
            "serve: batch of 16, per-call time through the server (shm) / in process",
            f.get("per_call_overhead_b_at_batch16"),
            target="<= 1.2",
            met=f.get("per_call_overhead_b_at_batch16", 9) <= 1.2,
        ),
    ]


if __name__ == "__main__":
    sys.exit(main())
