"""One engine, its shapes, in a process of its own: what ``bench_long_prompt.py`` starts.

``python long_prompt_worker.py SPEC.json`` loads the engine the spec names (genlm-core's
``hf``, ``llamacpp``, ``vllm`` or ``mlx`` through ``genlm_core.load``, or ``reference``:
genlm-backend 0.3.1's ``AsyncTransformer``, in the anchor venv, which has no genlm-core),
then runs each of the spec's ``runs`` (a shape each; one, unless the benchmark runs an
engine's shapes in one process, as ``--smoke`` does) - a warm-up, then the timed runs
from clean caches (``sis_workload.timed_runs``; a many-programs shape:
``many_programs.many_runs``) - through a :class:`~prefix_tree.PrefixTree` that counts
the fewest tokens the contexts need, and writes ``{"runs": [figures, ...]}`` to the
spec's ``out`` after each shape (a worker stopped at its cap keeps the shapes it ran).

A shape through ``genlm serve`` (``serveKx...``): the worker starts ``genlm serve KIND``
with the same options (:class:`ServedEngine`), its programs are that server's client
(``load("remote")``, shared memory), and the engine's counters and memory are the
server's (``/v1/stats``; its process's ``/proc`` files).

Memory: ``VmRSS`` after the load, the load's peak (``VmHWM``), then before each shape
the peak is reset (``/proc/<pid>/clear_refs``) and read again after its runs: the
process's peak and the runs' own; ``rss_before_bytes``: the RSS when the shape started
(after the load, or after the shapes before it in the same process). On CUDA,
``torch.cuda.max_memory_allocated`` over the runs as well.

While it runs it rewrites the spec's ``progress`` file (phase, calls so far, elapsed
time, peak RSS) about once a second, so that a run stopped at its time cap still says
what it did. Imports no engine at module level and no genlm-core at all for the
reference.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from many_programs import Hooks, many_runs  # noqa: E402
from prefix_tree import PrefixTree  # noqa: E402
from sis_workload import log, sis, timed_runs  # noqa: E402
from smc_workload import smc  # noqa: E402

#: where a genlm-core engine's numbers of the run come from: stats() sections
STATS_SECTIONS = ("batcher", "engine")
#: bytes of one KV entry per dtype name (the engines' own names)
ITEMSIZE = {"float32": 4, "f32": 4, "float16": 2, "f16": 2, "bfloat16": 2, "bf16": 2, "q8_0": 1}


# ---------------------------------------------------------------------- memory
def proc_status(field: str, pid: int | str = "self") -> int:
    """``field`` of /proc/PID/status (``VmRSS``, ``VmHWM``) in bytes; 0 where unknown."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def reset_peak_rss(pid: int | str = "self") -> bool:
    """Reset ``VmHWM`` of PID to its current RSS (Linux >= 4.0); False where it cannot."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def cuda_in_use() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized())


# ---------------------------------------------------------------------- progress
class Progress:
    """The ``progress`` file: rewritten at most every ``every_s`` and at each phase."""

    def __init__(self, path: str | None, every_s: float = 1.0) -> None:
        self.path = Path(path) if path else None
        self.every_s = every_s
        self.state: dict[str, Any] = {"phase": "starting", "started": time.time()}
        self.phase_t0 = time.perf_counter()
        self.last = 0.0

    def phase(self, name: str, **extra: Any) -> None:
        self.phase_t0 = time.perf_counter()
        self.state.update(phase=name, calls=0, minimum_tokens=0, **extra)
        self.write()

    def on_call(self, tree: PrefixTree) -> None:
        now = time.perf_counter()
        if now - self.last >= self.every_s:
            self.state.update(calls=tree.calls, minimum_tokens=tree.tokens)
            self.write()

    def write(self) -> None:
        self.last = time.perf_counter()
        if self.path is None:
            return
        self.state.update(elapsed_s=self.last - self.phase_t0, peak_rss_bytes=proc_status("VmHWM"))
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state))
        tmp.replace(self.path)


# ---------------------------------------------------------------------- engines
class Engine:
    """What a run needs of a loaded backend: its call, vocabulary, caches and counters."""

    #: the process that holds the engine (its memory is the run's)
    pid: int | str = "self"

    def __init__(self, llm: Any, kind: str, byte_vocab: list[bytes]) -> None:
        self.llm = llm
        self.kind = kind
        self.byte_vocab = byte_vocab

    def stats(self) -> dict[str, Any]:
        return self.llm.stats() if hasattr(self.llm, "stats") else {}

    def tokens_computed(self) -> int:
        return int((self.stats().get("engine") or {}).get("tokens_computed", 0))

    def clear_cache(self) -> None:
        self.llm.clear_cache()

    def rss(self) -> int:
        return proc_status("VmRSS", self.pid)

    def peak(self) -> int:
        return proc_status("VmHWM", self.pid)

    def reset_peak(self) -> bool:
        return reset_peak_rss(self.pid)

    def close(self) -> None:
        close = getattr(self.llm, "close", None)
        if close is not None:
            close()


class ServedEngine(Engine):
    """The engine behind ``genlm serve KIND`` (a server process started here with the
    options ``load()`` would get), reached by a ``remote`` client over shared memory:
    its counters are the server's backend's (``/v1/stats``), its memory the server
    process's, and clearing the caches clears the server's and the client's."""

    def __init__(self, kind: str, model: str, opts: dict[str, Any], threads: int) -> None:
        import genlm_core
        from genlm_core.serve.testing import ServerProcess

        self.server = ServerProcess(kind, model=model, opts=opts, env={"OMP_NUM_THREADS": str(threads)})
        self.server.start()
        assert self.server.proc is not None
        self.pid = self.server.proc.pid
        try:
            llm = genlm_core.load("remote", url=self.server.url, transport="shm")
        except BaseException:
            self.server.stop()
            raise
        super().__init__(llm, kind, list(llm.byte_vocab))

    def _server(self, path: str, body: bytes | None = None) -> dict[str, Any]:
        import urllib.request

        headers = {"Content-Type": "application/json"}
        req = urllib.request.Request(self.server.url + path, data=body, headers=headers)
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())

    def stats(self) -> dict[str, Any]:
        return self._server("/v1/stats").get("backend") or {}

    def clear_cache(self) -> None:
        self.llm.clear_cache()
        self._server("/v1/clear_cache", b"{}")

    def client_rss(self) -> int:
        return proc_status("VmRSS")

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.server.stop()


