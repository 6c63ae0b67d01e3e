"""A catalogue of defects, each applied to a real engine, that every gate comparing rows
must catch: the proof that a check can fail, in every dtype.

A check that compares a backend's rows with an independent computation of them passes on
a correct backend; that is half of what it must do. The other half is to fail on a wrong
one, and a bound that is too loose (bfloat16's tail bound alone: a 1.03 logit scale
passes it on every row) fails on nothing. So the kit ships defects of the kind an engine's
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
:class:`OneRowOff` (0.3)      the last row of every call off by 0.3 nats on every token, in signs
                              that follow no pattern (a row read with a wrong KV column or a
                              neighbour's position): below a correct bfloat16 row's distance from
                              float32 (0.3-0.7 nats at the worst token), so a worst-token bound
                              cannot see it; the row's spread error does
                              (:func:`~genlm_core.testing.tolerance.row_spread_error`)
============================  ===================================================================

The gates that must fail on each defect, and how to run them with one applied, are
:mod:`genlm_core.testing.gates`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CATALOGUE",
    "Defect",
    "FirstColumnMasked",
    "FirstTokenDropped",
    "Injection",
    "NeighbourRow",
    "OneRowOff",
    "PositionShifted",
    "Scale",
    "StaleRow",
    "WrongAdapter",
    "active_adapter",
    "inject",
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


@dataclass(frozen=True)
class OneRowOff(Defect):
    """The last row of every call: each token's logit moved by ``nats``, up or down by a
    fixed pseudo-random sign per token (its log-probabilities then differ from the right
    ones by ``nats`` up to the normalisation)."""

    nats: float = 0.3

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"one row of each call {self.nats:g} nats off"

    def rows(self, inj: "Injection", contexts: list[Context], rows: list[Any]) -> list[Any]:
        import torch

        if not rows:
            return rows
        last = rows[-1]
        signs = torch.randint(0, 2, (last.shape[-1],), generator=torch.Generator().manual_seed(63)) * 2 - 1
        moved = last.float() + self.nats * signs.to(last.device, torch.float32)
        if inj.engine_returns == "logprobs":
            moved = torch.log_softmax(moved, -1)
        inj.altered += 1
        return [*rows[:-1], moved.to(last.dtype)]


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


#: the catalogue: every gate must fail on each, in every dtype
CATALOGUE: tuple[Defect, ...] = (
    Scale(1.10),
    Scale(1.03),
    FirstColumnMasked(),
    FirstTokenDropped(),
    PositionShifted(),
    NeighbourRow(),
    WrongAdapter(),
    StaleRow(),
    OneRowOff(0.3),
)


# ---------------------------------------------------------------------------- injection
class Injection:
    """A defect applied to ``backend``'s engine (see :func:`inject`): the engine's
    ``forward`` (for an engine resuming from kept KV, the core's call around its
    ``forward_rows``) and decode step (its own, or the core's over its kept batches) return
    the defect's rows, ``forward_uncached`` stays right. ``altered`` counts the rows it
    changed."""

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
        calls = getattr(self.backend, "kv_calls", None)
        if calls is None:
            return _as_rows(self._saved["forward_uncached"](list(contexts)))
        # through the core, which forgets what an engine emptying its KV no longer holds
        counters = calls.reuse.counters
        before = dict(vars(counters))
        try:
            out = calls.forward_uncached(list(contexts))
        finally:
            vars(counters).update(before)
        return _as_rows(out)

    # -------------------------------------------------------------- the wrappers
    def _defective(self, contexts: list[Context], run: Callable[[], Any]) -> Any:
        out = self.defect.call(self, run)
        rows = self.defect.rows(self, contexts, _as_rows(out))
        self.seen.update(contexts)
        return _like(out, rows)

    def __enter__(self) -> "Injection":
        engine = self.engine
        for name in _WRAPPED:
            self._saved[name] = getattr(engine, name)
        forward = self._saved["forward"]
        engine.forward = lambda contexts: self._defective(list(contexts), lambda: forward(contexts))
        supports = getattr(engine, "supports", ())
        calls = getattr(self.backend, "kv_calls", None)
        if calls is not None:
            # the core's call around forward_rows: the defect sees the call's contexts after what
            # the engine handed back is kept (a reference computed mid-call by an engine that
            # empties its KV, llama.cpp, must not leave kept payloads the engine no longer holds)
            kv_forward = calls.forward
            calls.forward = lambda contexts: self._defective(list(contexts), lambda: kv_forward(contexts))
        if "decode" in supports:
            step = self._saved["decode_step"]
            engine.decode_step = lambda rows, released: self._defective(
                list(rows.values()), lambda: step(rows, released)
            )
        if "kept_batches" in supports and calls is not None:
            kept_step = calls.decode_step
            calls.decode_step = lambda rows, released, batch_size: self._defective(
                list(rows.values()), lambda: kept_step(rows, released, batch_size)
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
        for name in _WRAPPED:
            self.engine.__dict__.pop(name, None)
        calls = getattr(self.backend, "kv_calls", None)
        if calls is not None:
            calls.__dict__.pop("decode_step", None)
            calls.__dict__.pop("forward", None)
        self.backend.clear_cache()  # no defective row or state outlives the defect


#: the engine's methods an injection replaces (and puts back)
_WRAPPED = ("forward", "forward_uncached", "decode_step", "clear_cache")


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


@contextlib.contextmanager
def active_adapter(backend: Any, name: str | None) -> Iterator[None]:
    """``backend`` computing with the loaded adapter ``name`` inside the block."""
    backend.set_lora(name) if name is not None else backend.clear_lora()
    try:
        yield
    finally:
        backend.clear_lora()
