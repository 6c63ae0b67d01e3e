"""Autobatched sequential importance sampling (genlm-backend's README example), as a library
function: the main job, ``genlm sample`` and the SIS benchmark all run this code.

Each particle is a coroutine that asks the backend for its own next-token
distribution; ``asyncio.gather`` runs them together and the backend's AutoBatcher
turns the concurrent calls into batched forward passes.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any

from genlm_core.engine.progress import progress_bar

__all__ = ["Particle", "SISResult", "make_masking_function", "run_sis"]


def make_masking_function(llm: Any, max_token_length: int, max_tokens: int, eos_id: int):
    """Allow tokens of at most ``max_token_length`` bytes (and EOS); force EOS at ``max_tokens``."""
    import torch

    valid = torch.tensor(
        [tid == eos_id or 0 < len(tok) <= max_token_length for tid, tok in enumerate(llm.byte_vocab)],
        dtype=torch.float32,
    ).log()
    eos_only = torch.full((len(llm.byte_vocab),), -math.inf)
    eos_only[eos_id] = 0.0

    def mask(context: list[int]):
        return eos_only if len(context) >= max_tokens else valid

    return mask


@dataclass
class Particle:
    prompt_ids: list[int]
    context: list[int] = field(default_factory=list)
    log_weight: float = 0.0
    active: bool = True

    async def extend(self, llm: Any, mask: Any, eos_id: int, generator: Any) -> None:
        import torch

        logps = await llm.next_token_logprobs(self.prompt_ids + self.context)
        masked = logps.float().cpu() + mask(self.context)
        log_z = torch.logsumexp(masked, dim=-1)
        self.log_weight += float(log_z)
        tok = int(torch.multinomial((masked - log_z).exp(), 1, generator=generator).item())
        if tok == eos_id:
            self.active = False
        else:
            self.context.append(tok)


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

    eos_ids = list(getattr(llm, "eos_token_ids", []) or [])
    if not eos_ids:
        raise ValueError("the backend's tokenizer has no EOS token id; SIS needs one to stop")
    eos_id = eos_ids[0]
    mask = make_masking_function(llm, max_token_length, max_tokens, eos_id)
    prompt_ids = list(llm.tokenizer.encode(prompt, add_special_tokens=False))
    gen = torch.Generator().manual_seed(seed)
    particles = [Particle(prompt_ids) for _ in range(n_particles)]
    stats = llm.batcher.stats
    passes0 = stats.batches
    calls = 0
    bar = progress_bar(max_tokens + 1, "SIS steps", "step", show=progress)
    t0 = time.perf_counter()
    while any(p.active for p in particles):
        active = [p for p in particles if p.active]
        calls += len(active)
        await asyncio.gather(*(p.extend(llm, mask, eos_id, gen) for p in active))
        bar.update(1)
    wall = time.perf_counter() - t0
    bar.close()
    texts = [llm.tokenizer.decode(p.context) for p in particles]
    lw = torch.tensor([p.log_weight for p in particles], dtype=torch.float64)
    probs = torch.exp(lw - torch.logsumexp(lw, 0)).tolist()
    return SISResult(texts, probs, calls, stats.batches - passes0, wall, particles)
