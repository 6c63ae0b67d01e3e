"""One SMC program, two drivers: per-step calls and a burst (the parity gate's oracle).

:class:`SMCProgram` is a small sequential Monte Carlo program over a backend's rows:
``n`` particles extend a prompt; each step proposes every live particle's token from
the model at ``temperature`` (one batched, seeded draw over the live rows in particle
order), weighs it by target/proposal (the target is the model at temperature 1), ends a
particle at EOS or after ``max_tokens`` tokens, and every ``resample_every`` steps
resamples the live particles (multinomial, seeded). It knows nothing of how rows are
computed:

* :func:`run_steps` drives it with ``batch_next_token_logprobs_sync`` over the live
  contexts (the step loop of every SMC library);
* :class:`ProgramControl` drives it as an :class:`~genlm_core.engine.burst.EngineControl`
  (genlm-backend's protocol: initial adds, draws, an abort for each ended particle, at
  a resampling point the abort of every live row and the re-add of the resampled
  prefixes with fresh handles, ``on_burst_end``), run by ``backend.run_burst``.

Both see the same rows in the same order when the backend computes them the same way,
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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "AdapterSwitchControl", "LoopControl", "ProgramControl", "RecordingControl", "SMCProgram", "SMCResult", "check_decode_batches",
    "check_decode_rows", "check_parity", "check_seam", "mean_gaps", "same_arithmetic", "run_burst", "run_burst_on_loop", "run_steps",
]  # fmt: skip


@dataclass
class SMCResult:
    """The particles' tokens and log weights, the log-marginal-likelihood estimate, and
    the number of rows the program drew from."""

    tokens: list[list[int]]
    log_weights: list[float]
    log_ml: float
    rows: int
    resamples: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class SMCProgram:
    """The program (see the module docstring). ``live()`` lists the live particles in
    order; :meth:`step` takes their rows and draws."""

    def __init__(
        self,
        prompt: Sequence[int],
        eos: Sequence[int],
        *,
        n: int = 6,
        max_tokens: int = 8,
        temperature: float = 1.3,
        resample_every: int = 3,
        seed: int = 0,
    ) -> None:
        import torch

        self.prompt = [int(t) for t in prompt]
        self.eos = {int(e) for e in eos}
        self.n, self.max_tokens = n, max_tokens
        self.temperature, self.resample_every = temperature, resample_every
        self.gen = torch.Generator().manual_seed(seed)
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.log_w = [0.0] * n
        self.done = [False] * n
        self.steps = 0
        self.rows = 0
        self.resamples = 0

    def live(self) -> list[int]:
        return [i for i in range(self.n) if not self.done[i]]

    def context(self, i: int) -> list[int]:
        return self.prompt + self.tokens[i]

    def step(self, logprobs: Any, particles: Sequence[int]) -> tuple[list[int], list[int], bool]:
        """Draw the tokens of ``particles`` (rows of ``logprobs`` in that order). Returns the
        drawn ids, the particles that ended, and whether the live ones were resampled."""
        import torch

        lp = logprobs.detach().to("cpu", torch.float64)
        q = torch.log_softmax(lp / self.temperature, dim=-1)
        drawn = torch.multinomial(q.exp(), 1, generator=self.gen).reshape(-1).tolist()
        ended: list[int] = []
        for row, (i, tok) in enumerate(zip(particles, drawn)):
            self.log_w[i] += float(lp[row, tok] - q[row, tok])
            if tok in self.eos:
                self.done[i] = True
            else:
                self.tokens[i].append(tok)
                if len(self.tokens[i]) >= self.max_tokens:
                    self.done[i] = True
            if self.done[i]:
                ended.append(i)
        self.steps += 1
        self.rows += len(particles)
        resampled = False
        alive = self.live()
        if self.resample_every and self.steps % self.resample_every == 0 and len(alive) > 1:
            w = torch.tensor([self.log_w[i] for i in alive], dtype=torch.float64)
            total = float(torch.logsumexp(w, 0))
            pick = torch.multinomial((w - total).exp(), len(alive), replacement=True, generator=self.gen)
            chosen = [list(self.tokens[alive[int(k)]]) for k in pick]
            for i, toks in zip(alive, chosen):
                self.tokens[i] = toks
                self.log_w[i] = total - math.log(len(alive))
            self.resamples += 1
            resampled = True
        return [int(t) for t in drawn], ended, resampled

    def result(self, **extra: Any) -> SMCResult:
        w = self.log_w
        m = max(w)
        log_ml = m + math.log(sum(math.exp(x - m) for x in w)) - math.log(self.n)
        return SMCResult([list(t) for t in self.tokens], list(w), log_ml, self.rows, self.resamples, extra)


def run_steps(backend: Any, program: SMCProgram) -> SMCResult:
    """The program through per-step calls: one ``batch_next_token_logprobs_sync`` a step."""
    while live := program.live():
        rows = backend.batch_next_token_logprobs_sync([program.context(i) for i in live])
        program.step(rows, live)
    return program.result()


class ProgramControl:
    """:class:`SMCProgram` as an EngineControl (genlm-backend's protocol)."""

    def __init__(self, program: SMCProgram) -> None:
        self.program = program
        self.particle: dict[int, int] = {}  # live handle -> particle
        self.adds: list[tuple[int, list[int], None]] = []
        self.aborts: list[int] = []
        self.next_handle = 0
        self.ended_bursts = 0
        for i in program.live():
            self._add(i)

    def _add(self, i: int) -> None:
        h = self.next_handle
        self.next_handle += 1
        self.particle[h] = i
        self.adds.append((h, self.program.context(i), None))

    def draw(self, logits: Any, handles: Sequence[int]) -> list[int]:
        particles = [self.particle[h] for h in handles]
        drawn, ended, resampled = self.program.step(logits, particles)
        by_particle = {i: h for h, i in self.particle.items()}
        for i in ended:
            h = by_particle[i]
            self.aborts.append(h)
            del self.particle[h]
        if resampled:  # every live row restarts from its resampled prefix
            for h in list(self.particle):
                self.aborts.append(h)
                del self.particle[h]
            for i in self.program.live():
                self._add(i)
        return drawn

    def drain_adds(self) -> list[tuple[int, list[int], None]]:
        out, self.adds = self.adds, []
        return out

    def drain_aborts(self) -> list[int]:
        out, self.aborts = self.aborts, []
        return out

    def on_burst_end(self) -> None:
        self.ended_bursts += 1


def run_burst(backend: Any, program: SMCProgram) -> SMCResult:
    """The program through one burst (``backend.run_burst``)."""
    control = ProgramControl(program)
    report = backend.run_burst(control, max_steps=program.max_tokens + 1)
    if control.ended_bursts != 1:
        raise AssertionError(f"on_burst_end was called {control.ended_bursts} times, not once")
    return program.result(report=report)


class LoopControl(ProgramControl):
    """A control as genlm-control's burst loop drives one: ``run_burst`` runs in a worker
    thread (``loop.run_in_executor``) and each draw is a coroutine run on the program's
    event loop (``asyncio.run_coroutine_threadsafe``)."""

    def __init__(self, program: SMCProgram, loop: Any) -> None:
        super().__init__(program)
        self.loop = loop

    def draw(self, logits: Any, handles: Sequence[int]) -> Any:
        import asyncio

        import torch

        async def on_loop() -> list[int]:
            return ProgramControl.draw(self, logits, handles)

        drawn = asyncio.run_coroutine_threadsafe(on_loop(), self.loop).result()
        return torch.tensor(drawn, dtype=torch.int64, device=logits.device)


async def run_burst_on_loop(llm: Any, program: SMCProgram) -> SMCResult:
    """The program through genlm-backend's seam as genlm-control uses it: ``llm.supports_burst``,
    then ``llm.run_burst(control=..., max_steps=...)`` in an executor, draws on the loop."""
    import asyncio

    if not llm.supports_burst:
        raise AssertionError(f"{type(llm).__name__} says supports_burst is False")
    loop = asyncio.get_running_loop()
    control = LoopControl(program, loop)
    report = await loop.run_in_executor(
        None, lambda: llm.run_burst(control=control, max_steps=program.max_tokens + 1)
    )
    if control.ended_bursts != 1:
        raise AssertionError(f"on_burst_end was called {control.ended_bursts} times, not once")
    return program.result(report=report)


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

    def draw(self, logits: Any, handles: Sequence[int]) -> list[int]:
        self.seen += [
            (tuple(self.program.context(self.particle[h])), r) for h, r in zip(handles, logits.clone())
        ]
        return super().draw(logits, handles)


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
    atol: float,
    seeds: Sequence[int] = (0, 1),
    gate_seeds: int = 20,
    n: int = 6,
    max_tokens: int = 6,
) -> dict[str, Any]:
    """The parity gate of bursts against steps (:class:`SMCProgram` with ``n`` particles).

    For each of ``seeds``, where neither run evicted a cached prefix: the
    same tokens, the same weights (to 1e-9 relative: the same floats summed in the same
    order), every drawn row reported, at least one abort/re-add cycle. Where they did not
    (the arithmetic differs, e.g. decode KV against a re-prefill): the anchors' criterion
    over ``gate_seeds`` seeds - the mean burst-minus-steps difference of the
    log-marginal-likelihood and of the mean length within three standard errors of 0,
    plus what float32 rounding can move them (``atol`` per row and step, ``max_tokens``
    steps). Returns what it checked; raises AssertionError naming what differs."""

    def make(seed: int) -> SMCProgram:
        return SMCProgram(prompt, llm.eos_token_ids, n=n, max_tokens=max_tokens, seed=seed)

    exact, differ = 0, 0
    arithmetic = same_arithmetic(llm, prompt)
    for seed in seeds:
        steps, burst, same = _paired(llm, make, seed)
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
            if abs(a - b) > 1e-9 * max(1.0, abs(a)):
                raise AssertionError(f"seed {seed}: weights {burst.log_weights} != {steps.log_weights}")
    out: dict[str, Any] = {"exact": exact, "statistical": differ, "same_arithmetic": arithmetic}
    if differ:
        pairs = [_paired(llm, make, 1000 + s)[:2] for s in range(gate_seeds)]
        gaps = mean_gaps(pairs)
        floor = {"log_ml": max_tokens * atol, "length": 0.0}
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


