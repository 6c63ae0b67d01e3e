"""One SMC program, two drivers: per-step calls and a burst (the parity gate's oracle,
:mod:`genlm_core.testing.burst`).

:class:`SMCProgram` is a small sequential Monte Carlo program over a backend's rows:
``n`` particles extend a prompt; each step proposes every live particle's token from
the model at ``temperature`` (one batched, seeded draw over the live rows in particle
order), weighs it by target/proposal (the target is the model at temperature 1), ends a
particle at EOS or after ``max_tokens`` tokens, and every ``resample_every`` steps
resamples the live particles (multinomial, seeded); with ``record`` it keeps every row it
drew from with its context (what the parity gate compares with the uncached model). It
knows nothing of how rows are computed:

* :func:`run_steps` drives it with ``batch_next_token_logprobs_sync`` over the live
  contexts (the step loop of every SMC library);
* :class:`ProgramControl` drives it as an :class:`~genlm_core.engine.burst.EngineControl`
  (genlm-backend's protocol: initial adds, draws, an abort for each ended particle, at
  a resampling point the abort of every live row and the re-add of the resampled
  prefixes with fresh handles, ``on_burst_end``), run by ``backend.run_burst``;
  :class:`LoopControl` / :func:`run_burst_on_loop` run it as genlm-control's burst loop
  does (draws on the program's event loop).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from genlm_core import _deprecated

__all__ = [
    "LoopControl",
    "ProgramControl",
    "SMCProgram",
    "SMCResult",
    "run_burst",
    "run_burst_on_loop",
    "run_steps",
]


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
    order; :meth:`advance` takes their rows, draws, weighs and resamples."""

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
        record: bool = False,
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
        #: with ``record``: ``(context, row)`` of every row the program drew from, in order
        #: (:meth:`result` hands them on as ``extra["seen"]``)
        self.seen: list[tuple[tuple[int, ...], Any]] | None = [] if record else None

    def live(self) -> list[int]:
        return [i for i in range(self.n) if not self.done[i]]

    def context(self, i: int) -> list[int]:
        return self.prompt + self.tokens[i]

    def advance(self, logprobs: Any, particles: Sequence[int]) -> tuple[list[int], list[int], bool]:
        """Advance ``particles`` by one token: draw each one's token from its row of
        ``logprobs`` (in that order), weigh it, end the particles at EOS or ``max_tokens``,
        and resample when due. Returns the drawn ids, the particles that ended, and whether
        the live ones were resampled."""
        import torch

        if self.seen is not None:
            self.seen += [
                (tuple(self.context(i)), row.detach().clone()) for i, row in zip(particles, logprobs)
            ]
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

    step = _deprecated.renamed_method("SMCProgram.step", "advance", "call advance()")

    def result(self, **extra: Any) -> SMCResult:
        w = self.log_w
        m = max(w)
        log_ml = m + math.log(sum(math.exp(x - m) for x in w)) - math.log(self.n)
        if self.seen is not None:
            extra = {"seen": self.seen, **extra}
        return SMCResult([list(t) for t in self.tokens], list(w), log_ml, self.rows, self.resamples, extra)


def run_steps(backend: Any, program: SMCProgram) -> SMCResult:
    """The program through per-step calls: one ``batch_next_token_logprobs_sync`` a step."""
    while live := program.live():
        rows = backend.batch_next_token_logprobs_sync([program.context(i) for i in live])
        program.advance(rows, live)
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

    def draw(self, logprobs: Any, handles: Sequence[int]) -> list[int]:
        particles = [self.particle[h] for h in handles]
        drawn, ended, resampled = self.program.advance(logprobs, particles)
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

    def draw(self, logprobs: Any, handles: Sequence[int]) -> Any:
        import asyncio

        import torch

        async def on_loop() -> list[int]:
            return ProgramControl.draw(self, logprobs, handles)

        drawn = asyncio.run_coroutine_threadsafe(on_loop(), self.loop).result()
        return torch.tensor(drawn, dtype=torch.int64, device=logprobs.device)


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
