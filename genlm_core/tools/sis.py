"""Autobatched sequential importance sampling (SIS), genlm-backend's README program: the
one implementation that ``genlm sample``, ``genlm demo`` and the benchmarks run.

Each particle is a coroutine that asks for its own next-token distribution;
``asyncio.gather`` runs a step's particles together, so a backend whose AutoBatcher
gathers concurrent calls runs one batched forward pass a step.

* :func:`run_particles` - the loop, over any ``next_logprobs(ids)`` coroutine function
  and token mask; ``after_step`` lets a program act between steps (the benchmarks' SMC
  resamples there). It counts the calls and steps and times the program's own work.
* :func:`run_sis` - the loop on a loaded backend: strings and normalised weights.

Only the standard library at import time (torch inside the functions): the benchmarks'
reference venv, genlm-backend 0.3.1 without genlm-core, loads this file by its path
(``benchmarks/sis_workload.py``) so that both sides of that comparison run this code.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Particle",
    "ParticleRun",
    "SISResult",
    "eos_mask",
    "length_mask",
    "make_masking_function",
    "masking_function",
    "run_particles",
    "run_sis",
]

#: a backend's ``next_token_logprobs``: token ids -> a row of log-probabilities
NextLogprobs = Callable[[list[int]], Awaitable[Any]]
#: a particle's context -> the additive mask of its next token (0 allowed, -inf not)
Mask = Callable[[list[int]], Any]


def length_mask(
    token_lengths: Sequence[int], eos_id: int, max_token_length: int, min_token_length: int = 1
) -> Any:
    """0 for EOS and every token of ``min_token_length`` to ``max_token_length`` bytes,
    -inf for the rest (a float32 tensor over the vocabulary). The library's SIS leaves out
    tokens of no bytes (they add nothing to the text); the benchmarks pass 0, as
    genlm-backend's README program does, to run the program their reference runs."""
    import torch

    ok = [i == eos_id or min_token_length <= n <= max_token_length for i, n in enumerate(token_lengths)]
    return torch.tensor(ok, dtype=torch.float32).log()


def eos_mask(size: int, eos_id: int) -> Any:
    """0 for EOS, -inf for every other of the ``size`` tokens: the mask that ends a particle."""
    import torch

    only = torch.full((size,), -math.inf)
    only[eos_id] = 0.0
    return only


def masking_function(valid: Any, eos_id: int, max_tokens: int) -> Mask:
    """``valid`` until a context holds ``max_tokens`` tokens, then EOS alone."""
    eos_only = eos_mask(len(valid), eos_id)

    def mask(context: list[int]) -> Any:
        return eos_only if len(context) >= max_tokens else valid

    return mask


def make_masking_function(llm: Any, max_token_length: int, max_tokens: int, eos_id: int) -> Mask:
    """Allow tokens of 1 to ``max_token_length`` bytes (and EOS); force EOS at ``max_tokens``."""
    valid = length_mask([len(tok) for tok in llm.byte_vocab], eos_id, max_token_length)
    return masking_function(valid, eos_id, max_tokens)


@dataclass
class ParticleRun:
    """A run's particles and its counts: next-token calls, steps, and the program's own
    time (``copy_s``: each row's ``.float().cpu()``, which on a GPU also waits for the
    device's queued work; ``sample_s``: masking, normalising, drawing, and ``after_step``
    when it adds its own time)."""

    particles: list[Particle]
    calls: int = 0
    steps: int = 0
    copy_s: float = 0.0
    sample_s: float = 0.0


