"""genlm-vllm transport benchmark: what rows from worker processes cost.

Per engine step (one ``batch_next_token_logprobs_sync`` call: a batch of B distinct
contexts of 16-48 tokens, prefix cache reset, output cache off, one prefill step), in
each process layout that runs, against the in-process engine:

* layouts: ``inproc`` (engine core and its worker here: the fast path, rows never leave
  the worker's tensors), ``mpcore`` (engine core and its one worker in another process,
  ``VLLM_ENABLE_V1_MULTIPROCESSING=1``), ``pp2`` (two pipeline stages over the ``mp``
  executor, the core here), ``pp2-mpcore``, ``pp2-bytes`` (``pp2`` with the
  shared-memory buffer disabled: float32 bytes in the RPC reply, what a worker on
  another node sends), and the tensor-parallel ones ``tp2``, ``tp2-mpcore``, ``tp3``
  (SmolLM2-135M has 9 attention heads: vLLM refuses TP=2, recorded with its message;
  TP=3 runs but on fewer than 3 cores its ranks share cores, which measures the
  oversubscription, not the transport: not in the default set, ``--layouts tp3`` on a
  machine with 3 or more cores);
* models: SmolLM2-135M-Instruct float32 (49,152-token head) and the same body with a
  synthetic 151,936-token head (Qwen's size; the tokenizer stays SmolLM2's, so rows of
  151,936 floats travel and are cut to 49,152 afterwards), built once into the model
  cache;
* batches 1, 8 and 32;
* the same cores and model threads everywhere (``--cores``, default all of this
  process's): a one-rank layout binds its OpenMP threads to all of them, a two-rank
  layout gives each rank half (``VLLM_CPU_OMP_THREADS_BIND``).

Each (model, layout) runs in a fresh interpreter. Reported per step: ``step_ms`` (the
whole call), ``fetch_ms`` (the backend's row fetch inside it: the RPC to the workers,
the copy into shared memory or bytes, stacking; the transport), ``bytes`` moved
between processes (``B x row width x 4``; 0 in process), ``x_inproc`` (``step_ms`` over
the in-process one of the same model and batch), ``fetch_share`` (``fetch_ms`` over
``step_ms``). Target: multi-process capture <= 1.3x the in-process time per
step at batch 32 with the same threads.

Reading it: ``mpcore`` is the like-for-like layout (the same single worker with the same
threads, only the process boundary and the transport differ). ``pp2`` runs its two
stages one after the other for one batch (nothing to overlap with), each
with half the threads, so its ``x_inproc`` includes ~2x of model time that is no
transport cost; ``fetch_ms`` is the transport in every layout. On a machine where
other jobs run, pinned OpenMP threads stall (a thread barrier waits for a descheduled
peer) and step times vary by 2-5x between calls: run it on a quiet machine.

A second part times the transport alone (no engine): B random rows of 49,152 and
151,936 floats through the shared-memory buffer (worker write + backend read) against
the bytes path (``tobytes``, pickled like an RPC reply, ``frombuffer``).

Usage::

    python benchmarks/bench_vllm_transport.py                 # the full run (~15-25 min on 2 cores)
    python benchmarks/bench_vllm_transport.py --quick         # inproc/pp2/mpcore, batches 1 and 32, 1 repeat
    python benchmarks/bench_vllm_transport.py --layouts inproc pp2 --vocabs 49152 --batches 32
    python benchmarks/bench_vllm_transport.py --transport-only

Writes ``benchmarks/out/vllm_transport.json`` / ``.md``. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import OUT_DIR, markdown_table, write_results  # noqa: E402

MP = "VLLM_ENABLE_V1_MULTIPROCESSING"
_TP_MP = {"distributed_executor_backend": "mp"}
LAYOUTS: dict[str, dict[str, Any]] = {
    "inproc": {"env": {MP: "0"}, "opts": {}},
    "mpcore": {"env": {MP: "1"}, "opts": {}},
    "pp2": {"env": {MP: "0"}, "opts": {"pipeline_parallel_size": 2, **_TP_MP}},
    "pp2-mpcore": {"env": {MP: "1"}, "opts": {"pipeline_parallel_size": 2, **_TP_MP}},
    "pp2-bytes": {"env": {MP: "0"}, "opts": {"pipeline_parallel_size": 2, **_TP_MP}, "bytes": True},
    "tp2": {"env": {MP: "0"}, "opts": {"tensor_parallel_size": 2, **_TP_MP}},
    "tp2-mpcore": {"env": {MP: "1"}, "opts": {"tensor_parallel_size": 2, **_TP_MP}},
    "tp3": {"env": {MP: "0"}, "opts": {"tensor_parallel_size": 3, **_TP_MP}},
}
DEFAULT_LAYOUTS = ["inproc", "mpcore", "pp2", "pp2-mpcore", "pp2-bytes", "tp2", "tp2-mpcore"]
QUICK_LAYOUTS = ["inproc", "mpcore", "pp2"]
VOCABS = [49152, 151936]


# ---------------------------------------------------------------- models


def model_for(vocab: int) -> str:
    """SmolLM2-135M-Instruct (49,152) or that model with a synthetic ``vocab``-row head."""
    import model_paths

    base = Path(model_paths.smollm2())
    if vocab == 49152:
        return str(base)
    return str(_synthetic_head(base, vocab))


def _synthetic_head(base: Path, vocab: int) -> Path:
    """``base`` with its (tied) embedding grown to ``vocab`` rows (new rows random,
    seeded), saved once under the model cache; the tokenizer files are ``base``'s."""
    from genlm_core import models

    out = models.models_dir() / f"bench-{base.name}-head{vocab}"
    if (out / "config.json").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM

    print(f"[bench] building {out.name} (a synthetic {vocab}-token head on {base.name})", flush=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model.resize_token_embeddings(vocab, mean_resizing=False)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for f in base.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            shutil.copy(f, tmp / f.name)
    # vLLM reads rope_theta either way; keep the top-level key the base folder has
    cfg = json.loads((tmp / "config.json").read_text())
    base_cfg = json.loads((base / "config.json").read_text())
    if "rope_theta" in base_cfg:
        cfg["rope_theta"] = base_cfg["rope_theta"]
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    tmp.rename(out)
    return out


# ---------------------------------------------------------------- one layout, in a child


def _bind_cores(cores: list[int], world: int) -> None:
    """This child and its workers use ``cores``; one-rank layouts bind their threads
    to all of them (multi-rank layouts: the backend splits them between the ranks)."""
    os.sched_setaffinity(0, cores)
    if world == 1:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))
    else:
        os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)


