"""A catalogue of defects, each applied to a real engine, that every gate comparing rows
must catch: the proof that a check can fail, in every dtype.

A check that compares a backend's rows with an independent computation of them passes on
a correct backend; that is half of what it must do. The other half is to fail on a wrong
one, and a bound that is too loose (bfloat16's, before issue 63: a 1.03 logit scale
passed every check) fails on nothing. So the kit ships defects of the kind an engine's
cached, batched, static or fused path may hold, each a small wrapper at the
:class:`~genlm_core.engine.contract.Engine` boundary, and runs every gate with each one
applied (:func:`catch`): each gate must fail.

A defect wraps the engine's ``forward`` and ``decode_step`` (every path that serves
callers and bursts) and leaves ``forward_uncached`` right (the reference the gates compare
with). An internal defect is written as its effect on the rows (the contexts shown are
the engine's, ``ctx``; a *resumed* context extends a context the engine computed since
its caches were last cleared, as a prefix cache or a kept row would resume it):

============================  ===================================================================
:class:`Scale` (1.10, 1.03)   every row's logits times the factor (a wrong temperature, norm weight
                              or soft-cap): log-probabilities ``log_softmax(s * logits)``
:class:`FirstColumnMasked`    contexts of 40+ tokens: the row with the first key hidden from every
                              query; for a RoPE model (every model the catalogue runs) that is the
                              row of ``ctx[1:]`` exactly, attention scores depending on relative
                              positions only
:class:`FirstTokenDropped`    resumed contexts of 40+ tokens: the row of ``ctx[1:]`` (a prefix cache
                              handing back KV that lost its first column)
:class:`PositionShifted`      resumed contexts: the new tokens one position further from the cached
                              prefix, emulated as the row of ``prefix + prefix[-1:] + new`` (under
                              RoPE the new tokens then sit at the defect's distances from the
                              cached keys; the repeated key is the emulation's own)
:class:`NeighbourRow`         a batch of two rows or more: each row gets the next one's
:class:`WrongAdapter`         the call computed under another LoRA adapter than the active one (the
                              base model for an adapter, the first loaded one for the base model)
:class:`StaleRow`             resumed contexts: the row of the context they resume (the step
                              before's)
============================  ===================================================================

The gates (:data:`GATES`) are the checks that compare rows with the uncached model: the
kit's ``test_batch_equals_single``, ``test_async_equals_sync``, ``test_random_programs``
and ``test_lora``, :func:`~genlm_core.testing.burst.check_parity` (the kit's
``test_burst_matches_steps``), :func:`~genlm_core.testing.burst.check_decode_rows` and
:func:`~genlm_core.testing.burst.check_decode_batches` (the kit's ``test_decode_batches``).
:func:`gate_settings` sizes their inputs so that each defect has rows to show on: contexts
of 36 to 56 tokens, a 40-token burst prompt, and as many rows as the logit-scale statistic
needs to resolve a 1.03 scale at 2.5 times its bound in the backend's dtype
(:func:`~genlm_core.testing.tolerance.rows_to_resolve`: 102 for the tiny models in bfloat16).

A plugin runs the catalogue on its engine::

    from genlm_core.testing.defects import CATALOGUE, catch, gate_settings, gates_for

    @pytest.mark.parametrize("defect", CATALOGUE, ids=str)
    def test_every_gate_fails_on(backend, defect):
        settings = gate_settings(backend)
        for gate in gates_for(backend, defect):
            catch(backend, defect, gate, settings)   # raises when the gate passed
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CATALOGUE",
    "CAUGHT",
    "GATES",
    "Caught",
    "Defect",
    "FirstColumnMasked",
    "FirstTokenDropped",
    "Gate",
    "GateSettings",
    "Injection",
    "Measured",
    "NeighbourRow",
    "PositionShifted",
    "Scale",
    "StaleRow",
    "WrongAdapter",
    "active_adapter",
    "catch",
    "discrimination",
    "gate_settings",
    "gates_for",
    "inject",
    "measure",
]

Context = tuple[int, ...]
#: contexts at least this long hold the "40+ tokens" defects
LONG = 40


# ---------------------------------------------------------------------------- defects
class Defect:
    """A defect: :meth:`rows` turns an engine call's rows into the defective ones, and
    :meth:`call` may change how the engine is called (:class:`WrongAdapter`)."""

    #: its name in the catalogue
    name: str = "defect"
    #: the shortest context it changes (0: any)
    min_len: int = 0
    #: whether it needs a LoRA adapter active (and an engine with the capability "lora")
    needs_adapter: bool = False

    def rows(self, inj: "Injection", contexts: list[Context], rows: list[Any]) -> list[Any]:
        """The rows the defective engine returns for ``contexts`` (``rows``: the engine's
        own, in its output kind: logits or logprobs)."""
        return rows

    def call(self, inj: "Injection", run: Callable[[], Any]) -> Any:
        """Run the engine's call (``run``): as it is, unless the defect changes it."""
        return run()

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Scale(Defect):
    """Every row's logits times ``factor``."""

    factor: float = 1.10

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"logits x{self.factor:g}"

    def rows(self, inj: "Injection", contexts: list[Context], rows: list[Any]) -> list[Any]:
        import torch

        inj.altered += len(rows)
        if inj.engine_returns == "logprobs":
            return [torch.log_softmax(r.float() * self.factor, -1).to(r.dtype) for r in rows]
        return [r * self.factor for r in rows]


