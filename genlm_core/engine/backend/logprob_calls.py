"""The ``next_token_logprobs`` entry points: validation, the output cache and the batcher.

Contract: every tensor returned here belongs to its caller, who may modify it in place
(SMC code masks rows): a cache hit is cloned, a computed row is the caller's own (the
batcher copies it for every further caller of the same key), a batch is a fresh stack.
A mixin of :class:`~genlm_core.engine.backend.BaseLogprobBackend` (over
:class:`~genlm_core.engine.backend.rows.EngineRows`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from genlm_core.engine.backend.rows import EngineRows
from genlm_core.engine.contexts import Context, run_distinct
from genlm_core.engine.memory import moved_from_cpu, private_copy
from genlm_core.engine.row_checks import EngineOutputError
from genlm_core.engine.validation import validate_context

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["LogprobCalls"]


class LogprobCalls(EngineRows):
    """Validated contexts, cached and batched rows, and the public logprob calls."""

    def validate(self, token_ids: Any) -> Context:
        """The context as a tuple of ints, or a clear ``ValueError``."""
        if self._closed:
            raise RuntimeError(f"{self.backend_name}: the backend is closed")
        return validate_context(
            token_ids,
            self.vocab_size,
            self.max_context_length,
            recent=self._recent,
            limit_error=getattr(self.engine, "context_limit_error", None),
        )

    def _batch_fn(self, contexts: list[tuple[int, ...]]) -> list["torch.Tensor | EngineOutputError"]:
        # each caller gets a compact row of its own; the output cache adopts rows nobody else
        # holds (the normalised batch's, one block, no copy; on a GPU a copy of each made in
        # the callers' batched copy) where it can, else keeps a private copy of each; a row
        # no caller may read is its caller's error, never cached
        cache = self.output_cache
        adopt = getattr(cache, "adopt_many", None)  # the Cache protocol asks for put only
        for_cache: list[Any] | None = [] if adopt is not None else None
        results = self._rows(contexts, for_cache=for_cache)
        if cache is not None:
            good = [i for i, row in enumerate(results) if not isinstance(row, EngineOutputError)]
            if for_cache:
                adopt([(contexts[i], for_cache[i]) for i in good])  # type: ignore[misc]
                return results
            put_many = getattr(cache, "put_many", None)
            if put_many is not None:
                put_many([(contexts[i], results[i]) for i in good])
            else:
                for i in good:
                    cache.put(contexts[i], results[i])
        return results

    def _empty_rows(self) -> "torch.Tensor":
        """The answer to an empty batch: ``(0, vocab)`` float32 rows."""
        import torch

        if self._closed:
            raise RuntimeError(f"{self.backend_name}: the backend is closed")
        device = self.engine.rows_device if self.engine.rows_device is not None else self.device
        return torch.empty((0, self.vocab_size), dtype=torch.float32, device=device)

    def own_row(self, row: Any) -> Any:
        """A row the backend holds (an output cache's hit) as its caller's own: a private
        copy, on the device the backend's computed rows are on. A cache that keeps rows
        in host memory (``cache_to_cpu``) holds them on the CPU: they go back to the
        device, as genlm-backend's ``move_to_cpu`` cache handed them back, so that a hit
        and a computed row never come back on two devices."""
        if self._rows_accelerator is None:  # (a CPU backend: no call more on its hits)
            return private_copy(row)
        moved = moved_from_cpu(row, self._rows_accelerator)
        return private_copy(row) if moved is None else moved

    def _placed(self, rows: list[Any]) -> list[Any]:
        """``rows`` on the backend's rows device, for a stack (which copies them): a row a
        cache holds on the CPU moved where the rows are not, the others as they are."""
        device = self._rows_accelerator
        if device is None:
            return rows
        return [row if (moved := moved_from_cpu(row, device)) is None else moved for row in rows]

    async def _shared_row(self, ctx: tuple[int, ...]) -> "torch.Tensor":
        """The row of a validated context; may be the cached object: never hand it out."""
        if self.output_cache is not None:
            hit = self.output_cache.get(ctx)
            if hit is not None:
                return hit
        return await self.batcher.submit(ctx, key=ctx)

    def _shared_row_sync(self, ctx: tuple[int, ...]) -> "torch.Tensor":
        if self.output_cache is not None:
            hit = self.output_cache.get(ctx)
            if hit is not None:
                return hit
        return self.batcher.run_sync([ctx])[0]

    async def next_token_logprobs(self, token_ids: Sequence[int]) -> "torch.Tensor":
        """Normalised next-token log-probabilities (float32, length ``len(byte_vocab)``).

        The tensor is the caller's own: modifying it changes no later result.
        """
        ctx = self.validate(token_ids)
        if self.output_cache is not None:
            hit = self.output_cache.get(ctx)
            if hit is not None:
                return self.own_row(hit)
        return await self.batcher.submit(ctx, key=ctx)

    def next_token_logprobs_sync(self, token_ids: Sequence[int]) -> "torch.Tensor":
        ctx = self.validate(token_ids)
        if self.output_cache is not None:
            hit = self.output_cache.get(ctx)
            if hit is not None:
                return self.own_row(hit)
        return self.batcher.run_sync([ctx])[0]

    async def batch_next_token_logprobs(self, token_ids_list: Sequence[Sequence[int]]) -> "torch.Tensor":
        """One row per context, stacked (an empty list gives a ``(0, vocab)`` tensor)."""
        import torch

        contexts = [self.validate(t) for t in token_ids_list]  # fail before any work
        if not contexts:
            return self._empty_rows()
        unique = list(dict.fromkeys(contexts))
        rows = dict(zip(unique, await asyncio.gather(*(self._shared_row(c) for c in unique))))
        return torch.stack(self._placed([rows[c] for c in contexts]))

    def batch_next_token_logprobs_sync(self, token_ids_list: Sequence[Sequence[int]]) -> "torch.Tensor":
        """One row per context, stacked (an empty list gives a ``(0, vocab)`` tensor)."""
        import torch

        contexts = [self.validate(t) for t in token_ids_list]
        if not contexts:
            return self._empty_rows()
        hits: dict[tuple[int, ...], Any] = {}
        if self.output_cache is not None:
            for ctx in dict.fromkeys(contexts):
                hit = self.output_cache.get(ctx)
                if hit is not None:
                    hits[ctx] = hit
        computed = iter(
            run_distinct([c for c in contexts if c not in hits], self.config.batch_size, self._batched_rows)
        )
        return torch.stack(self._placed([hits[c] if c in hits else next(computed) for c in contexts]))

    def _batched_rows(self, chunks: list[list[tuple[int, ...]]]) -> list["torch.Tensor"]:
        """The rows of distinct contexts through the batcher, one batch per chunk (the sync path)."""
        return [row for chunk in chunks for row in self.batcher.run_sync(chunk)]

    def next_token_logprobs_uncached(self, token_ids: Sequence[int]) -> "torch.Tensor":
        """One full forward pass, bypassing the output cache and engine caches."""
        ctx = self.validate(token_ids)
        with self.engine_lock:
            return self._rows_or_raise([ctx], uncached=True)[0]

    def reset_async_queries(self) -> None:
        """genlm-backend's name: fail and drop waiting requests. Not needed after errors."""
        self.batcher.reset()