class RecordingControl(ProgramControl):
    """The program's control, recording every row it is handed with its context, and doing
    what a program may do between steps: ask the backend for another context's row (another
    caller), clear the backend's caches (``clear_at``: that step), or fail (``fail_at``)."""

    def __init__(
        self, llm: Any, program: SMCProgram, *, clear_at: int = -1, fail_at: int = -1, interleave: bool = True
    ) -> None:
        super().__init__(program)
        self.llm, self.clear_at, self.fail_at, self.interleave = llm, clear_at, fail_at, interleave
        self.seen: list[tuple[tuple[int, ...], Any]] = []
        self.other: list[tuple[list[int], Any]] = []
        self.calls = 0

    def draw(self, logits: Any, handles: Sequence[int]) -> list[int]:
        contexts = [tuple(self.program.context(self.particle[h])) for h in handles]
        self.seen += list(zip(contexts, logits.clone()))
        if self.interleave:
            other = self.program.prompt[:3] + [self.calls + 5]
            self.other.append((other, self.llm.next_token_logprobs_sync(other)))
        if self.calls == self.clear_at:
            self.llm.clear_cache()
        if self.calls == self.fail_at:
            raise RuntimeError("the control failed")
        self.calls += 1
        return super().draw(logits, handles)


class AdapterSwitchControl(ProgramControl):
    """The program's control, recording every row with its context and the adapter active
    when it was drawn, and switching the backend to LoRA adapter ``adapter`` after the
    program's step ``at`` (a burst's kept KV must not outlive the weights that made it)."""

    def __init__(self, llm: Any, program: SMCProgram, adapter: str, at: int = 3) -> None:
        super().__init__(program)
        self.llm, self.adapter, self.at = llm, adapter, at
        self.seen: list[tuple[list[int], Any, str | None]] = []

    def draw(self, logits: Any, handles: Sequence[int]) -> list[int]:
        for h, row in zip(handles, logits):
            self.seen.append((self.program.context(self.particle[h]), row.clone(), self.llm.active_lora))
        if self.program.steps == self.at:
            self.llm.set_lora(self.adapter)
        return super().draw(logits, handles)