class _Replacing(Defect):
    """A defect replacing some rows by the uncached rows of other contexts."""

    def replacement(self, inj: "Injection", ctx: Context) -> Context | None:
        """The context whose row replaces ``ctx``'s (None: ``ctx``'s row stays)."""
        raise NotImplementedError

    def rows(self, inj: "Injection", contexts: list[Context], rows: list[Any]) -> list[Any]:
        swaps = {i: other for i, c in enumerate(contexts) if (other := self.replacement(inj, c)) is not None}
        if not swaps:
            return rows
        refs = inj.reference(list(swaps.values()))
        out = list(rows)
        for (i, _), ref in zip(swaps.items(), refs):
            out[i] = ref.to(device=rows[i].device, dtype=rows[i].dtype)
        inj.altered += len(swaps)
        return out


class FirstColumnMasked(_Replacing):
    """Contexts of ``min_len``+ tokens: the first key hidden from every query."""

    name = "first KV column masked (40+ tokens)"
    min_len = LONG

    def replacement(self, inj: "Injection", ctx: Context) -> Context | None:
        return ctx[1:] if len(ctx) >= self.min_len else None


class FirstTokenDropped(_Replacing):
    """Resumed contexts of ``min_len``+ tokens: their first token lost."""

    name = "first token dropped (40+ tokens)"
    min_len = LONG

    def replacement(self, inj: "Injection", ctx: Context) -> Context | None:
        if len(ctx) < self.min_len or inj.resumed_prefix(ctx) is None:
            return None
        return ctx[1:]


class PositionShifted(_Replacing):
    """Resumed contexts: the new tokens one position further from the cached prefix."""

    name = "position +1 on a resumed row"

    def replacement(self, inj: "Injection", ctx: Context) -> Context | None:
        prefix = inj.resumed_prefix(ctx)
        if prefix is None:
            return None
        return prefix + prefix[-1:] + ctx[len(prefix) :]


class StaleRow(_Replacing):
    """Resumed contexts: the row of the context they resume."""

    name = "the row of the step before"

    def replacement(self, inj: "Injection", ctx: Context) -> Context | None:
        return inj.resumed_prefix(ctx)


class NeighbourRow(Defect):
    """A batch of two rows or more: each row gets the next one's."""

    name = "a neighbouring row of the batch"

    def rows(self, inj: "Injection", contexts: list[Context], rows: list[Any]) -> list[Any]:
        if len(rows) < 2:
            return rows
        inj.altered += len(rows)
        return rows[1:] + rows[:1]


class WrongAdapter(Defect):
    """The call computed under another LoRA adapter than the active one."""

    name = "a wrong LoRA adapter"
    needs_adapter = True

    def call(self, inj: "Injection", run: Callable[[], Any]) -> Any:
        active = inj.backend.active_lora
        loaded = list(inj.backend.loras)
        other = None if active is not None else (loaded[0] if loaded else None)
        if active is None and other is None:
            raise RuntimeError("the wrong-adapter defect needs a LoRA adapter loaded on the backend")
        inj.backend.engine.use_adapter(other)
        try:
            out = run()
        finally:
            inj.backend.engine.use_adapter(active)
        inj.altered += len(out)
        return out