def load_engine(spec: dict[str, Any]) -> Engine:
    kind, opts = spec["kind"], dict(spec.get("options") or {})
    if spec.get("serve") and kind == "reference":
        raise ValueError("the reference (genlm-backend) has no genlm serve: run its shapes in process")
    if kind == "reference":
        import torch
        from bench_sis import check_anchor

        check_anchor()
        from genlm.backend.llm import AsyncTransformer

        hf_opts = {"device_map": spec["device"], "torch_dtype": getattr(torch, spec["dtype"]), **opts}
        llm = AsyncTransformer.from_name(spec["model"], hf_opts=hf_opts)
        return Engine(llm, kind, [bytes(t) for t in llm.byte_vocab])
    import genlm_core

    if kind == "hf":
        opts = {"dtype": spec["dtype"], "device": spec["device"], **opts}
    elif kind == "vllm":
        opts = {"dtype": "float32", **opts}
    elif kind == "llamacpp":
        opts = {"n_threads": spec["threads"], **opts}
    if spec.get("serve"):
        return ServedEngine(kind, spec["model"], opts, int(spec["threads"]))
    llm = genlm_core.load(kind, model=spec["model"], **opts)
    return Engine(llm, kind, list(llm.byte_vocab))


def kv_bytes_per_token(spec: dict[str, Any], engine: Engine) -> int | None:
    """Bytes of one token's KV in the engine (keys and values, every layer) from the
    model's config.json and the engine's KV dtype; None where either is unknown."""
    try:
        cfg = json.loads((Path(spec["model_folder"]) / "config.json").read_text())
    except (OSError, KeyError, ValueError):
        return None
    heads = cfg.get("num_attention_heads")
    head_dim = cfg.get("head_dim") or (cfg["hidden_size"] // heads if heads else None)
    kv_heads = cfg.get("num_key_value_heads") or heads
    layers = cfg.get("num_hidden_layers")
    if engine.kind == "llamacpp":
        dtype = (engine.stats().get("engine") or {}).get("kv_cache_type")
    elif engine.kind in ("hf", "reference"):
        dtype = spec["dtype"]
    else:  # vllm (float32 here), mlx (the folder's float32 weights)
        dtype = (spec.get("options") or {}).get("dtype", "float32")
    size = ITEMSIZE.get(str(dtype).lower().removeprefix("torch."))
    if not (head_dim and kv_heads and layers and size):
        return None
    return 2 * layers * kv_heads * head_dim * size


def counters(stats: dict[str, Any]) -> dict[str, float]:
    """The numeric values of ``stats()``'s batcher and engine sections, flat (the run's
    ``counters`` are their changes over the last timed run: meaningful for counters such
    as ``engine.tokens_computed``; gauges such as ``batcher.mean_batch_size`` are read
    in ``stats_end``)."""
    out: dict[str, float] = {}
    for section in STATS_SECTIONS:
        for k, v in (stats.get(section) or {}).items():
            if isinstance(v, int | float) and not isinstance(v, bool):
                out[f"{section}.{k}"] = v
    return out


# ---------------------------------------------------------------------- the run
class Loaded:
    """The engine and what its load cost, for each shape of the process."""

    def __init__(self, spec: dict[str, Any], progress: Progress) -> None:
        progress.phase("loading")
        import torch

        torch.set_num_threads(int(spec["threads"]))
        t0 = time.perf_counter()
        self.engine = load_engine(spec)
        self.load_s = time.perf_counter() - t0
        self.rss_after_load, self.load_peak = self.engine.rss(), self.engine.peak()
        self.progress = progress


def run(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Every run of ``spec`` on one engine, their figures (written to ``out`` after each)."""
    progress = Progress(spec.get("progress"))
    loaded = Loaded(spec, progress)
    outs: list[dict[str, Any]] = []
    try:
        for item in spec["runs"]:
            one = {**spec, **item}
            name = item["shape"].get("name", "")
            log(f"{spec['label']}: {name}")
            outs.append(run_many(one, loaded) if item["shape"].get("programs") else run_shape(one, loaded))
            if spec.get("out"):
                Path(spec["out"]).write_text(json.dumps({"runs": outs}))
    finally:
        loaded.engine.close()
    return outs


def _memory(loaded: Loaded, rss_before: int, peak_reset: bool) -> dict[str, Any]:
    """The shape's memory (its peak was reset at its start, where ``peak_reset``)."""
    engine = loaded.engine
    run_peak = engine.peak() if peak_reset else None
    memory: dict[str, Any] = {
        "rss_after_load_bytes": loaded.rss_after_load,
        "rss_before_bytes": rss_before,
        "load_peak_bytes": loaded.load_peak,
        "run_peak_bytes": run_peak,
        "peak_bytes": max(loaded.load_peak, run_peak or engine.peak()),
    }
    if isinstance(engine, ServedEngine):
        memory["client_rss_bytes"] = engine.client_rss()
    if cuda_in_use():
        import torch

        memory["gpu_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
        memory["gpu_max_reserved_bytes"] = torch.cuda.max_memory_reserved()
    return memory


def _start(loaded: Loaded) -> tuple[int, bool]:
    """A shape starts: the RSS now, the peak reset (and CUDA's)."""
    rss_before = loaded.engine.rss()
    peak_reset = loaded.engine.reset_peak()
    if cuda_in_use():
        import torch

        torch.cuda.reset_peak_memory_stats()
    return rss_before, peak_reset


def _program(spec: dict[str, Any], engine: Engine) -> tuple[Any, Any]:
    """The shape's program and the vocabulary it takes."""
    if spec["shape"]["program"] == "sis":
        return sis, [len(t) for t in engine.byte_vocab]
    return functools.partial(smc, resampling=spec.get("resampling", "systematic")), engine.byte_vocab


def _common(
    spec: dict[str, Any], loaded: Loaded, end: dict[str, Any], delta: dict[str, float]
) -> dict[str, Any]:
    """The figures every shape reports beside its own."""
    engine = loaded.engine
    from common import device_info

    # hf and the reference run where they are told; vLLM where its platform put it; llama.cpp
    # (no layers offloaded by default) and MLX (Linux: the CPU build) on the CPU; through
    # genlm serve the server's engine: where its options put it
    on_cuda = cuda_in_use() or (isinstance(engine, ServedEngine) and str(spec["device"]).startswith("cuda"))
    device = spec["device"] if spec["kind"] in ("hf", "reference") else "cuda" if on_cuda else "cpu"
    return {
        "engine_s": delta.get("batcher.model_time_s"),
        "counters": delta,
        "stats_end": {k: v for k, v in end.items() if k in (*STATS_SECTIONS, "prefix_cache")},
        "kv_bytes_per_token": kv_bytes_per_token(spec, engine),
        "load_s": loaded.load_s,
        "device": device_info(
            device, spec["dtype"] if spec["kind"] in ("hf", "reference") else None, spec["model"]
        ),
    }


def run_shape(spec: dict[str, Any], loaded: Loaded) -> dict[str, Any]:
    """One program of the shape: a warm-up, then the timed runs (``timed_runs``)."""
    engine, progress = loaded.engine, loaded.progress
    rss_before, peak_reset = _start(loaded)
    shape = spec["shape"]
    prompt_ids = [int(i) for i in spec["prompt_ids"]]
    program, vocab = _program(spec, engine)
    trees: list[PrefixTree] = []
    snap: dict[str, float] = {}
    phases = iter(["warm-up", *(f"run {i + 1}" for i in range(int(spec["repeats"])))])

    def reset() -> None:
        nonlocal snap
        engine.clear_cache()
        snap = counters(engine.stats())
        progress.phase(next(phases), load_s=loaded.load_s, shape=shape.get("name", ""))

    def make_next() -> Any:
        trees.append(PrefixTree(shared=prompt_ids))
        return trees[-1].wrap(engine.llm.next_token_logprobs, progress.on_call)

    args = argparse.Namespace(
        particles=shape["particles"], max_tokens=shape["tokens"], seed=spec["seed"], repeats=spec["repeats"]
    )
    res = asyncio.run(
        timed_runs(
            make_next,
            vocab,
            int(spec["eos_id"]),
            prompt_ids,
            args,
            reset,
            engine.tokens_computed,
            full_warmup=spec.get("warmup", "shape") == "shape",
            warmup=spec.get("warmup", "shape") != "none",
            program=program,
        )
    )
    end = engine.stats()
    delta = {k: v - snap.get(k, 0) for k, v in counters(end).items()}
    tree = trees[-1]  # the last timed run's (timed_runs reports its counters)
    out = {
        "status": "ok",
        "calls": res["calls"],
        "wall_s": res["wall_s"],
        "walls": res["walls"],
        "calls_per_s": res["calls_per_s"],
        "steps": res["program"]["steps"],
        "prompt_tokens": len(prompt_ids),
        "minimum_tokens": tree.tokens,
        "tokens_computed": res["tokens_computed_per_run"] if spec["kind"] != "reference" else None,
        "recorder_s": tree.own_s,
        "program_account": res["program"],
        "program_result": res["program_result"],
        "memory": _memory(loaded, rss_before, peak_reset),
        **_common(spec, loaded, end, delta),
    }
    if spec.get("contexts"):
        out["contexts"] = res["contexts"]
    return out


def run_many(spec: dict[str, Any], loaded: Loaded) -> dict[str, Any]:
    """K programs, each with its own prompt, one after another and together
    (``many_programs.many_runs``); the counters' change over the last together run."""
    engine, progress = loaded.engine, loaded.progress
    rss_before, peak_reset = _start(loaded)
    shape = spec["shape"]
    prompts = [[int(i) for i in p] for p in spec["prompt_ids_many"]]
    program, vocab = _program(spec, engine)
    snap: dict[str, float] = {}

    def reset() -> None:
        nonlocal snap
        engine.clear_cache()
        snap = counters(engine.stats())

    hooks = Hooks(
        call=engine.llm.next_token_logprobs,
        reset=reset,
        tokens=engine.tokens_computed,
        rss=engine.rss,
        reset_peak=engine.reset_peak,
        peak=engine.peak,
        phase=lambda name: progress.phase(name, load_s=loaded.load_s, shape=shape.get("name", "")),
        on_call=progress.on_call,
    )
    res = asyncio.run(
        many_runs(
            hooks,
            prompts,
            vocab,
            int(spec["eos_id"]),
            particles=shape["particles"],
            tokens=shape["tokens"],
            seed=int(spec["seed"]),
            repeats=int(spec["repeats"]),
            program=program,
            full_warmup=spec.get("warmup", "shape") == "shape",
            warmup=spec.get("warmup", "shape") != "none",
        )
    )
    end = engine.stats()
    delta = {k: v - snap.get(k, 0) for k, v in counters(end).items()}
    if spec["kind"] == "reference":  # genlm-backend counts no tokens
        res.update(tokens_computed=None, sequential_tokens_computed=None)
    return {
        "status": "ok",
        **{k: v for k, v in res.items() if k not in ("together", "sequential")},
        "steps": max(p["steps"] for p in res["together"]["programs"]),
        "prompt_tokens": sum(len(p) for p in prompts),
        "prompt_lengths": [len(p) for p in prompts],
        "many": {"together": res["together"], "sequential": res["sequential"]},
        "program_account": None,
        "memory": _memory(loaded, rss_before, peak_reset),
        **_common(spec, loaded, end, delta),
    }


def main(argv: list[str] | None = None) -> None:
    spec_path = Path((argv or sys.argv[1:])[0])
    spec = json.loads(spec_path.read_text())
    outs = run(spec)
    Path(spec["out"]).write_text(json.dumps({"runs": outs}))


if __name__ == "__main__":
    main()
