"""Bursts: an SMC program's decode loop run inside the backend, the program drawing.

Every SMC step through :meth:`next_token_logprobs` is a round trip per particle: the
program asks, the batcher gathers, the engine computes, rows are copied out one by one
and the program draws. A burst turns it around: the backend runs the loop and the
program (a *control*) only draws, all rows of a step in one call.

A control is any object with the four methods of :class:`EngineControl` (genlm-backend's
``EngineControl`` protocol, so genlm-control's burst loop drives a genlm-core backend
unchanged)::

    report = llm.run_burst(control, max_steps=20)        # or: await llm.burst(...)

The loop (:func:`drive`): the control's first :meth:`~EngineControl.drain_adds` seeds the
live rows ``(handle, prompt_token_ids, lora_name)``; then each step computes the next-token
log-probabilities of every live row (one engine call; a row's KV stays in the engine
between steps, so a step computes one new token per row), hands them to
:meth:`~EngineControl.draw` with the rows' handles, appends each drawn token to its row,
and applies what the control queued: :meth:`~EngineControl.drain_aborts` drops rows,
:meth:`~EngineControl.drain_adds` adds rows (a resampled particle re-added with its
prefix: its KV is reused from the engine's prefix cache). A row ends when the control
aborts it, after ``max_steps`` draws of its own, or when its context reaches the context
limit. The loop ends when no row is live; then :meth:`~EngineControl.on_burst_end`, and
its aborts are applied (rows it adds then are not run: they are reported). The backend
holds no SMC logic: no weights, no resampling, no EOS handling (the control ends a row
by aborting it).

``draw`` receives a ``(rows, vocab)`` float32 tensor of *normalised* log-probabilities
(logits up to a per-row constant, which is all a sampler needs) and returns one token id
per row: a list of ints, or an int64/int32 numpy array or tensor of shape ``(rows,)``
(another shape or dtype is an error: a ``(rows, 1)`` array or ``uint8`` ids are a bug of
the control's, not a draw). An abort names a handle added in this burst (a row that
already ended is ignored; a handle never added is an error).

An engine offers bursts with one of two capabilities (:attr:`Engine.supports
<genlm_core.engine.contract.Engine.supports>`), and the backend picks the path from
them alone. ``"burst"``: the engine writes nothing more; the core's decode step runs
the live rows' distinct contexts through
:meth:`~genlm_core.engine.contract.Engine.forward`, whose KV reuse computes each row's
new token only - the same call, with the same contexts in the same order, that a step
loop makes (:func:`~genlm_core.engine.contexts.run_distinct`), so a burst and its step
loop give the same numbers. ``"decode"``: the engine keeps its rows between steps and
writes :meth:`~genlm_core.engine.contract.Engine.decode_step` (the rows of a step, by
handle) and :meth:`~genlm_core.engine.contract.Engine.end_burst` (the handles whose
state it may free when the burst ends; genlm-hf and genlm-mlx over
:class:`~genlm_core.engine.decode_batches.DecodeBatches`, genlm-vllm over its
sessions). A row is its handle for every engine: the engine matches a step's rows to
what it kept by handle. Backends with neither capability (the remote backend) say
``supports_burst = False``, and programs run steps.

A control draws all rows of a step at once: :func:`genlm_core.engine.sampling.draw_rows`
is a batched sampler for it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from genlm_core import _deprecated
from genlm_core.engine.contexts import Context

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["BurstReport", "EngineControl", "drive"]


@runtime_checkable
class EngineControl(Protocol):
    """What drives a burst: genlm-backend's ``EngineControl`` protocol."""

    def draw(self, logprobs: "torch.Tensor", handles: Sequence[int]) -> Any:
        """One token id per row of ``logprobs`` (``(len(handles), vocab)`` normalised
        log-probabilities, float32),
        in row order: a list of ints, or an int64/int32 array or tensor of shape
        ``(len(handles),)``; ``handles[i]`` is the control's own handle of row ``i``."""
        ...

    def drain_adds(self) -> Iterable[tuple[int, Sequence[int], str | None]]:
        """``(handle, prompt_token_ids, lora_name)`` rows to add, queued since the last call."""
        ...

    def drain_aborts(self) -> Iterable[int]:
        """Handles of rows to drop, queued since the last call: handles added in this burst
        (one whose row already ended is ignored; any other is an error)."""
        ...

    def on_burst_end(self) -> None:
        """Called once after the last step, before the last drains."""
        ...


@dataclass
class BurstReport:
    """What a burst did. ``tokens[h]``: the ids drawn for handle ``h`` in this burst, in
    order; ``capped``: handles ended by ``max_steps`` or the context limit (not aborted);
    ``not_run``: handles the control added after the loop ended (``on_burst_end``)."""

    steps: int = 0
    rows_drawn: int = 0
    added: int = 0
    aborted: int = 0
    tokens: dict[int, list[int]] = field(default_factory=dict)
    capped: list[int] = field(default_factory=list)
    not_run: list[int] = field(default_factory=list)


def _handle(value: Any, what: str) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise ValueError(
            f"run_burst: the control's {what} gave handle {value!r}; handles are ints the control chooses"
        ) from None


#: what a draw returns, for errors
_DRAW_SHAPE = (
    "one token id per row, in the order of `handles`: a list of ints, or an int64/int32 array or tensor"
)


