"""Where the host's part of a backend step goes (``bench_hf_step --host-account``).

``graph_account`` splits a captured step into its graph's replay and "the rest"; this
splits the rest. :func:`account` runs a benchmark's step ``steps`` more times with timers
around the backend's stages (wrapped for the run, restored after; no sync added but one,
below) and returns milliseconds per step, each the median over the steps:

  host_step_ms            the whole step (``B`` concurrent calls, every caller's row)
  host_validate_ms        the calls' validation (``validate``), summed over the rows
  host_batch_ms           the batcher's batch function: everything below
  host_forward_ms         the engine's call (``forward``, or the core's KV reuse around
                          ``forward_rows``): the rows' placement, KV moves, the
                          model's step, the logits gathered
  host_model_step_ms      of which the decode step (genlm-hf's ``genlm_hf.step``): on a
                          GPU the graph's launch (its inputs' copy and the replay call),
                          on the CPU the computation
  host_normalise_ms       the rows normalised (``log_softmax``), copied for each caller
                          and checked
  host_device_wait_ms     on a GPU, of which waiting for the queued device work (the row
                          check reads one value on the host: the step's only sync);
                          0 on the CPU
  host_row_check_ms       of which the row check's host work (the wait excluded)
  host_row_copies_ms      of which each caller's copy (and the output cache's); on a GPU
                          it may wait for the device too: on the H200, at 64 rows the
                          copies took 1.5-1.7 ms and the wait after them 0.1-0.8, at 16
                          rows 0.4 and 1.4-1.8 (their sum the same), while the copy
                          itself, probed alone, took 0.24 ms
  host_new_segments       on a GPU, the device memory segments (``cudaMalloc`` calls)
                          torch's caching allocator made in a step (the median): the
                          output cache keeps a step's rows, so until it is full a step
                          takes new memory
  host_cache_ms           the rows put in the output cache
  host_outside_batch_ms   the step less the batch function: the event loop, the callers'
                          coroutines, validation, the output cache's lookups, the batcher
  host_before_batch_ms    of which before the (first) batch function began: the callers'
                          coroutines, validation, the output cache's lookups, the batcher
                          gathering them, on a GPU the hand-over to its worker thread
  host_after_batch_ms     and after the (last) one ended: the hand-back, the callers
                          woken with their rows
  host_per_row_us         ``host_outside_batch_ms`` per row, in microseconds
  host_ops                torch operators the batch function dispatches per step outside
                          the model's step (on a GPU each is a launch or an allocation);
                          ``host_ops_top``: the most frequent, with their counts
  host_copy_probe_us      the callers' copies of one step's rows (``B`` rows of the
                          vocabulary, float32, on the device) made three ways, the host's
                          microseconds until the call returns (the median of a few):
                          ``private_copies`` (the backend's), a ``clone`` each, and
                          ``torch._foreach_mul(rows, 1.0)`` (the allocations in C++, one
                          launch; each copy checked equal to its row and apart from it):
                          which one a step should use

The step's host time on a GPU is ``host_step_ms - host_device_wait_ms`` (the device
works while the host waits); on the CPU the model's step is the computation itself.
The timers cost about a microsecond a wrapped call. A step that moves the rows to a
longer column bucket (and on a GPU captures its graph) is one of the steps, and the
median leaves it out. A backend without a stage (no output cache, no decode step) leaves
its figure out.
"""

from __future__ import annotations

import collections
import statistics
import time
from collections.abc import Callable
from typing import Any

#: the most frequent operators listed by name in ``host_ops_top``
TOP_OPS = 8