#: the catalogue (issue 63): every gate must fail on each, in every dtype
CATALOGUE: tuple[Defect, ...] = (
    Scale(1.10),
    Scale(1.03),
    FirstColumnMasked(),
    FirstTokenDropped(),
    PositionShifted(),
    NeighbourRow(),
    WrongAdapter(),
    StaleRow(),
)


# ---------------------------------------------------------------------------- injection
class Injection:
    """A defect applied to ``backend``'s engine (see :func:`inject`): the engine's
    ``forward`` and ``decode_step`` return the defect's rows, ``forward_uncached`` stays
    right. ``altered`` counts the rows it changed."""

    def __init__(self, backend: Any, defect: Defect) -> None:
        self.backend, self.defect = backend, defect
        self.engine = backend.engine
        self.engine_returns = getattr(self.engine, "returns", "logits")
        self.altered = 0
        self.seen: set[Context] = set()  # contexts the engine computed since its caches were cleared
        self._saved: dict[str, Any] = {}

    # -------------------------------------------------------------- what the defects read
    def resumed_prefix(self, ctx: Context) -> Context | None:
        """The longest context computed before (since the caches were cleared) that ``ctx``
        extends, or None: what a prefix cache or a kept row resumes ``ctx`` from."""
        for k in range(len(ctx) - 1, 0, -1):
            if ctx[:k] in self.seen:
                return ctx[:k]
        return None

    def reference(self, contexts: list[Context]) -> list[Any]:
        """The engine's own uncached rows of ``contexts``, its counters left as they were
        (a gate counting the tokens an engine ran must see the engine's, not the defect's)."""
        kv = getattr(self.engine, "kv", None)
        muted = kv is not None and hasattr(kv, "count")
        if muted:
            kv.count = lambda *a, **k: None  # type: ignore[method-assign]
        try:
            out = self._saved["forward_uncached"](list(contexts))
        finally:
            if muted:
                del kv.count
        return _as_rows(out)

    # -------------------------------------------------------------- the wrappers
    def _defective(self, contexts: list[Context], run: Callable[[], Any]) -> Any:
        out = self.defect.call(self, run)
        rows = self.defect.rows(self, contexts, _as_rows(out))
        self.seen.update(contexts)
        return _like(out, rows)

    def __enter__(self) -> "Injection":
        engine = self.engine
        for name in ("forward", "forward_uncached", "decode_step", "clear_cache"):
            self._saved[name] = getattr(engine, name)
        forward = self._saved["forward"]
        engine.forward = lambda contexts: self._defective(list(contexts), lambda: forward(contexts))
        if "decode" in getattr(engine, "supports", ()):
            step = self._saved["decode_step"]
            engine.decode_step = lambda rows, released: self._defective(
                list(rows.values()), lambda: step(rows, released)
            )
        from genlm_core.engine.contract import Engine

        if getattr(type(engine), "forward_uncached", None) is Engine.forward_uncached:
            # the default reads self.forward: the reference must not read the defect
            engine.forward_uncached = self._saved["forward_uncached"] = forward
        clear = self._saved["clear_cache"]

        def clear_cache() -> None:
            self.seen.clear()
            clear()

        engine.clear_cache = clear_cache
        self.backend.clear_cache()  # nothing computed before the defect is served during it
        return self

    def __exit__(self, *exc: Any) -> None:
        for name in ("forward", "forward_uncached", "decode_step", "clear_cache"):
            self.engine.__dict__.pop(name, None)
        self.backend.clear_cache()  # no defective row or state outlives the defect


def inject(backend: Any, defect: Defect) -> Injection:
    """``with inject(backend, defect) as inj:`` the backend's engine holds ``defect``
    (its caches cleared on entry and on exit)."""
    return Injection(backend, defect)


def _as_rows(out: Any) -> list[Any]:
    import torch

    if isinstance(out, torch.Tensor):
        return list(out.unbind(0)) if out.ndim > 1 else [out]
    return [torch.as_tensor(r) for r in out]


