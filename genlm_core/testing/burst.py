"""The parity gates of bursts against steps, over one SMC program and its two drivers
(:mod:`genlm_core.testing.smc_program`: :class:`SMCProgram`, :func:`run_steps`,
:func:`run_burst`; importable from here too).

Both drivers see the same rows in the same order when the backend computes them the same way,
so their particles and weights agree exactly; :func:`mean_gaps` is the statistical
criterion for engines whose burst computes differently. :func:`check_parity` applies
the one that holds: exact where neither driver lost a cached prefix (the prefix cache's
``kv_evictions``: decided by the caches, not by the results) and the engine's decode step
computes as its forward does, the statistical criterion otherwise (a step loop whose
prefix cache evicted a prefix re-prefills tokens that a burst keeps as decode KV: other
sums, the same distribution). An engine whose decode step runs other kernels than its
forward (vLLM's sessions: one-token decode over kept KV against a prefill of the
uncached tail) says ``decode_same_arithmetic = False``; then :func:`same_arithmetic`
measures it: every row of a short burst against the uncached model's, bit for bit.
:func:`check_seam` drives genlm-backend's seam as genlm-control does;
:func:`check_decode_rows` and :func:`check_decode_batches` check an engine's own decode
step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from genlm_core.testing.smc_program import (
    LoopControl,
    ProgramControl,
    SMCProgram,
    SMCResult,
    run_burst,
    run_burst_on_loop,
    run_steps,
)

__all__ = [
    "AdapterSwitchControl", "LoopControl", "ProgramControl", "RecordingControl", "SMCProgram", "SMCResult", "check_decode_batches",
    "check_decode_rows", "check_parity", "check_seam", "mean_gaps", "same_arithmetic", "run_burst", "run_burst_on_loop", "run_steps",
]  # fmt: skip


def check_seam(
    llm: Any, prompt: Sequence[int], seeds: Sequence[int] = (0, 1), n: int = 8, max_tokens: int = 8
) -> None:
    """genlm-backend's seam as genlm-control's burst loop drives it (:func:`run_burst_on_loop`)
    against the same program through per-step calls, from clean caches, for each seed: the
    same particles and weights, resampling through aborts and re-adds, every drawn row
    reported. Where the engine's decode step does not compute as its forward on this
    machine (:func:`same_arithmetic`), the particles may part where a draw falls between
    two roundings: then only the protocol is checked here (the abort/re-add cycle, every
    row reported); :func:`check_parity` holds the distributional gate and
    :func:`check_decode_rows` the rows. Raises AssertionError naming what differs."""
    import asyncio

    exact = same_arithmetic(llm, prompt)
    for seed in seeds:
        llm.clear_cache()
        steps = run_steps(llm, SMCProgram(prompt, llm.eos_token_ids, n=n, max_tokens=max_tokens, seed=seed))
        llm.clear_cache()
        program = SMCProgram(prompt, llm.eos_token_ids, n=n, max_tokens=max_tokens, seed=seed)
        burst = asyncio.run(run_burst_on_loop(llm, program))
        if not exact:
            _check_seam_protocol(burst, steps, seed, n)
            continue
        if burst.tokens != steps.tokens:
            raise AssertionError(f"seed {seed}: burst tokens {burst.tokens} != steps {steps.tokens}")
        for a, b in zip(steps.log_weights, burst.log_weights):
            # the same floats summed in the same order by both drivers: float64 round-off only
            if abs(a - b) > 1e-12 * max(1.0, abs(a)):
                raise AssertionError(f"seed {seed}: weights {burst.log_weights} != {steps.log_weights}")
        _check_seam_protocol(burst, steps, seed, n)
        if burst.rows != steps.rows:
            raise AssertionError(f"seed {seed}: {burst.rows} rows drawn, steps drew {steps.rows}")


def _check_seam_protocol(burst: SMCResult, steps: SMCResult, seed: int, n: int) -> None:
    """What the seam must do whatever the rounding: an abort/re-add cycle, every drawn
    row reported."""
    report = burst.extra["report"]
    if not (report.aborted >= n and report.added > n and burst.resamples >= 1):
        raise AssertionError(f"seed {seed}: no abort/re-add cycle ({report}, {burst.resamples} resamples)")
    if not sum(len(t) for t in report.tokens.values()) == report.rows_drawn == burst.rows:
        raise AssertionError(f"seed {seed}: {report.rows_drawn} rows reported, the program drew {burst.rows}")


def mean_gaps(pairs: Sequence[tuple[SMCResult, SMCResult]]) -> dict[str, float]:
    """The anchors' criterion over seeds: mean and standard error of the burst-minus-steps
    differences of the log-marginal-likelihood and of the mean particle length."""
    out: dict[str, float] = {}
    for name, f in (
        ("log_ml", lambda r: r.log_ml),
        ("length", lambda r: sum(len(t) for t in r.tokens) / len(r.tokens)),
    ):
        d = [f(b) - f(s) for s, b in pairs]
        mean = sum(d) / len(d)
        var = sum((x - mean) ** 2 for x in d) / max(1, len(d) - 1)
        out[name] = mean
        out[f"{name}_se"] = math.sqrt(var / len(d))
    return out


def _evictions(llm: Any) -> int:
    """Prefix-cache entries evicted so far (0 for an engine that reports none)."""
    value = llm.stats().get("prefix_cache", {}).get("kv_evictions", 0)
    return int(value) if isinstance(value, int | float) else 0


def same_arithmetic(llm: Any, prompt: Sequence[int], n: int = 6, max_tokens: int = 6) -> bool:
    """Whether a burst's rows are the uncached model's bit for bit on this machine: True
    for an engine that promises it (``engine.decode_same_arithmetic``, the default);
    otherwise measured over a short burst with resampling (a row that differs answers
    False). Decided by the rows themselves, not by the program's results."""
    import torch

    engine = getattr(llm, "engine", None)
    if getattr(engine, "decode_same_arithmetic", True):
        return True
    llm.clear_cache()
    control = _Recorder(SMCProgram(prompt, llm.eos_token_ids, n=n, max_tokens=max_tokens, seed=99))
    llm.run_burst(control, max_steps=max_tokens + 1)
    contexts = list(dict.fromkeys(c for c, _ in control.seen))
    ref = dict(zip(contexts, (llm.next_token_logprobs_uncached(list(c)) for c in contexts)))
    return all(torch.equal(row.float().cpu(), ref[c].float().cpu()) for c, row in control.seen)