@dataclass
class Particle:
    prompt_ids: list[int]
    context: list[int] = field(default_factory=list)
    log_weight: float = 0.0
    active: bool = True

    async def extend(
        self, source: Any, mask: Mask, eos_id: int, generator: Any, run: ParticleRun | None = None
    ) -> None:
        """One step: the next-token row of ``prompt_ids + context``, masked; the weight
        grows by the mass the mask kept, and a token drawn from the rest ends the particle
        (EOS) or extends it. ``source``: a backend (its ``next_token_logprobs`` is asked)
        or that coroutine function itself. ``run``: counts the call and times the work."""
        import torch

        next_logprobs = getattr(source, "next_token_logprobs", source)
        if run is not None:
            run.calls += 1
        logps = await next_logprobs(self.prompt_ids + self.context)
        t0 = time.perf_counter()
        row = logps.float().cpu()  # on a GPU: waits for the device's queued work too
        t1 = time.perf_counter()
        masked = row + mask(self.context)
        log_z = torch.logsumexp(masked, dim=-1)
        self.log_weight += float(log_z)
        tok = int(torch.multinomial((masked - log_z).exp(), 1, generator=generator).item())
        if tok == eos_id:
            self.active = False
        else:
            self.context.append(tok)
        if run is not None:
            run.copy_s += t1 - t0
            run.sample_s += time.perf_counter() - t1


async def run_particles(
    next_logprobs: NextLogprobs,
    prompt_ids: list[int],
    mask: Mask,
    eos_id: int,
    *,
    n_particles: int,
    seed: int,
    after_step: Callable[[ParticleRun, Any], None] | None = None,
) -> ParticleRun:
    """``n_particles`` particles from ``prompt_ids``, every active one extended each step
    (concurrently) until all have drawn EOS; one seeded generator draws every token.
    ``after_step(run, generator)``: called after each step; it may replace ``run.particles``."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    run = ParticleRun([Particle(prompt_ids) for _ in range(n_particles)])
    while any(p.active for p in run.particles):
        run.steps += 1
        await asyncio.gather(
            *[p.extend(next_logprobs, mask, eos_id, gen, run) for p in run.particles if p.active]
        )
        if after_step is not None:
            after_step(run, gen)
    return run


@dataclass
class SISResult:
    texts: list[str]
    probs: list[float]
    calls: int
    forward_passes: int
    wall_s: float
    particles: list[Particle]

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.wall_s if self.wall_s else 0.0

    def report(self) -> str:
        lines = ["Sequential importance sampling: strings and normalised probabilities"]
        for text, p in sorted(zip(self.texts, self.probs), key=lambda x: -x[1]):
            lines.append(f"  {p:7.4f}  {text!r}")
        lines.append(
            f"{self.calls} next-token calls batched into {self.forward_passes} forward passes "
            f"({self.calls / max(1, self.forward_passes):.1f} per pass), {self.wall_s:.2f} s, "
            f"{self.calls_per_s:.1f} calls/s"
        )
        return "\n".join(lines)


async def run_sis(
    llm: Any,
    prompt: str,
    n_particles: int = 10,
    max_tokens: int = 20,
    max_token_length: int = 10,
    seed: int = 0,
    progress: bool = False,
) -> SISResult:
    """Run autobatched SIS from ``prompt`` and return strings with normalised weights."""
    import torch

    from genlm_core.engine.progress import progress_bar

    eos_ids = list(getattr(llm, "eos_token_ids", []) or [])
    if not eos_ids:
        raise ValueError("the backend's tokenizer has no EOS token id; SIS needs one to stop")
    eos_id = eos_ids[0]
    mask = make_masking_function(llm, max_token_length, max_tokens, eos_id)
    prompt_ids = list(llm.tokenizer.encode(prompt, add_special_tokens=False))
    stats = llm.batcher.stats
    passes0 = stats.batches
    bar = progress_bar(max_tokens + 1, "SIS steps", "step", show=progress)
    t0 = time.perf_counter()
    run = await run_particles(
        llm.next_token_logprobs,
        prompt_ids,
        mask,
        eos_id,
        n_particles=n_particles,
        seed=seed,
        after_step=lambda _run, _gen: bar.update(1),
    )
    wall = time.perf_counter() - t0
    bar.close()
    particles = run.particles
    texts = [llm.tokenizer.decode(p.context) for p in particles]
    lw = torch.tensor([p.log_weight for p in particles], dtype=torch.float64)
    probs = torch.exp(lw - torch.logsumexp(lw, 0)).tolist()
    return SISResult(texts, probs, run.calls, stats.batches - passes0, wall, particles)