def _like(out: Any, rows: list[Any]) -> Any:
    """``rows`` in the kind of the engine's ``out``: one batch, or a list of rows."""
    import torch

    if isinstance(out, torch.Tensor):
        return torch.stack(rows) if out.ndim > 1 else rows[0]
    return rows


# ---------------------------------------------------------------------------- gates
@dataclass(frozen=True)
class GateSettings:
    """What the gates are run with: the kit's contexts (count and lengths), its programs'
    first contexts, the bursts' prompt and the comparisons' ``atol`` (None: derived)."""

    n_contexts: int
    min_len: int
    max_len: int
    prompt: tuple[int, ...]
    atol: float | None = None
    program_seeds: tuple[int, ...] = (0, 1)
    program_prompt_lengths: tuple[int, int] = (30, 48)
    #: the bursts' particles and tokens (check_parity's programs)
    particles: int = 10
    max_tokens: int = 8
    lora_adapters: tuple[str, ...] = ()
    kit: type | None = None

    def conformance(self) -> Any:
        """An instance of the kit (``kit``, by default :class:`LogprobBackendConformance`)
        set to these settings."""
        from genlm_core.testing.conformance import LogprobBackendConformance

        base = self.kit or LogprobBackendConformance
        adapters = list(self.lora_adapters)
        attrs = {
            "n_contexts": self.n_contexts,
            "min_len": self.min_len,
            "max_len": self.max_len,
            "atol": self.atol,
            "program_seeds": self.program_seeds,
            "program_prompt_lengths": self.program_prompt_lengths,
            "lora_adapters": lambda kit, backend: adapters or None,
        }
        return type(f"{base.__name__}WithDefects", (base,), attrs)()


def gate_settings(
    backend: Any,
    *,
    atol: float | None = None,
    shape: Any = None,
    lora_adapters: Sequence[str] = (),
    kit: type | None = None,
    seed: int = 63,
) -> GateSettings:
    """Settings under which every gate has rows to show each defect on: contexts of 36 to
    56 tokens (most past the 40+ defects' threshold, some short of it), a 40-token burst
    prompt (the first token weighs most in the shortest context the 40+ defects change),
    and as many kit contexts as the logit-scale statistic needs to resolve a 1.03 scale at
    2.5 times its bound in the backend's dtype (``shape``: the model's, read from its
    checkpoint by default; bursts of 10 particles and 8 tokens draw as many rows)."""
    import random

    from genlm_core.testing.conformance import LogprobBackendConformance
    from genlm_core.testing.tolerance import model_shape, rows_to_resolve

    n = 8
    if atol is None:
        shape = model_shape(shape if shape is not None else backend)
        n = max(n, rows_to_resolve(shape, backend.dtype, scale=0.03, ratio=2.5))
    limit = getattr(backend, "max_context_length", None) or 10_000
    tokens = LogprobBackendConformance().token_ids(backend)
    rng = random.Random(seed)
    prompt = tuple(rng.choice(tokens) for _ in range(LONG))
    return GateSettings(
        n_contexts=n,
        min_len=min(36, limit - 20),
        max_len=min(56, limit - 20),
        prompt=prompt,
        atol=atol,
        lora_adapters=tuple(lora_adapters),
        kit=kit,
    )


@dataclass(frozen=True)
class Gate:
    """A check comparing rows with the uncached model: ``run(backend, settings)`` raises
    AssertionError when a comparison fails; ``applies(backend)``: whether the backend has
    what the check exercises; ``defects``: the defects it answers for (None: all)."""

    name: str
    run: Callable[[Any, GateSettings], None]
    applies: Callable[[Any], bool] = lambda backend: True
    defects: tuple[str, ...] | None = None

    def __str__(self) -> str:
        return self.name


def _bursts(backend: Any) -> bool:
    return bool(getattr(backend, "supports_burst", False))


def _decode_batches(backend: Any) -> bool:
    engine = backend.engine
    kv = getattr(engine, "kv", None)
    return _bursts(backend) and "decode" in engine.supports and kv is not None and kv.enabled


def _kit(test: str) -> Callable[[Any, GateSettings], None]:
    def run(backend: Any, settings: GateSettings) -> None:
        out = getattr(settings.conformance(), test)(backend)
        if asyncio.iscoroutine(out):
            asyncio.run(out)

    return run