def check_decode_rows(
    llm: Any, prompt: Sequence[int], *, atol: float, n: int = 10, max_tokens: int = 9, seed: int = 6
) -> None:
    """A burst with another caller's rows between its steps and a cache clear in its
    middle (what a LoRA switch does), and for an engine with ``decode_same_arithmetic``
    False first a burst alone: every row the control drew from is the uncached model's row
    of its context, and so is every row the other caller got. Then a control failing
    mid-burst: the error reaches the caller, the engine keeps no decode state
    (``decode_batches``, or an engine's live ``decode_sessions``), and the backend answers
    as before. Raises AssertionError."""

    def diff(a: Any, b: Any) -> float:
        return float((a.float().cpu() - b.float().cpu()).abs().max())

    # A burst alone first (nothing disturbs its kept state) where the engine's decode step
    # computes with other kernels than its forward: elsewhere check_parity's exact gate
    # already holds an undisturbed burst's rows to the step loop's, bit for bit.
    engine = getattr(llm, "engine", None)
    passes = (False,) if getattr(engine, "decode_same_arithmetic", True) else (True, False)
    for alone in passes:
        llm.clear_cache()
        program = SMCProgram(prompt, llm.eos_token_ids, n=n, max_tokens=max_tokens, seed=seed)
        control = RecordingControl(llm, program, clear_at=-1 if alone else 4, interleave=not alone)
        llm.run_burst(control, max_steps=max_tokens + 1)
        if not (control.calls > 6 and len(control.seen) > 4 * n):
            raise AssertionError(
                f"the burst ran {control.calls} steps, {len(control.seen)} rows: too short a check"
            )
        contexts = list(dict.fromkeys(c for c, _ in control.seen))
        ref = dict(zip(contexts, (llm.next_token_logprobs_uncached(list(c)) for c in contexts)))
        worst = max(diff(row, ref[c]) for c, row in control.seen)
        if worst > atol:
            raise AssertionError(
                f"a burst row{'' if alone else ' (other calls between steps)'} differs from the "
                f"uncached model's by {worst:.3g} > {atol}"
            )
    worst = max(diff(row, llm.next_token_logprobs_uncached(c)) for c, row in control.other)
    if worst > atol:
        raise AssertionError(f"another caller's row during the burst differs by {worst:.3g} > {atol}")
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
    worst = diff(llm.next_token_logprobs_sync(ctx), llm.next_token_logprobs_uncached(ctx))
    if worst > atol:
        raise AssertionError(f"after a failed burst a row differs by {worst:.3g} > {atol}")


def check_decode_batches(
    llm: Any, prompt: Sequence[int], *, atol: float, n: int = 10, max_tokens: int = 9
) -> None:
    """An engine's own decode step (decode batches kept between steps): it resumes kept
    batches; where no prefix was evicted it runs exactly the tokens the step loop runs (one
    per distinct context a step) and leaves every row's KV in the prefix cache when the
    burst ends (a next-token call on each particle then computes one token); and
    :func:`check_decode_rows`. Raises AssertionError."""

    def engine() -> dict[str, Any]:
        return dict(llm.stats().get("engine", {}))

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
    check_decode_rows(llm, prompt, atol=atol, n=n, max_tokens=max_tokens)
