"""Node masses of the core token-byte trie, computed in batches, with both EOS views.

:class:`MassTrie` wraps a core trie (``genlm_core.trie``). ``await masses(logprobs)``
turns one next-token distribution into the probability mass under every trie node;
concurrent calls (all candidates of a beam, all beams of a program) are merged into
one ``batch_weight_sum`` through the core :class:`~genlm_core.engine.batching.AutoBatcher`.

The trie is always asked for ``WITHOUT_EOS`` masses (one batch shape for every
state); the ``WITH_EOS`` view is derived exactly by moving the weight of the few
EOS tokens off their byte paths onto the EOS node (what the trie's ``WITH_EOS``
mode computes). So a state can change mode without another trie call.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from genlm_core.engine.batching import AutoBatcher
from genlm_core.trie.structure import EOS, EOSMode, coerce_mode

__all__ = ["MassTrie", "Masses", "EOSMode", "mass_trie_for"]


class Masses:
    """Linear masses of every node for one token distribution.

    ``get(node, with_eos)`` reads a node's mass in either EOS view; ``log(...)``
    its logarithm (``-inf`` for zero mass); ``log_many(nodes, with_eos)`` the
    same for an array of nodes. ``raw`` is the trie's ``WITHOUT_EOS`` result: an
    array, or lazy :class:`~genlm_core.trie.node_masses.NodeMasses` (CPU trie),
    read only at the nodes a state looks at.
    """

    __slots__ = ("raw", "_corr", "_zero", "_special")

    def __init__(
        self, raw: Any, corr: dict[int, float], zero: frozenset[int], special: np.ndarray | None = None
    ) -> None:
        self.raw = raw
        self._corr = corr
        self._zero = zero
        self._special = special  # bool per node: on an EOS path (needs get())

    def get(self, node: int, with_eos: bool) -> float:
        v = float(self.raw[node])
        if with_eos and self._corr:
            if node in self._zero:
                return 0.0
            c = self._corr.get(node)
            if c is not None:
                v = max(v - c, 0.0)
        return v

    def log(self, node: int, with_eos: bool) -> float:
        v = self.get(node, with_eos)
        return math.log(v) if v > 0 else -math.inf

    def log_many(self, nodes: np.ndarray, with_eos: bool) -> np.ndarray:
        """``log`` of each node of ``nodes`` (one vectorised read of ``raw``)."""
        vals = np.asarray(self.raw.take(nodes), dtype=np.float64)
        if with_eos and self._corr and self._special is not None:
            for i in np.flatnonzero(self._special[nodes]):
                vals[i] = self.get(int(nodes[i]), True)
        with np.errstate(divide="ignore"):
            out = np.log(np.maximum(vals, 0.0))
        return out


class MassTrie:
    """A core token-byte trie with batched, asynchronous mass computation.

    Args:
        vocab: the backend's ``byte_vocab``.
        eos_tokens: EOS tokens (``Token`` or bytes, as the core trie accepts).
        trie: a registered trie implementation name (``None``: the CPU trie, numba-accelerated when installed).
        batch_size: most distributions per trie call.
        timeout: seconds a request waits for others to join its batch.
    """

    def __init__(
        self,
        vocab: Sequence[bytes],
        eos_tokens: Sequence[bytes] = (),
        trie: str | None = None,
        batch_size: int = 128,
        timeout: float = 0.0005,
    ) -> None:
        if trie is None:
            from genlm_core.trie.cpu import TokenByteTrie

            # numba kernels when installed (genlm-vllm makes vLLM start alongside them)
            self.trie: Any = TokenByteTrie(vocab, eos_tokens=eos_tokens)
        else:
            from genlm_core.api import load_trie

            self.trie = load_trie(vocab, trie, eos_tokens=eos_tokens)
        t = self.trie
        self.root: int = t.root
        self.eos_node: int = t.eos_node
        self.children = t.children
        self.node2prefix = t.node2prefix
        self.decode = t.decode
        self.vocab_size = len(t.decode)
        self.eos_token_ids: list[int] = list(t.eos_token_ids)
        self._structure = getattr(t, "structure", None)
        self._eos_paths = [self._path(i) for i in self.eos_token_ids]
        self._zero = self._only_eos_nodes()
        self._special: np.ndarray | None = None
        if self.eos_token_ids:
            self._special = np.zeros(t.num_nodes, dtype=bool)
            self._special[[n for path in self._eos_paths for n in path] + [self.eos_node]] = True
        self._child_tables: dict[int, tuple[np.ndarray, np.ndarray, int | None]] = {}
        self._lazy = False
        self.async_trie: Any = None
        self._closed = False
        try:
            from genlm_core.trie.async_trie import AsyncTokenByteTrie
        except ImportError:  # pragma: no cover - older core: batch here with the core batcher
            self.batcher: AutoBatcher[Any, np.ndarray] | None = AutoBatcher(
                self._batch, batch_size=batch_size, timeout=timeout, run_in_thread=False, name="beam-trie"
            )
        else:
            self.batcher = None
            self.async_trie = AsyncTokenByteTrie(
                t, max_batch_size=batch_size, timeout=timeout, run_in_thread=False
            )
            # node masses read on access when the trie can (a state reads a few
            # hundred nodes of each distribution, not all of them)
            self._lazy = self.async_trie.supports_lazy

    # ------------------------------------------------------------------ structure
    def leaves(self, node: int) -> list[int]:
        """End-of-token leaves below ``node`` (several only for duplicate tokens)."""
        if self._structure is not None:
            return self._structure.leaves_of(node)
        leaf = self.children[node].get(None)
        return [] if leaf is None else [leaf]

    def token_index(self) -> tuple[dict[bytes, list[int]], int]:
        """``bytes -> token ids`` (several for duplicates) and the longest token's
        length; built once per trie (the lookahead of known bytes reads it)."""
        idx = getattr(self, "_token_index", None)
        if idx is None:
            index: dict[bytes, list[int]] = {}
            for i, tok in enumerate(self.decode):
                b = bytes(tok)
                if b:
                    index.setdefault(b, []).append(i)
            idx = self._token_index = (index, max(map(len, index), default=0))
        return idx

    def child_table(self, node: int) -> tuple[np.ndarray, np.ndarray, int | None]:
        """Byte edges out of ``node`` as arrays ``(bytes, child nodes)`` and the
        EOS child (``None`` if none); memoised per node."""
        tab = self._child_tables.get(node)
        if tab is None:
            keys: list[int] = []
            kids: list[int] = []
            eos_child = None
            for key, child in self.children[node].items():
                if isinstance(key, int) and 0 <= key < 256:
                    keys.append(key)
                    kids.append(child)
                elif key == EOS:
                    eos_child = child
            tab = (np.array(keys, dtype=np.intp), np.array(kids, dtype=np.intp), eos_child)
            self._child_tables[node] = tab
        return tab

    def token_id(self, leaf: int) -> int:
        return int(self.trie.leaf2token_id[leaf])

    def _path(self, token_id: int) -> list[int]:
        """The leaf of ``token_id`` and its ancestors below the root."""
        leaf = self.trie.word2leaf[int(token_id)] if self._structure else None
        if self._structure is None:
            raise RuntimeError("EOS tokens need a trie with a `structure` (genlm_core.trie)")
        parent = self._structure.parent
        out = [int(leaf)]
        node = int(parent[leaf])
        while node > 0 and node != self.root:
            out.append(node)
            node = int(parent[node])
        return out

    def _only_eos_nodes(self) -> frozenset[int]:
        """Nodes (on EOS paths) with no non-EOS token below them: exactly 0 in WITH_EOS."""
        if not self.eos_token_ids:
            return frozenset()
        s = self._structure
        below: dict[int, int] = {}
        for path in self._eos_paths:
            for node in path:
                below[node] = below.get(node, 0) + 1
        zero = set()
        for node, n_eos in below.items():
            total = 1 if node >= s.n_internal else int(s.end[node] - s.start[node])
            if total <= n_eos:
                zero.add(node)
        return frozenset(zero)

    # ------------------------------------------------------------------ masses
    def _batch(self, rows: list[Any]) -> list[np.ndarray]:
        import torch

        lp = torch.stack([r.detach().to("cpu", torch.float64) for r in rows])
        w = torch.exp(lp).numpy()
        out = self.trie.batch_weight_sum(w, EOSMode.WITHOUT_EOS)
        out = out.numpy() if hasattr(out, "numpy") else np.asarray(out)
        return [np.asarray(row, dtype=np.float64) for row in out]

    def _corrections(self, logprobs: Any) -> dict[int, float]:
        if not self.eos_token_ids:
            return {}
        corr: dict[int, float] = {}
        total = 0.0
        for tid, path in zip(self.eos_token_ids, self._eos_paths):
            w = math.exp(float(logprobs[tid]))
            total += w
            for node in path:
                corr[node] = corr.get(node, 0.0) + w
        corr[self.eos_node] = -total
        return corr

    @staticmethod
    def _weights(logprobs: Any) -> np.ndarray:
        import torch

        return torch.exp(logprobs.detach().to("cpu", torch.float64)).numpy()

    async def masses(self, logprobs: Any) -> Masses:
        """Masses of every node under the token distribution ``exp(logprobs)``
        (one ``WITHOUT_EOS`` trie row, batched with concurrent callers)."""
        if self.async_trie is not None:
            raw = await self.async_trie.weight_sum(
                self._weights(logprobs), EOSMode.WITHOUT_EOS, lazy=self._lazy
            )
            if not self._lazy:
                raw = np.asarray(raw.numpy() if hasattr(raw, "numpy") else raw, dtype=np.float64)
        else:  # pragma: no cover
            raw = await self.batcher.submit(logprobs)
        return Masses(raw, self._corrections(logprobs), self._zero, self._special)

    def masses_sync(self, logprobs: Any) -> Masses:
        if self._lazy:
            raw = self.trie.weight_sum(self._weights(logprobs), EOSMode.WITHOUT_EOS, lazy=True)
        else:
            raw = self.trie.weight_sum(self._weights(logprobs), EOSMode.WITHOUT_EOS)
            raw = np.asarray(raw.numpy() if hasattr(raw, "numpy") else raw, dtype=np.float64)
        return Masses(raw, self._corrections(logprobs), self._zero, self._special)

    @property
    def trie_batches(self) -> int:
        """Trie calls made so far (each one a batch of rows)."""
        if self.async_trie is not None:
            return int(sum(v["batches"] for v in self.async_trie.stats.values()))
        return self.batcher.stats.batches  # pragma: no cover

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        if self.async_trie is not None:
            self.async_trie.shutdown()
        else:  # pragma: no cover
            self.batcher.close()


_CACHE: "weakref.WeakKeyDictionary[Any, dict[tuple, MassTrie]]" = weakref.WeakKeyDictionary()


def mass_trie_for(llm: Any, eos_tokens: Sequence[bytes], trie: str | None = None) -> MassTrie:
    """The (cached) :class:`MassTrie` of a backend's vocabulary and EOS tokens."""
    key = (tuple(sorted(set(bytes(e) for e in eos_tokens))), trie)
    try:
        per = _CACHE.setdefault(llm, {})
    except TypeError:  # not weak-referenceable: no cache
        return MassTrie(llm.byte_vocab, eos_tokens, trie)
    mt = per.get(key)
    if mt is None or mt.closed:
        mt = MassTrie(llm.byte_vocab, eos_tokens, trie)
        per[key] = mt
    return mt


def mode_of(mode: Any) -> EOSMode:
    return coerce_mode(mode)
