"""Prefix cache: a token trie holding engine KV state per prefix.

Engine-agnostic: the KV payload is opaque; its size comes from a ``sizeof`` callable
(default :func:`genlm_core.engine.memory.sizeof`: the storage a payload keeps alive, so a
payload that views a larger buffer is charged for the buffer). Node ``n`` at depth
``d`` stands for the prefix ``tokens[:d]``; its ``kv`` covers exactly those ``d``
tokens.

KV payloads are evicted least-recently-used first when their total size exceeds
``budget`` (in the unit ``sizeof`` counts: bytes by default, tokens for an engine whose
payloads are handles on its own memory). Nodes that hold nothing and have no children are pruned, so
the trie's size follows what it holds.

Next-token logprobs are not kept here: a backend caches them in its one
:class:`~genlm_core.engine.caches.OutputCache` (one logprob budget, ``cache_bytes``).

A walk from the root costs a Python step per token: a particle's context of 4,000
tokens, looked up and stored once a step, would walk 8,000 nodes. The nodes stored last
(at most :data:`RECENT`) are also found by their whole context (a dict keyed by the
context's tuple: hashing it runs in C), so a context one token past one stored lately
finds its prefix, and is stored under it, without a walk.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from genlm_core import _deprecated
from genlm_core.engine.memory import sizeof as default_sizeof

__all__ = ["RECENT", "PrefixCache", "PrefixNode"]

#: the nodes stored last that are found by their context without a walk
RECENT = 1024


class PrefixNode:
    """One prefix. ``children`` maps the next token id to the child node."""

    __slots__ = ("token", "depth", "parent", "children", "kv", "kv_bytes", "key")

    def __init__(self, token: int | None, depth: int, parent: "PrefixNode | None") -> None:
        self.token = token
        self.depth = depth
        self.parent = parent
        self.children: dict[int, PrefixNode] = {}
        self.kv: Any = None
        self.kv_bytes = 0
        #: the context it is found by in the cache's recent index (None: not there)
        self.key: tuple[int, ...] | None = None

    def prefix(self) -> tuple[int, ...]:
        out: list[int] = []
        node: PrefixNode | None = self
        while node is not None and node.token is not None:
            out.append(node.token)
            node = node.parent
        return tuple(reversed(out))

    def __repr__(self) -> str:
        return f"PrefixNode(depth={self.depth}, kv={self.kv is not None})"


class PrefixCache:
    """Token trie of cached KV states, LRU-bounded by ``budget``.

    Thread-safe. ``budget=None`` means unbounded (not recommended).
    """

    def __init__(
        self,
        budget: int | None = 1 << 30,
        sizeof: Callable[[Any], int] = default_sizeof,
        on_evict_kv: Callable[[Any], None] | None = None,
        **deprecated: Any,
    ) -> None:
        old = _deprecated.renamed_keywords(
            "PrefixCache",
            deprecated,
            {"kv_budget_bytes": ("budget", "pass budget= (in the unit sizeof counts)")},
        )
        budget = old.get("budget", budget)
        if deprecated:
            raise TypeError(f"PrefixCache() got unexpected keyword arguments {sorted(deprecated)}")
        if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 0):
            raise ValueError(f"budget must be an int >= 0 or None, got {budget!r}")
        #: the bound on the payloads' total size, in the unit ``sizeof`` counts (None: none)
        self.budget = budget
        self.sizeof = sizeof
        #: called with each KV payload the cache drops (evicted, replaced or cleared), for
        #: engines whose payload is a handle on engine memory (a llama.cpp KV sequence)
        self.on_evict_kv = on_evict_kv
        self.root = PrefixNode(None, 0, None)
        self._kv_lru: OrderedDict[int, PrefixNode] = OrderedDict()
        #: the nodes stored last, by context (see the module doc)
        self._recent: OrderedDict[tuple[int, ...], PrefixNode] = OrderedDict()
        self.kv_bytes = 0
        self.kv_evictions = 0
        self.hits = 0
        self.misses = 0
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ lookups
    def _walk(self, tokens: Sequence[int]) -> list[PrefixNode]:
        """Nodes along ``tokens`` that exist: [root, node(t0), node(t0 t1), ...]."""
        path = [self.root]
        node = self.root
        for t in tokens:
            child = node.children.get(t)
            if child is None:
                break
            path.append(child)
            node = child
        return path

    def deepest_kv(self, tokens: Sequence[int], max_depth: int | None = None) -> tuple[int, Any]:
        """The deepest cached KV for a prefix of ``tokens`` (at most ``max_depth`` long).

        Returns ``(depth, kv)``; ``(0, None)`` when no prefix has KV. Marks it used.
        """
        limit = len(tokens) if max_depth is None else min(max_depth, len(tokens))
        with self._lock:
            if self._recent:
                key = tokens[:limit]
                near = self._recent.get(key if isinstance(key, tuple) else tuple(key))
                if near is not None and near.kv is not None:
                    self._kv_lru.move_to_end(id(near))
                    self.hits += 1
                    return near.depth, near.kv
            path = self._walk(tokens[:limit])
            for node in reversed(path):
                if node.kv is not None:
                    self._kv_lru.move_to_end(id(node))
                    self.hits += 1
                    return node.depth, node.kv
            self.misses += 1
            return 0, None

    # ------------------------------------------------------------------ updates
    def _node(self, tokens: Sequence[int]) -> PrefixNode:
        node = self.root
        for t in tokens:
            t = int(t)
            child = node.children.get(t)
            if child is None:
                child = PrefixNode(t, node.depth + 1, node)
                node.children[t] = child
            node = child
        return node

    def insert(self, tokens: Sequence[int], *, kv: Any) -> None:
        """Store the KV state of the prefix ``tokens`` (a payload over the whole budget is not kept)."""
        if kv is None:
            return
        size = self.sizeof(kv)
        if self.budget is not None and size > self.budget:
            return
        key = tokens if isinstance(tokens, tuple) else tuple(tokens)
        with self._lock:
            node = self._recent.get(key)
            if node is None:
                parent = self._recent.get(key[:-1]) if key else None
                if parent is not None:  # one token past a node stored lately: no walk
                    t = int(key[-1])
                    node = parent.children.get(t)
                    if node is None:
                        node = parent.children[t] = PrefixNode(t, parent.depth + 1, parent)
                else:
                    node = self._node(key)
                self._remember(key, node)
            if node.kv is not None and node.kv is not kv:
                self._dropped(node.kv)
            self.kv_bytes += size - node.kv_bytes
            node.kv, node.kv_bytes = kv, size
            self._kv_lru[id(node)] = node
            self._kv_lru.move_to_end(id(node))
            self._evict(protect=node)

    def _remember(self, key: tuple[int, ...], node: PrefixNode) -> None:
        if node.key is not None:
            self._recent.pop(node.key, None)
        node.key = key
        self._recent[key] = node
        while len(self._recent) > RECENT:
            _, old = self._recent.popitem(last=False)
            old.key = None

    def _evict(self, protect: PrefixNode | None = None) -> None:
        while self.budget is not None and self.kv_bytes > self.budget and self._kv_lru:
            _, node = self._kv_lru.popitem(last=False)
            self._drop_kv(node)
            if node is not protect:
                self._prune(node)

    def _drop_kv(self, node: PrefixNode) -> None:
        payload = node.kv
        self.kv_bytes -= node.kv_bytes
        node.kv, node.kv_bytes = None, 0
        self.kv_evictions += 1
        self._dropped(payload)

    def _dropped(self, payload: Any) -> None:
        if self.on_evict_kv is not None:
            self.on_evict_kv(payload)

    def evict_lru_kv(
        self,
        keep: Callable[[Any], bool] | None = None,
        leaves_first: bool = False,
        leaves_only: bool = False,
        rank: Callable[[Any], Any] | None = None,
    ) -> Any:
        """Evict the least recently used KV payload for which ``keep`` is not true (an
        engine short of another resource than the one ``budget`` counts, e.g. sequence
        slots or pool pages). Returns the payload (``on_evict_kv`` has been called with it),
        or ``None`` when none qualifies.

        ``leaves_first``: the least recently used payload of a leaf (a context no other
        cached context extends) that ``keep`` lets go, and only when there is none the least
        recently used of the others. For payloads that share their prefixes' memory
        (genlm-hf's page tables) a leaf's eviction frees its own pages while a context that
        others extend frees at most its last partial page, so a prompt many particles share
        stays while a particle can go instead; a branch goes leaf by leaf (an evicted leaf's
        emptied nodes are pruned, so its parent may become a leaf).
        ``leaves_only``: leaves or nothing (None when every leaf is kept): losing a context
        that others extend (the least recently used entry is often the shared prompt) makes
        every context that extends it compute it again.
        ``rank``: of those, the payload of the largest rank (any ordered value) goes first,
        least recently used among equal ranks: the core's lineage order
        (:mod:`genlm_core.engine.kv_resident`: stale first, then youngest)."""
        with self._lock:
            for leaves in (True,) if leaves_only else (True, False) if leaves_first else (False,):
                best: tuple[int, PrefixNode] | None = None
                best_rank: Any = None
                for key, node in self._kv_lru.items():
                    if leaves and node.children:
                        continue
                    if keep is not None and keep(node.kv):
                        continue
                    if rank is None:
                        best = key, node
                        break
                    r = rank(node.kv)
                    if best is None or r > best_rank:
                        best, best_rank = (key, node), r
                if best is not None:
                    key, node = best
                    payload = node.kv
                    del self._kv_lru[key]
                    self._drop_kv(node)
                    self._prune(node)
                    return payload
            return None

    def _prune(self, node: PrefixNode) -> None:
        while node.parent is not None and not node.children and node.kv is None:
            parent = node.parent
            parent.children.pop(node.token, None)  # type: ignore[arg-type]
            node.parent = None
            if node.key is not None:  # a detached node is found by no context
                self._recent.pop(node.key, None)
                node.key = None
            node = parent

    def clear(self) -> None:
        """Drop every KV payload."""
        with self._lock:
            dropped = [n.kv for n in self._kv_lru.values()]
            self.root = PrefixNode(None, 0, None)
            self._kv_lru.clear()
            for node in self._recent.values():
                node.key = None
            self._recent.clear()
            self.kv_bytes = 0
            for payload in dropped:
                self._dropped(payload)

    clear_kv = clear

    # ------------------------------------------------------------------ views
    def kv_prefixes(self) -> list[tuple[int, ...]]:
        """Prefixes holding KV, least recently used first."""
        with self._lock:
            return [n.prefix() for n in self._kv_lru.values()]

    def node_count(self) -> int:
        with self._lock:
            count, stack = 0, [self.root]
            while stack:
                n = stack.pop()
                count += 1
                stack.extend(n.children.values())
            return count

    def stats(self) -> dict[str, int]:
        return {
            "kv_entries": len(self._kv_lru),
            "kv_bytes": self.kv_bytes,
            "kv_evictions": self.kv_evictions,
            "hits": self.hits,
            "misses": self.misses,
        }
