"""Bursts: an SMC decode loop run in the backend, a control drawing every step's tokens
(:mod:`genlm_core.engine.burst`), through the engine's own decode step (capability
``"decode"``) or the core's (``"burst"``: the rows' distinct contexts through ``forward``).
A part of :class:`~genlm_core.engine.backend.BaseLogprobBackend` (its ``bursts``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from genlm_core.engine.contexts import Context, run_distinct
from genlm_core.engine.contract import BURST_CAPABILITIES

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from genlm_core.engine.backend.lifecycle import Lifecycle
    from genlm_core.engine.backend.rows import Rows
    from genlm_core.engine.burst import BurstReport, EngineControl
    from genlm_core.engine.contract import Engine
    from genlm_core.engine.kv_calls import KVCalls

__all__ = ["Bursts"]


class Bursts:
    """``run_burst``, ``burst`` and the decode steps they drive.

    Args:
        engine: its own decode step (capability ``"decode"``), or ``forward`` through ``rows``.
        rows: normalises a decode step's scores; computes the core's decode step's rows.
        engine_lock: held by every decode step and burst end.
        lifecycle: whether the backend is open.
        validate: checks the contexts a control hands over: the backend's ``validate``.
        context_limit: the longest context accepted, read at each burst (None: no limit).
        kv_calls: the kept batches of an engine declaring ``"kept_batches"`` (None: none).
        vocab_size: the vocabulary's size: each step's row width.
        batch_size: the most distinct contexts of one engine call (the core's decode step).
        name: the backend's name, for messages.
    """

    def __init__(
        self,
        engine: Engine,
        rows: Rows,
        engine_lock: threading.RLock,
        lifecycle: Lifecycle,
        *,
        validate: Callable[[Any], Context],
        context_limit: Callable[[], int | None],
        kv_calls: KVCalls | None,
        vocab_size: int,
        batch_size: int,
        name: str,
    ) -> None:
        self.engine = engine
        self.rows = rows
        self.engine_lock = engine_lock
        self.lifecycle = lifecycle
        self.validate = validate
        self.context_limit = context_limit
        self.kv_calls = kv_calls
        self.vocab_size = vocab_size
        self.batch_size = batch_size
        self.name = name

    @property
    def supports_burst(self) -> bool:
        """Whether :meth:`run_burst` runs here: the engine declares ``"burst"`` (the core's
        decode step) or ``"decode"`` (its own)."""
        return not BURST_CAPABILITIES.isdisjoint(self.engine.supports) and not self.lifecycle.closed

    def run_burst(self, control: "EngineControl", max_steps: int) -> "BurstReport":
        """Run an SMC decode loop in the backend, ``control`` drawing every step's tokens
        (genlm-backend's ``run_burst``; see :mod:`genlm_core.engine.burst`). Blocking: from
        async code use :meth:`burst`. Returns what it did (the drawn tokens per handle)."""
        from genlm_core.engine.burst import drive

        if not self.supports_burst:
            raise NotImplementedError(
                f"{self.name}: this backend runs no bursts (supports_burst is False); "
                "run the program's steps through next_token_logprobs instead"
            )
        return drive(
            control,
            max_steps,
            validate=self.validate,
            next_logprobs=self.step_logprobs,
            end_burst=self.end_burst,
            vocab_size=self.vocab_size,
            max_context_length=self.context_limit(),
        )

    async def burst(self, control: "EngineControl", max_steps: int) -> "BurstReport":
        """:meth:`run_burst` in a worker thread, so the event loop runs meanwhile (a control
        may hand its draws to coroutines on it)."""
        return await asyncio.to_thread(self.run_burst, control, max_steps)

    def step_logprobs(self, rows: Mapping[int, tuple[int, ...]], released: Collection[int]) -> "torch.Tensor":
        """A burst step's ``(rows, vocab)`` log-probabilities, under the engine lock: the
        engine's own decode step (capability ``"decode"``), else the core's, which computes
        the rows' distinct contexts as a step loop's call does (same contexts, same order,
        batches of ``batch_size``: :func:`~genlm_core.engine.contexts.run_distinct`), so
        both give the same numbers."""
        import torch

        with self.engine_lock:
            self.lifecycle.check_open()
            if "decode" in self.engine.supports:
                return self.rows.normalised_batch(
                    self.engine.decode_step(rows, released), list(rows.values())
                )
            if "kept_batches" in self.engine.supports and self.kv_calls is not None:
                step = self.kv_calls.decode_step(rows, released, self.batch_size)
                return self.rows.normalised_batch(step, list(rows.values()))
            return torch.stack(run_distinct(list(rows.values()), self.batch_size, self._chunk_rows))

    def _chunk_rows(self, chunks: list[list[tuple[int, ...]]]) -> list["torch.Tensor"]:
        """The rows of distinct contexts, one engine call per chunk (the core's decode step)."""
        return [row for chunk in chunks for row in self.rows.compute_or_raise(chunk)]

    def end_burst(self, handles: Collection[int]) -> None:
        """The burst ended: the engine's own decode step frees its rows' state."""
        if self.lifecycle.closed:
            return
        if "decode" in self.engine.supports:
            with self.engine_lock:
                self.engine.end_burst(handles)
        elif "kept_batches" in self.engine.supports and self.kv_calls is not None:
            with self.engine_lock:
                self.kv_calls.end_burst(handles)