def _engine_child(
    layout: str, vocab: int, batches: list[int], repeat: int, cores: list[int]
) -> dict[str, Any]:
    import genlm_core

    spec = LAYOUTS[layout]
    world = int(spec["opts"].get("tensor_parallel_size", 1)) * int(
        spec["opts"].get("pipeline_parallel_size", 1)
    )
    _bind_cores(cores, world)
    t0 = time.perf_counter()
    try:
        llm = genlm_core.load(
            "vllm",
            model=model_for(vocab),
            dtype="float32",
            enforce_eager=True,
            max_model_len=256,
            max_num_batched_tokens=2048,  # a batch of 32 x 48 tokens is one prefill step
            max_num_seqs=max(batches),
            cache_size=0,
            batch_size=max(batches),
            engine_opts=dict(spec["opts"]),
        )
    except Exception as exc:  # noqa: BLE001 - a layout vLLM refuses: its message is the result
        message = " ".join(f"{type(exc).__name__}: {exc}".split())  # pydantic's is several lines
        return {"layout": layout, "vocab": vocab, "refused": message[:400]}
    start_s = time.perf_counter() - t0
    if spec.get("bytes"):
        llm.engine._buffer = None  # what a worker on another node does: bytes in the RPC reply
    fetch_s: list[float] = []
    real_fetch = llm.engine.fetch

    def timed_fetch(tags: list[str]) -> Any:
        t = time.perf_counter()
        try:
            return real_fetch(tags)
        finally:
            fetch_s.append(time.perf_counter() - t)

    llm.engine.fetch = timed_fetch
    rng = random.Random(0)
    V = len(llm.byte_vocab)
    info = llm.info()
    rows = []
    for b in batches:
        steps, fetches = [], []
        for _ in range(repeat + 1):  # the first is a warm-up
            ctxs = [[rng.randrange(100, V) for _ in range(rng.randint(16, 48))] for _ in range(b)]
            llm.clear_cache()
            fetch_s.clear()
            t = time.perf_counter()
            llm.batch_next_token_logprobs_sync(ctxs)
            steps.append(time.perf_counter() - t)
            fetches.append(sum(fetch_s))
        rows.append(
            {
                "vocab": vocab,
                "layout": layout,
                "batch": b,
                "step_ms": 1000 * statistics.median(steps[1:]),
                "fetch_ms": 1000 * statistics.median(fetches[1:]),
                "bytes": 0 if llm.engine.in_process else b * llm.engine.captured_width * 4,
            }
        )
    out = {
        "layout": layout,
        "vocab": vocab,
        "rows": rows,
        "start_s": start_s,
        "row_width": llm.engine.captured_width,
        "cores": cores,
        "world_size": info.get("world_size"),
        "engine_core": info.get("engine_core"),
        "transport_counts": dict(llm.engine.transport_counts),
    }
    llm.close()
    return out


