"""The gates that compare a backend's rows with the uncached model, run with a defect of
:mod:`genlm_core.testing.defects` applied: each must fail (:func:`catch`), and
:func:`measure` records how far each comparison went past its bound (the figures of
docs/numerics.md's catalogue table).

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

    from genlm_core.testing.defects import CATALOGUE
    from genlm_core.testing.gates import catch, gate_settings, gates_for

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from genlm_core.testing.conformance import LogprobBackendConformance
from genlm_core.testing.defects import LONG, Defect, WrongAdapter, inject

__all__ = [
    "CAUGHT",
    "GATES",
    "Caught",
    "Gate",
    "GateSettings",
    "KitTest",
    "Measured",
    "catch",
    "discrimination",
    "gate_settings",
    "gates_for",
    "measure",
]


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
    """Bursts run over the core's kept batches of an engine's KV (capability
    "kept_batches", with KV reuse on): the bookkeeping check_decode_batches tests."""
    engine = backend.engine
    kv = getattr(backend, "kv_calls", None)
    return _bursts(backend) and "kept_batches" in engine.supports and kv is not None and kv.reuse.enabled


@dataclass(frozen=True)
class KitTest:
    """A gate that is one of the kit's own tests, run on an instance of the settings' kit
    (:meth:`GateSettings.conformance`). ``test`` is the method itself, not its name, so a
    renamed kit test fails this module's import rather than the gate's first run; the
    instance's attribute of that name is what runs, so a plugin's kit that overrides the
    test runs its own."""

    test: Callable[..., Any]

    def __call__(self, backend: Any, settings: GateSettings) -> None:
        out = getattr(settings.conformance(), self.test.__name__)(backend)
        if asyncio.iscoroutine(out):
            asyncio.run(out)


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
    Gate("kit test_batch_equals_single", KitTest(LogprobBackendConformance.test_batch_equals_single)),
    Gate("kit test_async_equals_sync", KitTest(LogprobBackendConformance.test_async_equals_sync)),
    Gate(
        "random programs (kit test_random_programs)", KitTest(LogprobBackendConformance.test_random_programs)
    ),
    Gate("check_parity (kit test_burst_matches_steps)", _parity, _bursts),
    Gate("check_decode_rows", _decode_rows, _bursts),
    Gate("check_decode_batches (kit test_decode_batches)", _decode_batches_gate, _decode_batches),
    Gate(
        "kit test_lora",
        KitTest(LogprobBackendConformance.test_lora),
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
                statistic = _statistic(exc.what)
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


def _statistic(what: str) -> str:
    """Which statistic of :func:`~genlm_core.testing.tolerance.assert_rows_close` a
    comparison's label names."""
    if "logit scale" in what:
        return "logit scale"
    if "spread error" in what:
        return "row spread"
    return "largest difference"


@dataclass
class Measured:
    """A gate run to its end with (or without) a defect, no comparison failing: the
    largest ``measured / bound`` of each statistic over its comparisons (``tail``: the
    largest difference of an entry; ``scale``: the common logit scale; ``spread``: a row's
    spread error), how many it made, and the AssertionError that stopped it early, if any
    (a check that is not a bound)."""

    defect: str
    gate: str
    tail: float
    scale: float
    comparisons: int
    stopped: str = ""
    spread: float = 0.0

    @property
    def ratio(self) -> float:
        return max(self.tail, self.scale, self.spread)


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
    by: dict[str, list[float]] = {}
    for what, m, b in seen:
        by.setdefault(_statistic(what), []).append(ratio(m, b))
    return Measured(
        defect.name if defect is not None else "none",
        gate.name,
        max(by.get("largest difference", []), default=0.0),
        max(by.get("logit scale", []), default=0.0),
        len(seen),
        stopped,
        max(by.get("row spread", []), default=0.0),
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
    random-weight models at their configs' 0.02 weight scale: 0.04-0.8)."""
    import random
    import statistics

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
