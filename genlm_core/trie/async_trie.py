"""Asynchronous trie: concurrent ``await weight_sum(...)`` calls become one batch call.

Requests are grouped by ``(operation, mode)``: each group has its own
:class:`genlm_core.engine.batching.AutoBatcher`, whose batch function stacks the weight
vectors and calls ``batch_weight_sum`` / ``batch_weight_max`` of the wrapped trie in
a worker thread. A failing batch call raises in every caller of that batch (and the
batcher keeps serving); a request of the wrong shape fails alone, before batching,
and so do non-finite weights
(:class:`~genlm_core.trie.base.NonFiniteWeightsError`): the batch is then
recomputed row by row so every other caller still gets its result.

The methods take the same arguments as the synchronous tries
(``weight_sum(ws, mode, *, out=None, lazy=False)``) plus ``key``.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Hashable, Iterable
from typing import Any

from genlm_core.engine.batching import AutoBatcher
from genlm_core.token import Token
from genlm_core.trie.base import NonFiniteWeightsError
from genlm_core.trie.structure import EOSMode, coerce_mode

__all__ = ["AsyncTokenByteTrie"]


class AsyncTokenByteTrie:
    """Batching wrapper around any trie with ``batch_weight_sum``/``batch_weight_max``.

    Args:
        trie: the synchronous trie (``TokenByteTrie``, ``TorchTokenByteTrie``, ...).
        max_batch_size: most requests per batch call.
        timeout: seconds a request may wait for others (the batcher's deadline).
        run_in_thread: run the batch call in a worker thread (default).

    Unknown options raise a ``ConfigError`` naming them and the accepted ones
    (trie options such as ``eos_tokens`` go to :meth:`from_vocab`).

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
        **options: Any,
    ) -> None:
        if options:
            from genlm_core.config import reject_unknown_options

            reject_unknown_options(
                "AsyncTokenByteTrie", options, ["max_batch_size", "timeout", "run_in_thread"]
            )
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"max_batch_size must be an int >= 1, got {max_batch_size!r}")
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not 0 <= timeout < float("inf")
        ):
            raise ValueError(f"timeout must be a finite number of seconds >= 0, got {timeout!r}")
        self.trie = trie
        self.max_batch_size = int(max_batch_size)
        self.timeout = float(timeout)
        self.run_in_thread = bool(run_in_thread)
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
        """Build the trie (``implementation``: a registered trie's name,
        :func:`~genlm_core.trie.factory.trie_implementations`, or the best one for
        ``device``) and wrap it. ``kwargs`` (``eos_tokens``, ``atomic_tokens``, ...) go to
        the trie constructor."""
        from genlm_core.trie.factory import load_trie_class, make_trie

        if implementation is None:
            trie = make_trie(vocab, device=device, **kwargs)
        else:
            klass = load_trie_class(implementation)
            if device != "auto":  # the CPU trie refuses a device it cannot run on
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
            one = getattr(self.trie, name)
            fn = getattr(self.trie, f"batch_{name}", None)  # None: a Trie with one-row methods only
            extra = {"lazy": True} if op == "sum-lazy" and self._accepts_lazy else {}

            def each(requests: list[Any], one: Any = one, mode: EOSMode = mode) -> list[Any]:
                res: list[Any] = []
                for r in requests:
                    try:
                        res.append(one(r, mode, **extra))
                    except NonFiniteWeightsError as exc:  # fails that caller only
                        res.append(exc)
                return res

            def batch_fn(requests: list[Any], fn: Any = fn, mode: EOSMode = mode) -> list[Any]:
                if fn is None:
                    return each(requests)
                try:
                    out = fn(list(requests), mode, **extra)
                except NonFiniteWeightsError:
                    if len(requests) == 1:
                        raise
                    return each(requests)  # fail only the callers whose weights are bad
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

    @staticmethod
    def _write(res: Any, out: Any) -> Any:
        """Copy ``res`` into the caller's ``out`` (same checks as the sync tries)."""
        if out is None:
            return res
        shape, dtype = tuple(res.shape), res.dtype
        if tuple(getattr(out, "shape", ())) != shape or getattr(out, "dtype", None) != dtype:
            raise ValueError(f"out must have shape {shape} and dtype {dtype}, got {out!r:.80}")
        if hasattr(out, "copy_"):
            out.copy_(res)
        else:
            out[...] = res
        return out

    async def weight_sum(
        self,
        ws: Any,
        mode: Any = EOSMode.WITHOUT_EOS,
        *,
        out: Any = None,
        lazy: bool = False,
        key: Hashable | None = None,
    ) -> Any:
        """The trie's ``weight_sum(ws, mode, out=..., lazy=...)``, batched with
        concurrent calls. ``key`` (optional, hashable) lets identical requests be
        computed once. ``lazy=True`` returns node masses computed on access when
        the wrapped trie can (:attr:`supports_lazy`; the CPU trie's
        :class:`~genlm_core.trie.node_masses.NodeMasses`), the eager result
        otherwise; ``np.asarray`` of a lazy result computes every node."""
        self._check(ws)
        m = coerce_mode(mode)
        if not isinstance(lazy, bool):
            raise TypeError(f"lazy must be True or False, got {lazy!r}")
        if lazy and out is not None:
            raise ValueError("out= cannot be used with lazy=True (nothing is written out)")
        res = await self._batcher("sum-lazy" if lazy else "sum", m).submit(ws, key=key)
        return self._write(res, out)

    @functools.cached_property
    def _accepts_lazy(self) -> bool:
        try:
            return "lazy" in inspect.signature(self.trie.batch_weight_sum).parameters
        except (AttributeError, TypeError, ValueError):
            return False

    @property
    def supports_lazy(self) -> bool:
        """Whether ``weight_sum(..., lazy=True)`` really computes node masses on
        access (the wrapped trie's ``computes_lazily``); ``lazy=True`` is accepted
        either way."""
        return bool(getattr(self.trie, "computes_lazily", False)) and self._accepts_lazy

    async def weight_max(
        self, ws: Any, mode: Any = EOSMode.WITHOUT_EOS, *, out: Any = None, key: Hashable | None = None
    ) -> Any:
        """The trie's ``weight_max(ws, mode)``, batched with concurrent calls."""
        self._check(ws)
        m = coerce_mode(mode)
        res = await self._batcher("max", m).submit(ws, key=key)
        return self._write(res, out)

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