def engine_part(
    layouts: list[str], vocabs: list[int], batches: list[int], repeat: int, cores: list[int]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows, refused/failed layouts)."""
    rows: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import bench_vllm_transport as b\n"
        "if __name__ == '__main__':\n"
        "    print('RESULT', json.dumps(b._engine_child(sys.argv[2], int(sys.argv[3]), "
        "json.loads(sys.argv[4]), int(sys.argv[5]), json.loads(sys.argv[6]))))"
    )
    for vocab in vocabs:
        model_for(vocab)  # build the synthetic head once, outside the timed children
        for layout in layouts:
            print(f"[bench] vocab {vocab}, layout {layout}", flush=True)
            env = {**os.environ, **LAYOUTS[layout]["env"], "TOKENIZERS_PARALLELISM": "false"}
            args = [str(Path(__file__).parent), layout, str(vocab), json.dumps(batches), str(repeat)]
            proc = subprocess.run(
                [sys.executable, "-c", code, *args, json.dumps(cores)],
                env=env,
                capture_output=True,
                text=True,
            )
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                notes.append({"vocab": vocab, "layout": layout, "error": proc.stderr[-800:]})
                continue
            result = json.loads(line[len("RESULT ") :])
            if "refused" in result:
                notes.append(result)
                continue
            rows.extend(result.pop("rows"))
            notes.append(result)
    base = {(r["vocab"], r["batch"]): r["step_ms"] for r in rows if r["layout"] == "inproc"}
    for r in rows:
        ref = base.get((r["vocab"], r["batch"]))
        r["x_inproc"] = r["step_ms"] / ref if ref else None
        r["fetch_share"] = r["fetch_ms"] / r["step_ms"] if r["step_ms"] else None
    return rows, notes


# ---------------------------------------------------------------- transport alone


def transport_part(batches: list[int], vocabs: list[int], repeat: int) -> list[dict[str, Any]]:
    import torch

    from genlm_core.engine.row_transport import RowBuffer, write_rows

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
    ap.add_argument(
        "--layouts", nargs="+", choices=list(LAYOUTS), help=f"default: {' '.join(DEFAULT_LAYOUTS)}"
    )
    ap.add_argument("--vocabs", nargs="+", type=int, choices=VOCABS, default=VOCABS)
    ap.add_argument("--batches", nargs="+", type=int, default=None, help="default: 1 8 32")
    ap.add_argument("--repeat", type=int, default=None, help="timed calls per batch (default 5)")
    ap.add_argument(
        "--cores", type=int, default=None, help="cores (and model threads) per layout (default: all)"
    )
    ap.add_argument("--quick", action="store_true", help="inproc/mpcore/pp2, batches 1 and 32, 1 repeat")
    ap.add_argument("--transport-only", action="store_true")
    args = ap.parse_args()
    layouts = args.layouts or (QUICK_LAYOUTS if args.quick else DEFAULT_LAYOUTS)
    batches = args.batches or ([1, 32] if args.quick else [1, 8, 32])
    repeat = args.repeat or (1 if args.quick else 5)
    avail = sorted(os.sched_getaffinity(0))
    cores = avail[: args.cores] if args.cores else avail
    transport = transport_part(batches, VOCABS, max(repeat, 3))
    rows: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []
    if not args.transport_only:
        rows, notes = engine_part(layouts, args.vocabs, batches, repeat, cores)
    cols = ["vocab", "layout", "batch", "step_ms", "fetch_ms", "fetch_share", "x_inproc", "bytes"]
    write_results(
        "vllm_transport",
        rows,
        extra={"layouts": notes, "transport_only": transport, "cores": cores, "repeat": repeat},
        cols=cols if rows else None,
    )
    md = OUT_DIR / "vllm_transport.md"
    lines = [md.read_text(), "\n### transport alone (no engine)\n\n", markdown_table(transport), "\n"]
    for n in notes:
        if "refused" in n or "error" in n:
            lines.append(f"\n- {n['layout']} (vocab {n['vocab']}): {n.get('refused') or n.get('error')}\n")
        else:
            lines.append(
                f"\n- {n['layout']} (vocab {n['vocab']}): engine start {n['start_s']:.1f} s, "
                f"row width {n['row_width']}, world size {n['world_size']}, core {n['engine_core']}, "
                f"cores {n['cores']}, transport {n['transport_counts']}\n"
            )
    md.write_text("".join(lines))
    print("".join(lines[1:]))


if __name__ == "__main__":
    main()
