"""Drawing tokens from next-token rows: the sampler of an engine without its own, and
:func:`draw_rows`, one draw per row of a batch (a burst control's sampler).

:meth:`~genlm_core.engine.backend.BaseLogprobBackend.sample` checks and clamps a
:class:`~genlm_core.engine.contract.SampleRequest`, then either hands it to the
engine's sampler or drives :func:`drawing` with the backend's rows (:func:`draw_tokens`,
async or sync).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any

from genlm_core.engine.contract import SampleRequest

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "MAX_TEMPERATURE",
    "MIN_TEMPERATURE",
    "check_temperature",
    "draw",
    "draw_rows",
    "draw_tokens",
    "draw_tokens_sync",
    "drawing",
    "sampling_temperature",
]

#: the smallest temperature drawn as one: any below it draws greedily, as 0 does. A draw
#: divides float32 scores by the temperature; a normalised row's top log-probability lies
#: in [-log(vocab), 0] (above -21 for any vocabulary under 10^9 tokens), so above this
#: bound the divided scores stay finite (float32 ends at 3.4e38), with room for an engine
#: sampler dividing raw logits. Below it they can overflow to -inf (a softmax of NaN), and
#: the distribution is its temperature-0 limit, the argmax, anyway: two scores more than
#: 1e-28 apart are over ``exp(100)`` times apart in probability there.
MIN_TEMPERATURE = 1e-30
#: the largest temperature used as given: float32's largest value. A larger one divides
#: every finite score to 0 as this one does (a uniform draw over the tokens with a finite
#: score), but would divide a -inf score into NaN.
MAX_TEMPERATURE = 3.4028234663852886e38


def check_temperature(temperature: Any) -> float:
    """``temperature`` as a float, or a ``ValueError``/``TypeError`` naming it and
    the accepted range: a finite real number >= 0 (0 = the most probable token)."""
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(
            f"temperature must be a real number >= 0 (0: greedy), got {type(temperature).__name__} "
            f"{temperature!r}"
        )
    t = float(temperature)
    if not (0 <= t < math.inf):
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature!r}")
    return t


def sampling_temperature(temperature: Any) -> float:
    """The temperature a draw uses for ``temperature`` (:func:`check_temperature`'s; 0:
    greedy): below :data:`MIN_TEMPERATURE` it is 0 (greedy), above :data:`MAX_TEMPERATURE`
    that bound."""
    value = check_temperature(temperature)
    if value < MIN_TEMPERATURE:
        return 0.0
    return min(value, MAX_TEMPERATURE)


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


async def draw_tokens(
    req: SampleRequest, row: Callable[[tuple[int, ...]], Awaitable["torch.Tensor"]]
) -> list[int]:
    """The tokens of ``req`` (:func:`drawing`) from the row ``await row(context)`` gives
    for each context (read only)."""
    steps = drawing(req)
    try:
        ctx = next(steps)
        while True:
            ctx = steps.send(await row(ctx))
    except StopIteration as done:
        return done.value


def draw_tokens_sync(req: SampleRequest, row: Callable[[tuple[int, ...]], "torch.Tensor"]) -> list[int]:
    """Synchronous :func:`draw_tokens`."""
    steps = drawing(req)
    try:
        ctx = next(steps)
        while True:
            ctx = steps.send(row(ctx))
    except StopIteration as done:
        return done.value


def draw(logprobs: "torch.Tensor", temperature: float, gen: "torch.Generator") -> int:
    import torch

    lp = logprobs.detach().to("cpu", torch.float32)
    if temperature == 0:
        return int(torch.argmax(lp).item())
    probs = torch.softmax(lp / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=gen).item())


#: tokens per block of :func:`draw_rows`' two-level running sum
_BLOCK = 256


def draw_rows(
    logprobs: "torch.Tensor", generator: "torch.Generator | None" = None, *, with_log_mass: bool = False
) -> "torch.Tensor | tuple[torch.Tensor, torch.Tensor]":
    """One token id per row of ``logprobs`` (``(rows, vocab)``, or one row ``(vocab,)``),
    drawn in proportion to ``exp(row)``: rows need not be normalised (a row plus a mask,
    a row over a temperature); ``-inf`` entries are never drawn.

    Inverse-CDF sampling, all rows at once, on the rows' device, one uniform per row from
    ``generator``: the row's mass in blocks of 256 tokens (float32 sums), a float64
    running sum over the blocks picks the block, a float64 running sum inside it the
    token (a float32 running sum over a 150k vocabulary would drift by ~1e-3 of the mass;
    here a token's probability is off by at most the float32 rounding of its block's
    sum, ~1e-7 of it). On a CPU it costs about a fifteenth of ``torch.multinomial`` on
    the same rows (16 of SmolLM2's next-token rows, 49,152 tokens, 2 threads of an AMD
    EPYC: 1.2 ms a row for ``multinomial``, 0.08 ms here; a float64 running sum over the
    whole row took 0.13 ms).

    Returns an int64 tensor ``(rows,)``; with ``with_log_mass`` also each row's
    ``logsumexp`` in float64 ``(rows,)`` (the log of the mass the draw was made from:
    the weight of a locally optimal SMC proposal), at no extra pass."""
    import torch

    lp = logprobs.detach()
    if lp.ndim == 1:
        lp = lp.unsqueeze(0)
    if lp.ndim != 2 or lp.shape[-1] == 0:
        raise ValueError(f"draw_rows: expected (rows, vocab) scores, got shape {tuple(logprobs.shape)}")
    top = lp.amax(dim=-1, keepdim=True)
    if not bool(torch.isfinite(top).all()):
        bad = int((~torch.isfinite(top.view(-1))).nonzero()[0])
        raise ValueError(
            f"draw_rows: row {bad} has no finite score (every token masked, or NaN/inf scores); "
            "leave at least one token with a finite log-probability"
        )
    R, V = lp.shape
    mass = (lp - top).exp()
    if mass.dtype != torch.float32 and mass.dtype != torch.float64:
        mass = mass.float()
    n_blocks = -(-V // _BLOCK)
    if n_blocks * _BLOCK != V:
        mass = torch.nn.functional.pad(mass, (0, n_blocks * _BLOCK - V))
    blocks = mass.view(R, n_blocks, _BLOCK)
    running = blocks.sum(dim=-1).to(torch.float64).cumsum_(dim=-1)  # (R, blocks)
    total = running[:, -1:]
    zero = torch.zeros_like(total)
    u = torch.rand(total.shape, generator=generator, dtype=torch.float64, device=_rand_device(generator, lp))
    u = torch.minimum(u.to(total.device) * total, torch.nextafter(total, zero))
    # the first block whose running sum passes u (it has mass), then the token inside it
    k = torch.searchsorted(running, u, right=True).clamp_(max=n_blocks - 1)
    before = torch.where(k > 0, running.gather(1, (k - 1).clamp(min=0)), zero)
    inner = blocks[torch.arange(R, device=k.device), k.view(-1)].to(torch.float64).cumsum_(dim=-1)
    rest = torch.minimum(u - before, torch.nextafter(inner[:, -1:], zero))
    j = torch.searchsorted(inner, rest, right=True).clamp_(max=_BLOCK - 1)
    ids = (k * _BLOCK + j).view(-1)
    if with_log_mass:
        return ids, (top.to(torch.float64) + total.log()).view(-1)
    return ids


def _rand_device(generator: "torch.Generator | None", like: "torch.Tensor") -> "torch.device":
    """Where the uniforms are drawn: the generator's device (a CPU generator for GPU rows
    draws on the CPU)."""
    return generator.device if generator is not None else like.device
