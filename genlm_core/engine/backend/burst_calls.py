"""Bursts: an SMC decode loop run in the backend, a control drawing every step's tokens
(:mod:`genlm_core.engine.burst`), through the engine's own decode step (capability
``"decode"``) or the core's (``"burst"``: the rows' distinct contexts through ``forward``).
A mixin of :class:`~genlm_core.engine.backend.BaseLogprobBackend`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

from genlm_core.engine.contexts import run_distinct
from genlm_core.engine.contract import BURST_CAPABILITIES

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from genlm_core.engine.burst import BurstReport, EngineControl

__all__ = ["BurstCalls"]


class BurstCalls:
    """``run_burst``, ``burst`` and the decode steps they drive."""

    @property
    def supports_burst(self) -> bool:
        """Whether :meth:`run_burst` runs here: the engine declares ``"burst"`` (the core's
        decode step) or ``"decode"`` (its own)."""
        return not BURST_CAPABILITIES.isdisjoint(self.engine.supports) and not self._closed

    def run_burst(self, control: "EngineControl", max_steps: int) -> "BurstReport":
        """Run an SMC decode loop in the backend, ``control`` drawing every step's tokens
        (genlm-backend's ``run_burst``; see :mod:`genlm_core.engine.burst`). Blocking: from
        async code use :meth:`burst`. Returns what it did (the drawn tokens per handle)."""
        from genlm_core.engine.burst import drive

        if not self.supports_burst:
            raise NotImplementedError(
                f"{self.backend_name}: this backend runs no bursts (supports_burst is False); "
                "run the program's steps through next_token_logprobs instead"
            )
        return drive(
            control,
            max_steps,
            validate=self.validate,
            next_logprobs=self._burst_logprobs,
            end_burst=self._end_burst,
            vocab_size=self.vocab_size,
            max_context_length=self.max_context_length,
        )

    async def burst(self, control: "EngineControl", max_steps: int) -> "BurstReport":
        """:meth:`run_burst` in a worker thread, so the event loop runs meanwhile (a control
        may hand its draws to coroutines on it)."""
        return await asyncio.to_thread(self.run_burst, control, max_steps)

    def _burst_logprobs(
        self, rows: Mapping[int, tuple[int, ...]], released: Collection[int]
    ) -> "torch.Tensor":
        """A burst step's ``(rows, vocab)`` log-probabilities, under the engine lock: the
        engine's own decode step (capability ``"decode"``), else the core's, which computes
        the rows' distinct contexts as a step loop's call does (same contexts, same order,
        batches of ``batch_size``: :func:`~genlm_core.engine.contexts.run_distinct`), so
        both give the same numbers."""
        import torch

        with self.engine_lock:
            if self._closed:
                raise RuntimeError(f"{self.backend_name}: the backend is closed")
            if "decode" in self.engine.supports:
                return self._normalised_batch(self.engine.decode_step(rows, released), list(rows.values()))
            if "kept_batches" in self.engine.supports and self.kv_calls is not None:
                step = self.kv_calls.decode_step(rows, released, self.config.batch_size)
                return self._normalised_batch(step, list(rows.values()))
            return torch.stack(run_distinct(list(rows.values()), self.config.batch_size, self._chunk_rows))

    def _chunk_rows(self, chunks: list[list[tuple[int, ...]]]) -> list["torch.Tensor"]:
        """The rows of distinct contexts, one engine call per chunk (the core's decode step)."""
        return [row for chunk in chunks for row in self._rows_or_raise(chunk)]

    def _end_burst(self, handles: Collection[int]) -> None:
        """The burst ended: the engine's own decode step frees its rows' state."""
        if self._closed:
            return
        if "decode" in self.engine.supports:
            with self.engine_lock:
                self.engine.end_burst(handles)
        elif "kept_batches" in self.engine.supports and self.kv_calls is not None:
            with self.engine_lock:
                self.kv_calls.end_burst(handles)