class _Recorder(ProgramControl):
    """The program's control, keeping every row it draws from with its context."""

    def __init__(self, program: SMCProgram) -> None:
        super().__init__(program)
        self.seen: list[tuple[tuple[int, ...], Any]] = []

    def draw(self, logprobs: Any, handles: Sequence[int]) -> list[int]:
        self.seen += [
            (tuple(self.program.context(self.particle[h])), r) for h, r in zip(handles, logprobs.clone())
        ]
        return super().draw(logprobs, handles)


def _paired(llm: Any, make: Any, seed: int) -> tuple[SMCResult, SMCResult, bool]:
    """The program of ``seed`` through steps and through a burst, each from clean caches;
    and whether neither run evicted a cached prefix (then both ran each token once, as
    the same batches: the same arithmetic)."""
    llm.clear_cache()
    before = _evictions(llm)
    steps = run_steps(llm, make(seed))
    llm.clear_cache()
    burst = run_burst(llm, make(seed))
    return steps, burst, _evictions(llm) == before


def check_parity(
    llm: Any,
    prompt: Sequence[int],
    *,
    atol: float | None = None,
    seeds: Sequence[int] = (0, 1),
    gate_seeds: int = 20,
    n: int = 6,
    max_tokens: int = 6,
) -> dict[str, Any]:
    """The parity gate of bursts against steps (:class:`SMCProgram` with ``n`` particles).

    For each of ``seeds``, every row either driver drew from is the uncached model's row of
    its context (each as it comes, then all of them together: the derived bounds of
    :func:`~genlm_core.testing.tolerance.assert_rows_close`, or ``atol``): drivers that
    agree with each other are not enough, a defect both share would pass. Then, where
    neither run evicted a cached prefix: the same tokens, the same weights (to 1e-9 relative: the same floats summed in the same
    order), every drawn row reported, at least one abort/re-add cycle. Where they did not
    (the arithmetic differs, e.g. decode KV against a re-prefill): the anchors' criterion
    over ``gate_seeds`` seeds - the mean burst-minus-steps difference of the
    log-marginal-likelihood and of the mean length within three standard errors of 0,
    plus what rounding can move them (``atol`` per row and step, ``max_tokens`` steps;
    ``atol`` None: :func:`~genlm_core.testing.tolerance.row_atol` for the model, its dtype
    and the prompt row's magnitude). Returns what it checked; raises AssertionError naming
    what differs."""

    def make(seed: int, record: bool = False) -> SMCProgram:
        return SMCProgram(prompt, llm.eos_token_ids, n=n, max_tokens=max_tokens, seed=seed, record=record)

    exact, differ = 0, 0
    arithmetic = same_arithmetic(llm, prompt)
    rows = _UncachedRows(
        llm, atol, f"the rows the programs of seeds {list(seeds)} drew from, against the uncached model's"
    )
    for seed in seeds:
        steps, burst, same = _paired(llm, lambda s: make(s, record=True), seed)
        for driver, result in (("step loop", steps), ("burst", burst)):
            for ctx, row in result.extra["seen"]:
                rows.compare(
                    ctx, row, f"seed {seed}: a row the {driver} drew from against the uncached model's"
                )
        same = same and arithmetic
        report = burst.extra["report"]
        if not (report.rows_drawn == burst.rows and report.aborted >= 1 and report.added > n):
            raise AssertionError(f"seed {seed}: no abort/re-add cycle or rows unreported ({report})")
        if not same:
            differ += 1
            continue
        exact += 1
        if burst.tokens != steps.tokens:
            raise AssertionError(f"seed {seed}: burst tokens {burst.tokens} != steps {steps.tokens}")
        if not (burst.rows == steps.rows and burst.resamples == steps.resamples >= 1):
            raise AssertionError(f"seed {seed}: {burst.rows} rows / {burst.resamples} resamples, "
                                 f"steps {steps.rows} / {steps.resamples}")  # fmt: skip
        for a, b in zip(steps.log_weights, burst.log_weights):
            # the same rows summed in the same order: float64 sums of ~n*max_tokens terms
            # agree to ~1e-15 relative; 1e-9 leaves room for a sum regrouped by a resample
            if abs(a - b) > 1e-9 * max(1.0, abs(a)):
                raise AssertionError(f"seed {seed}: weights {burst.log_weights} != {steps.log_weights}")
    rows.compare_all()
    out: dict[str, Any] = {"exact": exact, "statistical": differ, "same_arithmetic": arithmetic}
    if differ:
        pairs = [_paired(llm, make, 1000 + s)[:2] for s in range(gate_seeds)]
        gaps = mean_gaps(pairs)
        per_row = atol if atol is not None else _derived_atol(llm, prompt)
        floor = {"log_ml": max_tokens * per_row, "length": 0.0}
        for name in ("log_ml", "length"):
            bound = 3 * gaps[f"{name}_se"] + floor[name]
            if abs(gaps[name]) > bound:
                raise AssertionError(
                    f"burst vs steps over {gate_seeds} seeds: mean {name} difference {gaps[name]:.3g} "
                    f"exceeds {bound:.3g} (3 standard errors {3 * gaps[f'{name}_se']:.3g} + rounding "
                    f"{floor[name]:.3g}): a consistent gap is a bug"
                )
        out["gaps"] = gaps
    return out