class _Timers:
    def __init__(self) -> None:
        self.spent: dict[str, float] = collections.defaultdict(float)
        self.depth: dict[str, int] = collections.defaultdict(int)
        #: a stage's first entry and last exit of the step (perf_counter)
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}

    def clear(self) -> None:
        self.spent.clear()
        self.first.clear()
        self.last.clear()

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        spent, depth, first, last = self.spent, self.depth, self.first, self.last

        def timed(*args: Any, **kwargs: Any) -> Any:
            if depth[name]:  # a recursive call: counted once, at the outermost
                return fn(*args, **kwargs)
            depth[name] += 1
            t0 = time.perf_counter()
            first.setdefault(name, t0)
            try:
                return fn(*args, **kwargs)
            finally:
                t1 = last[name] = time.perf_counter()
                spent[name] += t1 - t0
                depth[name] -= 1

        return timed


class _Patches:
    """Attributes replaced for the run and put back (an instance's own, or its class's)."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def set(self, obj: Any, attr: str, value: Any) -> None:
        had = attr in vars(obj)
        old = vars(obj).get(attr)
        setattr(obj, attr, value)
        self._undo.append(lambda: setattr(obj, attr, old) if had else delattr(obj, attr))

    def restore(self) -> None:
        while self._undo:
            self._undo.pop()()


def _model_step(llm: Any) -> tuple[Any, str] | None:
    """The object and attribute of the engine's decode step (genlm-hf's ``StaticStep``: the
    bucket's input copy and its graph's replay, or the step computed where there is no
    graph), or None."""
    step = getattr(llm.engine, "step", None)
    if step is not None and hasattr(step, "run"):
        return step, "run"
    return None


def _segments(device: Any) -> int:
    """How many device memory segments torch's caching allocator has allocated on
    ``device`` so far (each a ``cudaMalloc``)."""
    import torch

    return int(torch.cuda.memory_stats(device).get("segment.all.allocated", 0))


def _count_ops(llm: Any, step: Callable[[], None], steps: int) -> tuple[float, list[tuple[str, int]]]:
    """Operators dispatched per step by the batch function outside the model's step (a
    dispatch mode, entered in the thread that runs the batch - on a GPU the batcher's
    worker thread, and a mode is per thread; slow, so over a few steps of their own)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    inside = [0]
    counts: collections.Counter[str] = collections.Counter()

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if not inside[0]:
                counts[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    patches = _Patches()
    batch_fn = llm.batcher.batch_fn

    def counted(*a: Any, **k: Any) -> Any:
        with Count():
            return batch_fn(*a, **k)

    patches.set(llm.batcher, "batch_fn", counted)
    found = _model_step(llm)
    if found is not None:
        obj, attr = found
        fn = getattr(obj, attr)

        def outside(*a: Any, **k: Any) -> Any:
            inside[0] += 1
            try:
                return fn(*a, **k)
            finally:
                inside[0] -= 1

        patches.set(obj, attr, outside)
    try:
        for _ in range(steps):
            step()
    finally:
        patches.restore()
    return sum(counts.values()) / steps, [(k, round(v / steps, 1)) for k, v in counts.most_common(TOP_OPS)]


def _copy_probe(device: Any, rows: int, vocab: int, runs: int = 15) -> dict[str, float]:
    """The host's microseconds for each way of copying ``rows`` rows (see the module doc)."""
    import torch

    from genlm_core.engine.memory import private_copies

    batch = torch.log_softmax(torch.randn(rows, vocab, device=device), dim=-1)
    ways: dict[str, Callable[[list[Any]], list[Any]]] = {
        "private_copies": private_copies,
        "clone_each": lambda rs: [r.clone() for r in rs],
        "foreach_mul": lambda rs: torch._foreach_mul(rs, 1.0),
    }
    times: dict[str, list[float]] = {w: [] for w in ways}
    cuda = batch.device.type == "cuda"
    for _ in range(runs):
        for way, fn in ways.items():
            src = list(batch.unbind(0))
            if cuda:
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            out = fn(src)
            times[way].append(time.perf_counter() - t0)
            if not all(torch.equal(a, b) and a.data_ptr() != b.data_ptr() for a, b in zip(out, src)):
                raise AssertionError(f"host account: {way} did not copy the rows bit for bit")
    return {w: round(1e6 * statistics.median(t), 1) for w, t in times.items()}


def account(llm: Any, step: Callable[[], None], rows: int, steps: int = 8) -> dict[str, Any]:
    """The host account of ``step`` (one backend step of ``rows`` rows; it must ask new
    contexts each call) on ``llm``, a genlm-core backend: see the module doc."""
    import torch

    from genlm_core.engine.backend import rows as rows_mod  # where Rows.normalised copies the rows

    cuda = torch.device(llm.device).type == "cuda"
    timers = _Timers()
    wrap = timers.wrap
    patches = _Patches()
    checks, normalise = llm.context_checks, llm.rows  # the backend's parts: validation, the rows
    patches.set(checks, "validate", wrap("validate", type(checks).validate.__get__(checks)))
    patches.set(llm.batcher, "batch_fn", wrap("batch", llm.batcher.batch_fn))
    # the engine's call: through the core's KV reuse for an engine that resumes from kept KV
    calls = llm.kv_calls if llm.kv_calls is not None else llm.engine
    patches.set(calls, "forward", wrap("forward", calls.forward))
    patches.set(normalise, "normalised", wrap("normalise", type(normalise).normalised.__get__(normalise)))
    row_errors = type(normalise).row_errors.__get__(normalise)
    wait = wrap("device_wait", lambda: torch.cuda.synchronize(llm.device))

    def checked(*a: Any, **k: Any) -> Any:
        if cuda:  # the check's own read would wait here: the wait, apart from its work
            wait()
        return row_errors(*a, **k)

    patches.set(normalise, "row_errors", wrap("row_check", checked))
    patches.set(rows_mod, "private_copies", wrap("row_copies", rows_mod.private_copies))
    cache = llm.output_cache
    for attr in ("adopt_many", "put_many"):
        if cache is not None and hasattr(cache, attr):
            patches.set(cache, attr, wrap("cache", getattr(cache, attr)))
    found = _model_step(llm)
    if found is not None:
        obj, attr = found
        patches.set(obj, attr, wrap("model_step", getattr(obj, attr)))
    per_step: dict[str, list[float]] = collections.defaultdict(list)
    try:
        for _ in range(steps):
            timers.clear()
            segments = _segments(llm.device) if cuda else 0
            t0 = time.perf_counter()
            step()
            if cuda:
                torch.cuda.synchronize(llm.device)
            t1 = time.perf_counter()
            per_step["step"].append(t1 - t0)
            if cuda:
                per_step["new_segments"].append(_segments(llm.device) - segments)
            for name, s in timers.spent.items():
                per_step[name].append(s)
            per_step["outside_batch"].append(t1 - t0 - timers.spent.get("batch", 0.0))
            if "batch" in timers.first:
                per_step["before_batch"].append(timers.first["batch"] - t0)
                per_step["after_batch"].append(t1 - timers.last["batch"])
    finally:
        patches.restore()
    out: dict[str, Any] = {}
    for name in (
        "step",
        "validate",
        "batch",
        "forward",
        "model_step",
        "normalise",
        "device_wait",
        "row_check",
        "row_copies",
        "cache",
        "outside_batch",
        "before_batch",
        "after_batch",
    ):
        if name == "device_wait" and not cuda:
            out["host_device_wait_ms"] = 0.0
        elif per_step.get(name):
            out[f"host_{name}_ms"] = round(1e3 * statistics.median(per_step[name]), 4)
    if "host_row_check_ms" in out and cuda:
        out["host_row_check_ms"] = round(out["host_row_check_ms"] - out.get("host_device_wait_ms", 0.0), 4)
    if per_step.get("new_segments"):
        out["host_new_segments"] = statistics.median(per_step["new_segments"])
    out["host_per_row_us"] = round(1e3 * out["host_outside_batch_ms"] / rows, 2)
    out["host_ops"], out["host_ops_top"] = _count_ops(llm, step, min(steps, 3))
    out["host_copy_probe_us"] = _copy_probe(llm.device, rows, llm.vocab_size)
    return out
