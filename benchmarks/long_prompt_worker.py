"""One engine, one shape, in a process of its own: what ``bench_long_prompt.py`` starts.

``python long_prompt_worker.py SPEC.json`` loads the engine the spec names (genlm-core's
``hf``, ``llamacpp``, ``vllm`` or ``mlx`` through ``genlm_core.load``, or ``reference``:
genlm-backend 0.3.1's ``AsyncTransformer``, in the anchor venv, which has no genlm-core),
runs the shape's program - a warm-up, then the timed runs from clean caches
(``sis_workload.timed_runs``) - through a :class:`~prefix_tree.PrefixTree` that counts
the fewest tokens the contexts need, and writes the figures to the spec's ``out``.

Memory: ``VmRSS`` after the load, the load's peak (``VmHWM``), then the peak is reset
(``/proc/self/clear_refs``) and read again after the runs: the process's peak and the
runs' own. On CUDA, ``torch.cuda.max_memory_allocated`` over the runs as well.

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

from prefix_tree import PrefixTree  # noqa: E402
from sis_workload import log, sis, timed_runs  # noqa: E402
from smc_workload import smc  # noqa: E402

#: where a genlm-core engine's numbers of the run come from: stats() sections
STATS_SECTIONS = ("batcher", "engine")
#: bytes of one KV entry per dtype name (the engines' own names)
ITEMSIZE = {"float32": 4, "f32": 4, "float16": 2, "f16": 2, "bfloat16": 2, "bf16": 2, "q8_0": 1}


# ---------------------------------------------------------------------- memory
def proc_status(field: str) -> int:
    """``field`` of /proc/self/status (``VmRSS``, ``VmHWM``) in bytes; 0 where unknown."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def reset_peak_rss() -> bool:
    """Reset ``VmHWM`` to the current RSS (Linux >= 4.0); False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
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

    def __init__(self, llm: Any, kind: str, byte_vocab: list[bytes]) -> None:
        self.llm = llm
        self.kind = kind
        self.byte_vocab = byte_vocab

    def stats(self) -> dict[str, Any]:
        return self.llm.stats() if hasattr(self.llm, "stats") else {}

    def tokens_computed(self) -> int:
        return int((self.stats().get("engine") or {}).get("tokens_computed", 0))

    def close(self) -> None:
        close = getattr(self.llm, "close", None)
        if close is not None:
            close()


def load_engine(spec: dict[str, Any]) -> Engine:
    kind, opts = spec["kind"], dict(spec.get("options") or {})
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
def run(spec: dict[str, Any]) -> dict[str, Any]:
    progress = Progress(spec.get("progress"))
    progress.phase("loading")
    import torch

    torch.set_num_threads(int(spec["threads"]))
    t0 = time.perf_counter()
    engine = load_engine(spec)
    load_s = time.perf_counter() - t0
    rss_after_load, load_peak = proc_status("VmRSS"), proc_status("VmHWM")
    peak_reset = reset_peak_rss()
    if cuda_in_use():
        import torch

        torch.cuda.reset_peak_memory_stats()
    shape = spec["shape"]
    prompt_ids = [int(i) for i in spec["prompt_ids"]]
    if shape["program"] == "sis":
        program, vocab = sis, [len(t) for t in engine.byte_vocab]
    else:
        program = functools.partial(smc, resampling=spec.get("resampling", "systematic"))
        vocab = engine.byte_vocab
    trees: list[PrefixTree] = []
    snap: dict[str, float] = {}
    phases = iter(["warm-up", *(f"run {i + 1}" for i in range(int(spec["repeats"])))])

    def reset() -> None:
        nonlocal snap
        engine.llm.clear_cache()
        snap = counters(engine.stats())
        progress.phase(next(phases), load_s=load_s)

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
            program=program,
        )
    )
    end = engine.stats()
    delta = {k: v - snap.get(k, 0) for k, v in counters(end).items()}
    tree = trees[-1]  # the last timed run's (timed_runs reports its counters)
    memory: dict[str, Any] = {
        "rss_after_load_bytes": rss_after_load,
        "load_peak_bytes": load_peak,
        "run_peak_bytes": proc_status("VmHWM") if peak_reset else None,
        "peak_bytes": max(load_peak, proc_status("VmHWM")),
    }
    if cuda_in_use():
        import torch

        memory["gpu_max_allocated_bytes"] = torch.cuda.max_memory_allocated()
        memory["gpu_max_reserved_bytes"] = torch.cuda.max_memory_reserved()
    kv_token = kv_bytes_per_token(spec, engine)
    from common import device_info

    # hf and the reference run where they are told; vLLM where its platform put it; llama.cpp
    # (no layers offloaded by default) and MLX (Linux: the CPU build) on the CPU
    device = spec["device"] if spec["kind"] in ("hf", "reference") else "cuda" if cuda_in_use() else "cpu"
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
        "engine_s": delta.get("batcher.model_time_s"),
        "counters": delta,
        "stats_end": {k: v for k, v in end.items() if k in (*STATS_SECTIONS, "prefix_cache")},
        "memory": memory,
        "kv_bytes_per_token": kv_token,
        "load_s": load_s,
        "device": device_info(
            device, spec["dtype"] if spec["kind"] in ("hf", "reference") else None, spec["model"]
        ),
    }
    if spec.get("contexts"):
        out["contexts"] = res["contexts"]
    engine.close()
    return out


def main(argv: list[str] | None = None) -> None:
    spec_path = Path((argv or sys.argv[1:])[0])
    spec = json.loads(spec_path.read_text())
    shape = spec["shape"]
    log(f"{spec['label']}: {shape['prompt']}x{shape['particles']}x{shape['tokens']}:{shape['program']}")
    out = run(spec)
    Path(spec["out"]).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
