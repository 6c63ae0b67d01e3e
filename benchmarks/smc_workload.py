"""SMC with resampling: the README's SIS program with particles that die and duplicate.

Each step every active particle asks for its context's next-token distribution (one
``next_token_logprobs`` call; the particles run as asyncio coroutines: the loop is
``genlm_core.tools.sis.run_particles``, the one SIS program), draws its next token from the distribution restricted to the
allowed tokens, and multiplies its weight by the mass that restriction kept. The
constraint is a lipogram - no token holding a banned byte (``b"e"``), nor longer than
``max_token_length`` bytes; EOS always allowed and forced after ``max_tokens`` tokens -
so the kept mass differs from particle to particle, as a constrained program's does.
After every step, when the effective sample size falls below ``ess_threshold`` x N,
the particles are resampled (systematic by default, or multinomial) with the run's
seeded generator: particles die, others are duplicated, a copy takes its ancestor's
context and every weight becomes the average. Standard library and torch only (the SIS
loop through ``sis_workload.program``): the anchor venv (genlm-backend 0.3.1, no
genlm-core) runs it too.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

from sis_workload import NextLogprobs, figures, program

RESAMPLING = ("systematic", "multinomial")


def allowed_mask(byte_vocab: Sequence[bytes], eos_id: int, max_token_length: int, banned: bytes) -> Any:
    """0 for an allowed token, -inf otherwise (a float tensor over the vocabulary)."""
    import torch

    ok = [
        i == eos_id or (len(t) <= max_token_length and not any(b in t for b in banned))
        for i, t in enumerate(byte_vocab)
    ]
    return torch.tensor(ok, dtype=torch.float).log()


def resample(log_weights: Sequence[float], method: str, gen: Any) -> list[int]:
    """Ancestor indices of N new particles, drawn in proportion to the weights."""
    import torch

    w = torch.tensor(log_weights, dtype=torch.float64)
    p = (w - w.logsumexp(0)).exp()
    n = len(log_weights)
    if method == "multinomial":
        return [int(i) for i in torch.multinomial(p, n, replacement=True, generator=gen)]
    if method != "systematic":
        raise ValueError(f"resampling {method!r}: use one of {', '.join(RESAMPLING)}")
    u = (torch.rand((), dtype=torch.float64, generator=gen) + torch.arange(n, dtype=torch.float64)) / n
    cdf = p.cumsum(0)
    cdf[-1] = 1.0  # the last ancestor takes what rounding leaves
    return [int(i) for i in torch.searchsorted(cdf, u)]


def ess(log_weights: Sequence[float]) -> float:
    """Effective sample size ``(sum w)^2 / sum w^2`` of the particles' weights."""
    top = max(log_weights)
    w = [math.exp(x - top) for x in log_weights]
    return sum(w) ** 2 / sum(x * x for x in w)


async def smc(
    next_logprobs: NextLogprobs,
    byte_vocab: Sequence[bytes],
    eos_id: int,
    prompt_ids: list[int],
    *,
    n_particles: int = 16,
    max_tokens: int = 20,
    max_token_length: int = 10,
    banned: bytes = b"e",
    ess_threshold: float = 0.5,
    resampling: str = "systematic",
    seed: int = 0,
) -> dict[str, Any]:
    """The program above. Returns the particles, the number of calls and steps, how
    often it resampled and how many particles died, and the program's own time
    (``copy_s``: the rows to the CPU; ``sample_s``: masking, drawing and resampling)."""
    if resampling not in RESAMPLING:
        raise ValueError(f"resampling {resampling!r}: use one of {', '.join(RESAMPLING)}")
    sis = program()
    mask = sis.masking_function(
        allowed_mask(byte_vocab, eos_id, max_token_length, banned), eos_id, max_tokens
    )
    resamples = died = 0

    def resample_when_due(run: Any, gen: Any) -> None:
        nonlocal resamples, died
        t0 = time.perf_counter()
        particles = run.particles
        weights = [p.log_weight for p in particles]
        if any(p.active for p in particles) and ess(weights) < ess_threshold * n_particles:
            resamples += 1
            ancestors = resample(weights, resampling, gen)
            died += n_particles - len(set(ancestors))
            top = max(weights)
            mean = top + math.log(sum(math.exp(w - top) for w in weights) / n_particles)
            run.particles = [
                sis.Particle(prompt_ids, list(particles[a].context), mean, particles[a].active)
                for a in ancestors
            ]
        run.sample_s += time.perf_counter() - t0

    run = await sis.run_particles(
        next_logprobs,
        prompt_ids,
        mask,
        eos_id,
        n_particles=n_particles,
        seed=seed,
        after_step=resample_when_due,
    )
    out = figures(run)
    return {k: out[k] for k in ("particles", "calls", "steps")} | {
        "resamples": resamples,
        "died": died,
        "copy_s": out["copy_s"],
        "sample_s": out["sample_s"],
    }