class _UncachedRows:
    """Rows checked against the uncached model's row of their context (each computed once),
    as they come and together (:class:`~genlm_core.testing.tolerance.RowComparisons`)."""

    def __init__(self, llm: Any, atol: float | None, what: str) -> None:
        from genlm_core.testing.tolerance import RowComparisons

        self.llm = llm
        self.rows = RowComparisons(_row_comparison(llm, atol), what)
        self.ref: dict[tuple[int, ...], Any] = {}

    def compare(self, ctx: Sequence[int], row: Any, what: str) -> None:
        ctx = tuple(ctx)
        if ctx not in self.ref:
            self.ref[ctx] = self.llm.next_token_logprobs_uncached(list(ctx))
        self.rows.add(row, self.ref[ctx], what)

    def compare_all(self) -> None:
        self.rows.finish()


class RecordingControl(ProgramControl):
    """The program's control, recording every row it is handed with its context, and doing
    what a program may do between steps: ask the backend for another context's row (another
    caller), clear the backend's caches (``clear_at``: that step), or fail (``fail_at``).
    ``checked``: an ``_UncachedRows`` each row is compared with as it is drawn."""

    def __init__(
        self,
        llm: Any,
        program: SMCProgram,
        *,
        clear_at: int = -1,
        fail_at: int = -1,
        interleave: bool = True,
        checked: Any = None,
    ) -> None:
        super().__init__(program)
        self.llm, self.clear_at, self.fail_at, self.interleave = llm, clear_at, fail_at, interleave
        self.checked = checked
        self.seen: list[tuple[tuple[int, ...], Any]] = []
        self.other: list[tuple[list[int], Any]] = []
        self.calls = 0

    def draw(self, logprobs: Any, handles: Sequence[int]) -> list[int]:
        contexts = [tuple(self.program.context(self.particle[h])) for h in handles]
        self.seen += list(zip(contexts, logprobs.clone()))
        if self.checked is not None:
            what = "a burst row" + (" (other calls between steps)" if self.interleave else "")
            for c, row in self.seen[-len(contexts) :]:
                self.checked.compare(c, row, f"{what} against the uncached model's")
        if self.interleave:
            other = self.program.prompt[:3] + [self.calls + 5]
            self.other.append((other, self.llm.next_token_logprobs_sync(other)))
            if self.checked is not None:
                self.checked.compare(
                    other,
                    self.other[-1][1],
                    "another caller's row during the burst against the uncached model's",
                )
        if self.calls == self.clear_at:
            self.llm.clear_cache()
        if self.calls == self.fail_at:
            raise RuntimeError("the control failed")
        self.calls += 1
        return super().draw(logprobs, handles)