def _tokens(drawn: Any, handles: Sequence[int], vocab_size: int) -> list[int]:
    """The control's draw as a list of ints, or a ValueError saying what was expected,
    what came, and the row where an id is outside the vocabulary."""
    import torch

    n = len(handles)
    expected = f"{_DRAW_SHAPE} of shape ({n},)"
    try:
        ids = torch.as_tensor(drawn)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(
            f"run_burst: draw() returned {type(drawn).__name__}; expected {expected} ({e})"
        ) from None
    if ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(
            f"run_burst: draw() returned {ids.dtype} values; token ids must be integers of dtype int64 or "
            f"int32 (a narrower or unsigned dtype wraps ids around): expected {expected}"
        )
    if tuple(ids.shape) != (n,):
        if ids.ndim == 1:
            raise ValueError(
                f"run_burst: draw() returned {ids.numel()} token ids for {n} rows; expected {expected}"
            )
        raise ValueError(
            f"run_burst: draw() returned shape {tuple(ids.shape)} for {n} rows; expected {expected}"
        )
    out = [int(t) for t in ids.tolist()]
    for h, t in zip(handles, out):
        if not 0 <= t < vocab_size:
            raise ValueError(
                f"run_burst: draw() gave row {h} token id {t}, outside the vocabulary [0, {vocab_size})"
            )
    return out


def drive(
    control: EngineControl,
    max_steps: int,
    *,
    validate: Callable[[Any], Context],
    next_logprobs: Callable[[Mapping[int, Context], Collection[int]], "torch.Tensor"] | None = None,
    end_burst: Callable[[Collection[int]], None] | None = None,
    vocab_size: int,
    max_context_length: int | None,
    **deprecated: Any,
) -> BurstReport:
    """Run one burst of ``control``: the loop above, over a backend's ``validate`` (a
    prompt, checked), ``next_logprobs`` (the live rows ``handle -> context`` and the
    handles released since the last step -> their ``(rows, vocab)`` log-probabilities)
    and ``end_burst`` (called once at the end of a burst that added rows, also after an
    error, with the handles released since the last step and the rows still live: no
    step sees them again).
    ``step=`` and ``release=`` are the deprecated names of ``next_logprobs=`` and
    ``end_burst=``."""
    next_logprobs, end_burst = _renamed(deprecated, next_logprobs, end_burst)
    if not isinstance(max_steps, int) or isinstance(max_steps, bool) or max_steps < 0:
        raise ValueError(f"run_burst: max_steps must be a non-negative int, got {max_steps!r}")
    report = BurstReport()
    live: dict[int, list[int]] = {}
    drawn: dict[int, int] = {}
    released: set[int] = set()

    def drop(h: int) -> None:
        del live[h]
        released.add(h)

    def apply_aborts() -> None:
        for value in control.drain_aborts() or ():
            h = _handle(value, "drain_aborts()")
            if h in live:
                drop(h)
                report.aborted += 1
            elif h not in report.tokens:  # added in this burst: a row that ended meanwhile
                raise ValueError(
                    f"run_burst: drain_aborts() gave handle {h}, which no row of this burst was added "
                    "with; abort only handles drain_adds() gave in this burst (aborting a row that "
                    "already ended, by max_steps or the context limit, is fine)"
                )

    def apply_adds(run: bool) -> None:
        for add in control.drain_adds() or ():
            try:
                value, prompt, lora_name = add
            except (TypeError, ValueError):
                raise ValueError(
                    f"run_burst: drain_adds() gave {add!r}; each add is (handle, prompt_token_ids, lora_name)"
                ) from None
            h = _handle(value, "drain_adds()")
            if not run:
                report.not_run.append(h)
                continue
            if lora_name is not None:
                raise ValueError(
                    f"run_burst: row {h} names the LoRA adapter {lora_name!r}; a burst runs the "
                    "base model only (pass lora_name=None, or run adapter rows through steps)"
                )
            if h in live:
                raise ValueError(f"run_burst: row {h} was added while live; give every add a fresh handle")
            try:
                ctx = validate(prompt)
            except ValueError as e:
                raise ValueError(f"run_burst: the prompt of row {h}: {e}") from None
            live[h] = list(ctx)
            drawn[h] = 0
            report.tokens.setdefault(h, [])
            report.added += 1

    try:
        apply_aborts()
        apply_adds(run=max_steps > 0)
        while live:
            handles = list(live)
            rows = next_logprobs({h: tuple(live[h]) for h in handles}, frozenset(released))
            released.clear()
            tokens = _tokens(control.draw(rows, handles), handles, vocab_size)
            report.steps += 1
            report.rows_drawn += len(handles)
            for h, t in zip(handles, tokens):
                live[h].append(t)
                drawn[h] += 1
                report.tokens[h].append(t)
                if drawn[h] >= max_steps or (
                    max_context_length is not None and len(live[h]) > max_context_length
                ):
                    drop(h)
                    report.capped.append(h)
            apply_aborts()
            apply_adds(run=True)
        control.on_burst_end()
        apply_aborts()
        apply_adds(run=False)
    finally:
        released.update(live)
        live.clear()
        if released:
            end_burst(frozenset(released))
    return report


def _renamed(
    deprecated: dict[str, Any], next_logprobs: Callable[..., Any] | None, end_burst: Callable[..., Any] | None
) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``drive``'s callables under their names, taking the deprecated ``step=`` /
    ``release=`` (with a DeprecationWarning); a TypeError for anything else missing or unknown."""
    old = _deprecated.renamed_keywords(
        "drive",
        deprecated,
        {"step": ("next_logprobs", "pass next_logprobs=..."), "release": ("end_burst", "pass end_burst=...")},
        stacklevel=3,
    )
    next_logprobs = next_logprobs or old.get("next_logprobs")
    end_burst = end_burst or old.get("end_burst")
    if deprecated:
        raise TypeError(f"drive() got unexpected keyword arguments {', '.join(sorted(deprecated))}")
    if next_logprobs is None or end_burst is None:
        raise TypeError("drive() needs next_logprobs= and end_burst=")
    return next_logprobs, end_burst
