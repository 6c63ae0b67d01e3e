"""Asynchronous trie: concurrent ``await weight_sum(...)`` calls become one batch call.

Requests are grouped by ``(operation, mode)``: each group has its own
:class:`genlm_core.batching.AutoBatcher`, whose batch function stacks the weight
vectors and calls ``batch_weight_sum`` / ``batch_weight_max`` of the wrapped trie in
a worker thread. A failing batch call raises in every caller of that batch (and the
batcher keeps serving); a request of the wrong shape fails alone, before batching.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Hashable, Iterable
from typing import Any

from genlm_core.batching import AutoBatcher
from genlm_core.token import Token
from genlm_core.trie.structure import EOSMode, coerce_mode

__all__ = ["AsyncTokenByteTrie"]


class AsyncTokenByteTrie:
    """Batching wrapper around any trie with ``batch_weight_sum``/``batch_weight_max``.

    Args:
        trie: the synchronous trie (``TokenByteTrie``, ``TorchTokenByteTrie``, ...).
        max_batch_size: most requests per batch call.
        timeout: seconds a request may wait for others (the batcher's deadline).
        run_in_thread: run the batch call in a worker thread (default).

    Use as ``async with AsyncTokenByteTrie.from_vocab(vocab) as t: ...`` or call
    :meth:`cleanup` when done. Attributes of the wrapped trie (``root``,
    ``children``, ``num_nodes``, ...) are reachable on this object too, and as
    ``self.trie.<attr>`` (genlm-bytes' spelling).
    """

    def __init__(
        self,
        trie: Any,
        *,
        max_batch_size: int = 64,
        timeout: float = 0.001,
        run_in_thread: bool = True,
    ) -> None:
        self.trie = trie
        self.max_batch_size = int(max_batch_size)
        self.timeout = float(timeout)
        self.run_in_thread = run_in_thread
        self._batchers: dict[tuple[str, EOSMode], AutoBatcher] = {}
        self._closed = False

    @classmethod
    def from_vocab(
        cls,
        vocab: Iterable[bytes | Token],
        *,
        device: str = "auto",
        implementation: str | None = None,
        max_batch_size: int = 64,
        timeout: float = 0.001,
        **kwargs: Any,
    ) -> "AsyncTokenByteTrie":
        """Build the trie (``implementation`` name from ``TRIE_IMPLEMENTATIONS``, or
        the best one for ``device``) and wrap it. ``kwargs`` (``eos_tokens``,
        ``atomic_tokens``, ...) go to the trie constructor."""
        from genlm_core.trie import load_trie_class, make_trie

        if implementation is None:
            trie = make_trie(vocab, device=device, **kwargs)
        else:
            klass = load_trie_class(implementation)
            if implementation != "numpy" and device != "auto":
                kwargs["device"] = device
            trie = klass(vocab, **kwargs)
        return cls(trie, max_batch_size=max_batch_size, timeout=timeout)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "trie":
            raise AttributeError(name)
        return getattr(self.trie, name)

    # ------------------------------------------------------------------ batching
    def _batcher(self, op: str, mode: EOSMode) -> AutoBatcher:
        if self._closed:
            raise RuntimeError("AsyncTokenByteTrie is closed")
        key = (op, mode)
        b = self._batchers.get(key)
        if b is None or b.closed:
            name = "weight_sum" if op.startswith("sum") else "weight_max"
            fn = getattr(self.trie, f"batch_{name}", None)
            extra = {"lazy": True} if op == "sum-lazy" else {}
            if fn is None:  # a Trie with only the one-row methods: one call per request
                one = getattr(self.trie, name)

                def batch_fn(requests: list[Any], one: Any = one, mode: EOSMode = mode) -> list[Any]:
                    return [one(r, mode) for r in requests]

            else:

                def batch_fn(requests: list[Any], fn: Any = fn, mode: EOSMode = mode) -> list[Any]:
                    out = fn(list(requests), mode, **extra)
                    return [out[i] for i in range(len(requests))]

            b = AutoBatcher(
                batch_fn,
                batch_size=self.max_batch_size,
                timeout=self.timeout,
                run_in_thread=self.run_in_thread,
                name=f"trie-{op}-{mode.value}",
            )
            self._batchers[key] = b
        return b

    @functools.cached_property
    def _num_leaves(self) -> int:
        structure = getattr(self.trie, "structure", None)
        if structure is not None and hasattr(structure, "num_leaves"):
            return int(structure.num_leaves)
        return len(self.trie.decode)  # any Trie of the protocol with a vocabulary

    def _check(self, ws: Any) -> None:
        shape = tuple(getattr(ws, "shape", (len(ws),) if hasattr(ws, "__len__") else ()))
        n = self._num_leaves
        if shape != (n,):
            raise ValueError(f"weights must have shape ({n},), got {shape}")

    async def weight_sum(
        self, ws: Any, mode: Any = EOSMode.WITHOUT_EOS, *, key: Hashable | None = None, lazy: bool = False
    ) -> Any:
        """The trie's ``weight_sum(ws, mode)``, batched with concurrent calls.
        ``key`` (optional, hashable) lets identical requests be computed once;
        ``lazy=True`` returns node masses computed on access (CPU trie only, see
        :class:`~genlm_core.trie.node_masses.NodeMasses`)."""
        self._check(ws)
        m = coerce_mode(mode)
        if lazy and not self.supports_lazy:
            raise ValueError(
                f"{type(self.trie).__name__} has no lazy weight_sum; use lazy=False "
                "(or the CPU trie, genlm_core.trie.TokenByteTrie)"
            )
        return await self._batcher("sum-lazy" if lazy else "sum", m).submit(ws, key=key)

    @functools.cached_property
    def supports_lazy(self) -> bool:
        """Whether the wrapped trie has ``batch_weight_sum(..., lazy=True)``."""
        try:
            return "lazy" in inspect.signature(self.trie.batch_weight_sum).parameters
        except (AttributeError, TypeError, ValueError):
            return False

    async def weight_max(
        self, ws: Any, mode: Any = EOSMode.WITHOUT_EOS, *, key: Hashable | None = None
    ) -> Any:
        """The trie's ``weight_max(ws, mode)``, batched with concurrent calls."""
        self._check(ws)
        m = coerce_mode(mode)
        return await self._batcher("max", m).submit(ws, key=key)

    @property
    def stats(self) -> dict[str, Any]:
        """Batcher counters per ``"op/mode"`` group."""
        return {f"{op}/{m.value}": b.stats.as_dict() for (op, m), b in self._batchers.items()}

    # ------------------------------------------------------------------ lifecycle
    def _close_batchers(self) -> None:
        batchers, self._batchers = list(self._batchers.values()), {}
        for b in batchers:
            b.close()

    def shutdown(self) -> None:
        """Close every batcher for good (waiting callers get ``BatcherClosed``; later
        calls raise ``RuntimeError``)."""
        self._closed = True
        self._close_batchers()

    async def cleanup(self) -> None:
        """Stop the batchers (waiting callers get ``BatcherClosed``). As in
        genlm-backend and genlm-bytes, the trie stays usable: a later call starts
        new batchers."""
        self._close_batchers()

    async def __aenter__(self) -> "AsyncTokenByteTrie":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.cleanup()