def _parity(backend: Any, s: GateSettings) -> None:
    from genlm_core.testing.burst import check_parity

    check_parity(
        backend,
        list(s.prompt),
        atol=s.atol,
        seeds=(0, 1),
        gate_seeds=4,
        n=s.particles,
        max_tokens=s.max_tokens,
    )


def _decode_rows(backend: Any, s: GateSettings) -> None:
    from genlm_core.testing.burst import check_decode_rows

    check_decode_rows(backend, list(s.prompt), atol=s.atol)


def _decode_batches_gate(backend: Any, s: GateSettings) -> None:
    from genlm_core.testing.burst import check_decode_batches

    check_decode_batches(backend, list(s.prompt), atol=s.atol)


#: the gates that compare rows with the uncached model
GATES: tuple[Gate, ...] = (
    Gate("kit test_batch_equals_single", _kit("test_batch_equals_single")),
    Gate("kit test_async_equals_sync", _kit("test_async_equals_sync")),
    Gate("random programs (kit test_random_programs)", _kit("test_random_programs")),
    Gate("check_parity (kit test_burst_matches_steps)", _parity, _bursts),
    Gate("check_decode_rows", _decode_rows, _bursts),
    Gate("check_decode_batches (kit test_decode_batches)", _decode_batches_gate, _decode_batches),
    Gate(
        "kit test_lora",
        _kit("test_lora"),
        lambda backend: bool(getattr(backend, "supports_lora", False)),
        defects=(WrongAdapter.name,),
    ),
)


def gates_for(backend: Any, defect: Defect, gates: Sequence[Gate] = GATES) -> list[Gate]:
    """The gates of ``gates`` that apply to ``backend`` and answer for ``defect``."""
    return [g for g in gates if g.applies(backend) and (g.defects is None or defect.name in g.defects)]


#: (test id, what failed) of every catch of this process, for the run's summary
CAUGHT: list[tuple[str, "Caught"]] = []


@dataclass
class Caught:
    """A gate that failed on a defect: the first failing comparison (its ``what``, and
    ``measured / bound`` where it was a bound of :mod:`~genlm_core.testing.tolerance`),
    and how many rows the defect changed before."""

    defect: str
    gate: str
    message: str
    ratio: float | None
    altered: int
    statistic: str = field(default="")

    def __str__(self) -> str:
        ratio = "" if self.ratio is None else f" ({self.statistic}: {self.ratio:.3g} x its bound)"
        return f"{self.gate} caught {self.defect}{ratio}"


def catch(backend: Any, defect: Defect, gate: Gate, settings: GateSettings) -> Caught:
    """Run ``gate`` on ``backend`` holding ``defect``: the gate must fail (an
    AssertionError); returns what failed. Raises AssertionError when the gate passed, or
    when the defect changed no row (the gate's inputs never reached it: no proof)."""
    from genlm_core.testing import tolerance
    from genlm_core.testing.tolerance import BoundExceeded

    held = len(tolerance.RECORDED)  # a defect's passing comparisons say nothing of correct paths
    with inject(backend, defect) as inj:
        try:
            try:
                gate.run(backend, settings)
            finally:
                del tolerance.RECORDED[held:]
        except AssertionError as exc:
            if not inj.altered:
                raise AssertionError(
                    f"{gate.name} failed with {defect.name} applied, but the defect changed no row: "
                    f"the failure is not the defect's ({exc})"
                ) from exc
            ratio = exc.ratio if isinstance(exc, BoundExceeded) else None
            statistic = ""
            if isinstance(exc, BoundExceeded):
                statistic = "logit scale" if "logit scale" in exc.what else "largest difference"
            caught = Caught(defect.name, gate.name, str(exc), ratio, inj.altered, statistic)
            test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
            CAUGHT.append((test, caught))
            return caught
    if not inj.altered:
        raise AssertionError(
            f"{defect.name} changed no row of {gate.name}: its inputs never reach the defect "
            "(contexts too short, no resumed row, no batch of two), so the gate proves nothing"
        )
    raise AssertionError(
        f"{gate.name} passed on {backend!r} with {defect.name} applied ({inj.altered} rows changed): "
        "the gate cannot see this defect"
    )


