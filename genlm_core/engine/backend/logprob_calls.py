"""The ``next_token_logprobs`` entry points: validation, the output cache and the batcher.

Contract: every tensor returned here belongs to its caller, who may modify it in place
(SMC code masks rows): a cache hit is cloned, a computed row is the caller's own (the
batcher copies it for every further caller of the same key), a batch is a fresh stack.
A part of :class:`~genlm_core.engine.backend.BaseLogprobBackend` (its ``logprob_calls``),
over its :class:`~genlm_core.engine.backend.rows.Rows`; :class:`CachingBatch` is the
batch function of the backend's batcher.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from genlm_core.engine.contexts import Context, run_distinct
from genlm_core.engine.memory import accelerator, moved_from_cpu, private_copy
from genlm_core.engine.row_checks import EngineOutputError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from genlm_core.engine.backend.lifecycle import Lifecycle
    from genlm_core.engine.backend.rows import Rows
    from genlm_core.engine.batching import AutoBatcher
    from genlm_core.protocols import RowCache

__all__ = ["CachingBatch", "LogprobCalls"]


class CachingBatch:
    """The batcher's batch function: the rows of distinct contexts, each caller's own, the
    readable ones kept in the output cache.

    Args:
        rows: computes and normalises the rows.
        output_cache: where computed rows are kept (None: no output cache).
    """

    def __init__(self, rows: Rows, output_cache: RowCache | None) -> None:
        self.rows = rows
        self.output_cache = output_cache

    def __call__(self, contexts: list[tuple[int, ...]]) -> list["torch.Tensor | EngineOutputError"]:
        # each caller gets a compact row of its own; the output cache adopts rows nobody else
        # holds (the normalised batch's, one block, no copy; on a GPU a copy of each made in
        # the callers' batched copy) where it can, else keeps a private copy of each; a row
        # no caller may read is its caller's error, never cached
        cache = self.output_cache
        adopt = getattr(cache, "adopt_many", None)  # the Cache protocol asks for put only
        for_cache: list[Any] | None = [] if adopt is not None else None
        results = self.rows.compute(contexts, for_cache=for_cache)
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


class LogprobCalls:
    """Validated contexts, cached and batched rows, and the public logprob calls.

    Args:
        rows: the rows computed outside the batcher (``next_token_logprobs_uncached``).
        batcher: batches the rows of concurrent calls (its batch function: a
            :class:`CachingBatch`), under ``engine_lock``.
        output_cache: the rows kept by context (None: no output cache).
        engine_lock: held by every call into the engine.
        lifecycle: whether the backend is open.
        validate: checks every context first: the backend's ``validate``
            (:mod:`~genlm_core.engine.backend.context_checks`).
        vocab_size: the vocabulary's size: each row's width.
        batch_size: the most distinct contexts of one batch (the synchronous path's chunks).
        rows_device: where the engine's rows come back (the device a cache hit goes back to).
    """

    def __init__(
        self,
        rows: Rows,
        batcher: AutoBatcher[tuple[int, ...], Any],
        output_cache: RowCache | None,
        engine_lock: threading.RLock,
        lifecycle: Lifecycle,
        *,
        validate: Callable[[Any], Context],
        vocab_size: int,
        batch_size: int,
        rows_device: Any,
    ) -> None:
        self.rows = rows
        self.batcher = batcher
        self.output_cache = output_cache
        self.engine_lock = engine_lock
        self.lifecycle = lifecycle
        self.validate = validate
        self.vocab_size = vocab_size
        self.batch_size = batch_size
        self.rows_device = rows_device
        #: where a row the output cache holds in host memory goes back to (None: the rows
        #: are on the CPU already): see :meth:`own_row`
        self.rows_accelerator = accelerator(rows_device)

    def _empty_rows(self) -> "torch.Tensor":
        """The answer to an empty batch: ``(0, vocab)`` float32 rows."""
        import torch

        self.lifecycle.check_open()
        return torch.empty((0, self.vocab_size), dtype=torch.float32, device=self.rows_device)

    def own_row(self, row: Any) -> Any:
        """A row the backend holds (an output cache's hit) as its caller's own: a private
        copy, on the device the backend's computed rows are on. A cache that keeps rows
        in host memory (``cache_to_cpu``) holds them on the CPU: they go back to the
        device, as genlm-backend's ``move_to_cpu`` cache handed them back, so that a hit
        and a computed row never come back on two devices."""
        if self.rows_accelerator is None:  # (a CPU backend: no call more on its hits)
            return private_copy(row)
        moved = moved_from_cpu(row, self.rows_accelerator)
        return private_copy(row) if moved is None else moved

    def _placed(self, rows: list[Any]) -> list[Any]:
        """``rows`` on the backend's rows device, for a stack (which copies them): a row a
        cache holds on the CPU moved where the rows are not, the others as they are."""
        device = self.rows_accelerator
        if device is None:
            return rows
        return [row if (moved := moved_from_cpu(row, device)) is None else moved for row in rows]

    async def shared_row(self, ctx: tuple[int, ...]) -> "torch.Tensor":
        """The row of a validated context; may be the cached object: never hand it out."""
        if self.output_cache is not None:
            hit = self.output_cache.get(ctx)
            if hit is not None:
                return hit
        return await self.batcher.submit(ctx, key=ctx)

    def shared_row_sync(self, ctx: tuple[int, ...]) -> "torch.Tensor":
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
        rows = dict(zip(unique, await asyncio.gather(*(self.shared_row(c) for c in unique))))
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
            run_distinct([c for c in contexts if c not in hits], self.batch_size, self._batched_rows)
        )
        return torch.stack(self._placed([hits[c] if c in hits else next(computed) for c in contexts]))

    def _batched_rows(self, chunks: list[list[tuple[int, ...]]]) -> list["torch.Tensor"]:
        """The rows of distinct contexts through the batcher, one batch per chunk (the sync path)."""
        return [row for chunk in chunks for row in self.batcher.run_sync(chunk)]

    def next_token_logprobs_uncached(self, token_ids: Sequence[int]) -> "torch.Tensor":
        """One full forward pass, bypassing the output cache and engine caches."""
        ctx = self.validate(token_ids)
        with self.engine_lock:
            return self.rows.compute_or_raise([ctx], uncached=True)[0]

    def reset_async_queries(self) -> None:
        """genlm-backend's name: fail and drop waiting requests. Not needed after errors."""
        self.batcher.reset()