class AdapterSwitchControl(ProgramControl):
    """The program's control, recording every row with its context and the adapter active
    when it was drawn, and switching the backend to LoRA adapter ``adapter`` after the
    program's step ``at`` (a burst's kept KV must not outlive the weights that made it)."""

    def __init__(self, llm: Any, program: SMCProgram, adapter: str, at: int = 3) -> None:
        super().__init__(program)
        self.llm, self.adapter, self.at = llm, adapter, at
        self.seen: list[tuple[list[int], Any, str | None]] = []

    def draw(self, logprobs: Any, handles: Sequence[int]) -> list[int]:
        for h, row in zip(handles, logprobs):
            self.seen.append((self.program.context(self.particle[h]), row.clone(), self.llm.active_lora))
        if self.program.steps == self.at:
            self.llm.set_lora(self.adapter)
        return super().draw(logprobs, handles)


def check_decode_rows(
    llm: Any,
    prompt: Sequence[int],
    *,
    atol: float | None = None,
    n: int = 10,
    max_tokens: int = 9,
    seed: int = 6,
) -> None:
    """A burst with another caller's rows between its steps and a cache clear in its
    middle (what a LoRA switch does), and for an engine with ``decode_same_arithmetic``
    False first a burst alone: every row the control drew from is the uncached model's row
    of its context, and so is every row the other caller got (each as it comes, then all
    of them together). Then a control failing
    mid-burst: the error reaches the caller, the engine keeps no decode state
    (``decode_batches``, or an engine's live ``decode_sessions``), and the backend answers
    as before. Rows are compared at ``atol``, or (None) at the bound derived for the model
    and its dtype (:func:`~genlm_core.testing.tolerance.row_atol`). Raises AssertionError."""
    close = _row_comparison(llm, atol)
    checked = _UncachedRows(
        llm, atol, "the rows of the bursts and of the other caller, against the uncached model's"
    )

    # A burst alone first (nothing disturbs its kept state) where the engine's decode step
    # computes with other kernels than its forward: elsewhere check_parity's exact gate
    # already holds an undisturbed burst's rows to the step loop's, bit for bit.
    engine = getattr(llm, "engine", None)
    passes = (False,) if getattr(engine, "decode_same_arithmetic", True) else (True, False)
    for alone in passes:
        llm.clear_cache()
        program = SMCProgram(prompt, llm.eos_token_ids, n=n, max_tokens=max_tokens, seed=seed)
        control = RecordingControl(
            llm, program, clear_at=-1 if alone else 4, interleave=not alone, checked=checked
        )
        llm.run_burst(control, max_steps=max_tokens + 1)
        if not (control.calls > 6 and len(control.seen) > 4 * n):
            raise AssertionError(
                f"the burst ran {control.calls} steps, {len(control.seen)} rows: too short a check"
            )
    checked.compare_all()
    llm.clear_cache()
    control = RecordingControl(
        llm, SMCProgram(prompt, llm.eos_token_ids, n=n, max_tokens=max_tokens, seed=seed + 1), fail_at=3
    )
    try:
        llm.run_burst(control, max_steps=max_tokens + 1)
    except RuntimeError as e:
        if "the control failed" not in str(e):
            raise
    else:
        raise AssertionError("the control's error did not reach run_burst's caller")
    state = llm.stats().get("engine", {})
    held = state.get("decode_batches", 0) + state.get("decode_sessions", 0)
    if held:
        raise AssertionError(f"{held} decode batches or sessions still held after a failed burst")
    ctx = list(prompt) + [9]
    close(
        llm.next_token_logprobs_sync(ctx), llm.next_token_logprobs_uncached(ctx), "a row after a failed burst"
    )