@dataclass
class Measured:
    """A gate run to its end with (or without) a defect, no comparison failing: the
    largest ``measured / bound`` of each statistic over its comparisons (``tail``: the
    largest difference of an entry; ``scale``: the common logit scale), how many it made,
    and the AssertionError that stopped it early, if any (a check that is not a bound)."""

    defect: str
    gate: str
    tail: float
    scale: float
    comparisons: int
    stopped: str = ""

    @property
    def ratio(self) -> float:
        return max(self.tail, self.scale)


def measure(backend: Any, defect: Defect | None, gate: Gate, settings: GateSettings) -> Measured:
    """Run ``gate`` on ``backend`` holding ``defect`` (None: the correct backend) with every
    comparison recorded instead of failing (:func:`~genlm_core.testing.tolerance.measuring`):
    the figures of docs/numerics.md's catalogue table."""
    from genlm_core.testing.tolerance import measuring

    def ratio(measured: float, bound: float) -> float:
        if math.isnan(measured):
            return math.inf
        return measured / bound if bound > 0 else (0.0 if measured == 0 else math.inf)

    stopped = ""
    block = inject(backend, defect) if defect is not None else contextlib.nullcontext()
    with block, measuring() as seen:
        try:
            gate.run(backend, settings)
        except AssertionError as exc:
            stopped = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    tail = [ratio(m, b) for what, m, b in seen if "logit scale" not in what]
    scale = [ratio(m, b) for what, m, b in seen if "logit scale" in what]
    return Measured(
        defect.name if defect is not None else "none",
        gate.name,
        max(tail, default=0.0),
        max(scale, default=0.0),
        len(seen),
        stopped,
    )


def discrimination(
    backend: Any,
    *,
    lengths: Sequence[int] = (16, 40),
    contexts: int = 8,
    shape: Any = None,
    seed: int = 0,
) -> dict[str, float]:
    """How far rows of contexts that differ in one token are apart, against the bound two
    computations of one row may differ by: for random contexts of each length in
    ``lengths``, the context with its last, middle or first token changed; each pair's
    figure is the larger of the tail's and the logit scale's ``measured / bound`` (one row:
    :func:`~genlm_core.testing.tolerance.row_atol`,
    :func:`~genlm_core.testing.tolerance.scale_bound`), computed by the backend's uncached
    path. Returns ``"L<length>-<position>"`` -> the median over ``contexts`` contexts.

    A figure above 1 says a wrong context (a stale row, a dropped token) can fail a check of
    one row; at or below 1 only the pooled statistics and other rows can see it. Random
    weights at a small scale give rows that are averages of their context (the GPU check's
    models before issue 63: 0.04-0.8)."""
    import random
    import statistics

    from genlm_core.testing.conformance import LogprobBackendConformance
    from genlm_core.testing.tolerance import (
        logit_scale,
        model_shape,
        row_atol,
        row_diff,
        row_magnitude,
        scale_bound,
    )

    shape = model_shape(shape if shape is not None else backend)
    dtype = backend.dtype
    tokens = LogprobBackendConformance().token_ids(backend)
    rng = random.Random(seed)
    out: dict[str, float] = {}
    for length in lengths:
        base = [[rng.choice(tokens) for _ in range(length)] for _ in range(contexts)]
        for where, p in (("last", length - 1), ("middle", length // 2), ("first", 0)):
            figures = []
            for c in base:
                other = list(c)
                other[p] = rng.choice([t for t in tokens[:64] if t != c[p]])
                a = backend.next_token_logprobs_uncached(c).double().cpu()
                b = backend.next_token_logprobs_uncached(other).double().cpu()
                tail = row_diff(b, a) / row_atol(shape, row_magnitude(a), dtype)
                scale = abs(logit_scale(b, a)[0]) / scale_bound(shape, 1.0, dtype)
                figures.append(max(tail, scale))
            out[f"L{length}-{where}"] = statistics.median(figures)
    return out


@contextlib.contextmanager
def active_adapter(backend: Any, name: str | None) -> Iterator[None]:
    """``backend`` computing with the loaded adapter ``name`` inside the block."""
    backend.set_lora(name) if name is not None else backend.clear_lora()
    try:
        yield
    finally:
        backend.clear_lora()
