"""Where a captured decode step's time goes (``bench_hf_step --graph-account``).

The hf engine's decode step of ``B`` rows on CUDA is one replayed graph plus the host's
work around it (the batcher, the rows' pages and inputs, normalising and handing out the
rows). :func:`account` takes the engine's largest decode-step bucket after a benchmark's
steps and measures its step alone:

  graph_replay_ms     one replay of its captured graph (CUDA events, the median of a few):
                      the device's part of a step; ``step_ms`` less this is the host's
  step_kernels        kernels one run of the step launches, and ``step_kernel_ms`` their
                      summed device time (``torch.profiler`` over the uncaptured step):
                      a graph replays these kernels back to back, so many small kernels
                      cost their count times a few microseconds each, whatever their work;
                      ``step_kernels_top`` (in the JSON): the most frequent kernels by name,
                      each with its count and device ms a step
  compiled_*          with ``compile_probe``: the same step under ``torch.compile``
                      (inductor fuses the norms, the rotary embedding and the MLP's
                      element-wise ops), captured as a graph like the engine's: its compile
                      seconds, its kernels and replay, and its logits against the engine's
                      (the same arithmetic in another order: compared with the derived bound)

On the CPU there is no graph: the step runs as it is (``eager_step_ms``) and, with the
probe, compiled (``compiled_step_ms``); that is a check of this module, not a figure.
Replaying a step writes the same KV column again (the step is idempotent), so the engine
is left as it was; call it after the timed steps and before closing the engine.
"""

from __future__ import annotations

import statistics
import sys
import time
from typing import Any

#: the kernels listed by name in ``step_kernels_top`` (the most frequent), and the
#: characters of a name kept (a templated kernel's full name runs to hundreds)
TOP_KERNELS = 16
NAME_CHARS = 120


def _block_slot(llm: Any) -> Any:
    """The engine's decode-step bucket of the most rows (None: no step ran)."""
    step = getattr(llm.engine, "step", None)
    buckets = list(getattr(step, "buckets", {}).values())
    if not buckets:
        return None
    return max(buckets, key=lambda b: b.key[0])


def _kernels(fn: Any, runs: int) -> tuple[float, float, list[list[Any]]]:
    """Kernels per run of ``fn``, their summed device ms per run (torch.profiler), and the
    most frequent by name (:func:`kernels_by_name`)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if str(getattr(e, "device_type", "")).endswith("CUDA")]
    us = sum(_device_us(e) for e in kernels)
    return len(kernels) / runs, us / 1e3 / runs, kernels_by_name(kernels, runs)


def kernels_by_name(events: list[Any], runs: int, time_of: Any = None) -> list[list[Any]]:
    """The :data:`TOP_KERNELS` most frequent of profiler ``events`` by name (cut to
    :data:`NAME_CHARS`): ``[name, count per run, ms per run]``, the most frequent first
    (``time_of(event)``: its microseconds, by default its device time)."""
    time_of = time_of or _device_us
    by_name: dict[str, list[float]] = {}
    for e in events:
        seen = by_name.setdefault(str(e.name)[:NAME_CHARS], [0, 0.0])
        seen[0] += 1
        seen[1] += time_of(e)
    top = sorted(by_name.items(), key=lambda kv: (-kv[1][0], kv[0]))[:TOP_KERNELS]
    return [[name, n / runs, round(t / 1e3 / runs, 4)] for name, (n, t) in top]


def _device_us(event: Any) -> float:
    return float(getattr(event, "device_time", getattr(event, "cuda_time", 0.0)))


def _replay_ms(graph: Any, runs: int = 20) -> float:
    import torch

    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _capture(fn: Any, device: Any) -> tuple[Any, Any]:
    import torch

    side = torch.cuda.Stream(device=device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def _wall_ms(fn: Any, runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def account(llm: Any, compile_probe: bool = False) -> dict[str, Any]:
    """The figures above for ``llm``'s largest decode-step bucket (empty without one)."""
    import torch

    slot = _block_slot(llm)
    if slot is None:
        return {"graph_account": "no decode step ran"}
    B, U, L = slot.key
    out: dict[str, Any] = {"account_bucket": f"{B}x{U}+{L}"}
    cuda = slot.inputs.device.type == "cuda"
    with torch.inference_mode():
        ref = slot.step().float().clone()
        if cuda:
            if slot.graph is not None:
                out["graph_replay_ms"] = _replay_ms(slot.graph)
            else:
                out["graph_account"] = "the bucket's step was not captured"
            out["step_kernels"], out["step_kernel_ms"], top = _kernels(slot.step, 3)
            out["step_kernels_top"] = top
        else:
            out["eager_step_ms"] = _wall_ms(slot.step)
        print(f"[graph_account] {out}", file=sys.stderr, flush=True)  # before a probe that may run long
        if not compile_probe:
            return out
        compiled = torch.compile(slot.step, dynamic=False)
        t0 = time.perf_counter()
        try:
            if cuda:
                graph, logits = _capture(compiled, slot.inputs.device)
                out["compiled_graph_replay_ms"] = _replay_ms(graph)
                out["compiled_kernels"], out["compiled_kernel_ms"], _ = _kernels(graph.replay, 3)
            else:
                compiled()
                out["compiled_step_ms"] = _wall_ms(compiled)
                logits = compiled()
        except Exception as exc:  # noqa: BLE001 - a probe: its failure is its result
            out["compiled_error"] = repr(exc)[:300]
            return out
        out["compile_s"] = time.perf_counter() - t0
        out["compiled_max_abs_diff"] = float((logits.float() - ref).abs().max())
    return out