def _derived_atol(llm: Any, prompt: Sequence[int]) -> float:
    from genlm_core.testing.tolerance import row_atol, row_magnitude

    return row_atol(llm, row_magnitude(llm.next_token_logprobs_uncached(list(prompt))), llm.dtype)


def _row_comparison(llm: Any, atol: float | None) -> Any:
    """``close(got, want, what)``: at ``atol`` when given, else at the derived bound."""
    from genlm_core.testing.tolerance import assert_rows_close, assert_within, model_shape, row_diff

    if atol is not None:

        def close(got: Any, want: Any, what: str) -> None:
            assert_within(row_diff(got, want, what), atol, what)

        return close
    shape = model_shape(llm)

    def derived(got: Any, want: Any, what: str) -> None:
        assert_rows_close(got, want, shape, dtype=llm.dtype, what=what)

    return derived


def check_decode_batches(
    llm: Any, prompt: Sequence[int], *, atol: float | None = None, n: int = 10, max_tokens: int = 9
) -> None:
    """An engine's own decode step (decode batches kept between steps): it resumes kept
    batches; where no prefix was evicted it runs exactly the tokens the step loop runs (one
    per distinct context a step) and leaves every row's KV in the prefix cache when the
    burst ends (a next-token call on each particle then computes one token); and, first,
    :func:`check_decode_rows`. Raises AssertionError."""

    def engine() -> dict[str, Any]:
        return dict(llm.stats().get("engine", {}))

    # the rows first: a wrong row is the first thing to report
    check_decode_rows(llm, prompt, atol=atol, n=n, max_tokens=max_tokens)
    computed = []
    program = None
    evicted = _evictions(llm)
    before = engine()
    for run in (run_steps, run_burst):
        llm.clear_cache()
        start = engine().get("tokens_computed", 0)
        program = SMCProgram(prompt, llm.eos_token_ids, n=n, max_tokens=max_tokens, seed=4)
        result = run(llm, program)
        computed.append(engine().get("tokens_computed", 0) - start)
    after = engine()
    if not after.get("decode_batches_resumed", 0) > before.get("decode_batches_resumed", 0):
        raise AssertionError(f"the burst resumed no kept batch ({after})")
    if after.get("decode_batches", 0):
        raise AssertionError(f"{after['decode_batches']} decode batches still held after the burst")
    if _evictions(llm) == evicted:
        if computed[0] != computed[1]:
            raise AssertionError(f"the burst computed {computed[1]} tokens, the step loop {computed[0]}")
        # each particle's last token was drawn, never run: its context minus it is cached
        ends = list(dict.fromkeys(tuple(program.prompt + t) for t in result.tokens))  # type: ignore[union-attr]
        start = engine()["tokens_computed"]
        llm.batch_next_token_logprobs_sync([list(c) for c in ends])
        ran = engine()["tokens_computed"] - start
        if ran != len(ends):
            raise AssertionError(
                f"after the burst, {len(ends)} particles' next rows ran {ran} tokens, not one each"
            )
