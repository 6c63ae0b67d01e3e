"""Drawing tokens from next-token rows: the sampler of an engine without its own.

:meth:`~genlm_core.engine.backend.BaseLogprobBackend.sample` checks and clamps a
:class:`~genlm_core.engine.contract.SampleRequest`, then either hands it to the
engine's sampler or drives :func:`drawing` with the backend's rows (async or sync).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING

from genlm_core.engine.contract import SampleRequest

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["draw", "drawing"]


def drawing(req: SampleRequest) -> Generator[tuple[int, ...], "torch.Tensor", list[int]]:
    """The draws of ``req`` from rows: yields each context, is sent its row (read only),
    returns the tokens (stopping before an EOS token)."""
    import torch

    gen = torch.Generator()
    if req.seed is not None:
        gen.manual_seed(req.seed)
    else:
        gen.seed()
    ctx = list(req.prompt)
    out: list[int] = []
    for _ in range(req.max_tokens):
        logprobs = yield tuple(ctx)
        tok = draw(logprobs, req.temperature, gen)
        if tok in req.eos:
            break
        out.append(tok)
        ctx.append(tok)
    return out


def draw(logprobs: "torch.Tensor", temperature: float, gen: "torch.Generator") -> int:
    import torch

    lp = logprobs.detach().to("cpu", torch.float32)
    if temperature == 0:
        return int(torch.argmax(lp).item())
    probs = torch.softmax(lp / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=gen).item())
