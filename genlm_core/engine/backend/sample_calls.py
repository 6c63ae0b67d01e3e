"""Sampling: the checks and the clamp to the context limit, then the engine's sampler
(capability ``"sample"``, concurrent calls batched into one engine call) or draws from
the backend's own rows. A part of :class:`~genlm_core.engine.backend.BaseLogprobBackend`
(its ``sample_calls``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from genlm_core.engine.contexts import Context
from genlm_core.engine.contract import SampleRequest
from genlm_core.engine.sampling import draw_tokens, draw_tokens_sync, sampling_temperature

if TYPE_CHECKING:  # pragma: no cover
    from genlm_core.engine.backend.logprob_calls import LogprobCalls
    from genlm_core.engine.batching import AutoBatcher

__all__ = ["SampleCalls"]


class SampleCalls:
    """``sample``, ``sample_sync``, ``batch_sample`` and the checked request they share.

    Args:
        logprob_calls: with no sampler, gives the rows drawn from.
        sampler: the engine's sampler, batched (None: draws from the rows).
        validate: checks every prompt and context first: the backend's ``validate``.
        context_limit: the longest context accepted, read at each request (None: no
            limit): what ``max_tokens`` is clamped to.
        eos_token_ids: the EOS ids a request without its own stops at.
        vocab_size: the vocabulary's size (each request's row width).
    """

    def __init__(
        self,
        logprob_calls: LogprobCalls,
        sampler: AutoBatcher[SampleRequest, list[int]] | None,
        *,
        validate: Callable[[Any], Context],
        context_limit: Callable[[], int | None],
        eos_token_ids: Sequence[int],
        vocab_size: int,
    ) -> None:
        self.logprob_calls = logprob_calls
        self.sampler = sampler
        self.validate = validate
        self.context_limit = context_limit
        self.eos_token_ids = eos_token_ids
        self.vocab_size = vocab_size

    def sample_request(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> SampleRequest:
        """A checked sampling request: the prompt validated, the arguments checked, the EOS
        ids resolved (None: :attr:`eos_token_ids`) and ``max_tokens`` clamped to the room the
        context limit leaves (the last token drawn is scored at a context of
        ``max_context_length`` tokens)."""
        ctx = self.validate(prompt_token_ids)
        max_tokens, temperature, eos = self._check_sample_args(max_tokens, temperature, eos_token_ids)
        limit = self.context_limit()
        if limit is not None:
            max_tokens = max(0, min(max_tokens, limit + 1 - len(ctx)))
        return SampleRequest(
            ctx, max_tokens, frozenset(eos), temperature, None if seed is None else int(seed), self.vocab_size
        )

    async def sample(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[int]:
        """Sample up to ``max_tokens`` tokens; stops before any token in ``eos_token_ids``.

        ``seed`` makes the draw reproducible. ``temperature`` must be a finite real number
        >= 0 (else ``ValueError``; ``TypeError`` for no number); ``0`` is greedy (the
        argmax), and so is any temperature below
        :data:`~genlm_core.engine.sampling.MIN_TEMPERATURE` (1e-30): dividing float32 scores
        by one overflows, and greedy is the distribution's limit there. A temperature above
        float32's largest value (:data:`~genlm_core.engine.sampling.MAX_TEMPERATURE`) draws as
        that value does (uniformly over the tokens with a finite score). An engine's own
        sampler gets the temperature so resolved, and ``/v1/sample`` calls this method: the
        same draws in process and on a server.

        The EOS token itself is not included in the result. An engine with a sampler of its
        own draws (concurrent calls batched into one engine call); otherwise each token is
        drawn from the backend's own rows.
        """
        return await self.run_sample(
            self.sample_request(prompt_token_ids, max_tokens, eos_token_ids, temperature, seed)
        )

    async def run_sample(self, req: SampleRequest) -> list[int]:
        """The tokens of a checked request (:meth:`sample_request`): the engine's sampler,
        or draws from the backend's rows. What :meth:`sample` runs; a caller that holds a
        request (a server, an actor) passes it on whole."""
        if req.max_tokens == 0:
            return []
        if self.sampler is not None:
            return list(await self.sampler.submit(req))
        calls = self.logprob_calls
        return await draw_tokens(req, lambda ctx: calls.shared_row(self.validate(ctx)))  # read only

    def sample_sync(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[int]:
        """Synchronous :meth:`sample`: the same tokens for the same arguments."""
        return self.run_sample_sync(
            self.sample_request(prompt_token_ids, max_tokens, eos_token_ids, temperature, seed)
        )

    def run_sample_sync(self, req: SampleRequest) -> list[int]:
        """Synchronous :meth:`run_sample`."""
        if req.max_tokens == 0:
            return []
        if self.sampler is not None:
            return list(self.sampler.run_sync([req])[0])
        calls = self.logprob_calls
        return draw_tokens_sync(req, lambda ctx: calls.shared_row_sync(self.validate(ctx)))

    async def batch_sample(
        self,
        prompt_token_ids_list: Sequence[Sequence[int]],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[list[int]]:
        """Sample for each prompt concurrently (batched). Prompt ``i`` uses ``seed + i``.

        Every prompt and argument is checked before any sampling starts."""
        requests = [  # every prompt and argument checked before any sampling starts
            self.sample_request(p, max_tokens, eos_token_ids, temperature, None if seed is None else seed + i)
            for i, p in enumerate(prompt_token_ids_list)
        ]
        return list(await asyncio.gather(*(self.run_sample(r) for r in requests)))

    def _check_sample_args(
        self, max_tokens: int, temperature: float, eos_token_ids: Sequence[int] | None
    ) -> tuple[int, float, set[int]]:
        """``max_tokens`` checked, the temperature resolved, the EOS ids (None: the default)."""
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
            raise ValueError(f"max_tokens must be a non-negative int, got {max_tokens!r}")
        temperature = sampling_temperature(temperature)
        eos = set(self.eos_token_ids if eos_token_ids is None else (int(e) for e in eos_token_ids))
        return max_tokens, temperature, eos
