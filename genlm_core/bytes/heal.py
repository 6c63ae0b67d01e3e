"""Adaptive token healing: recover a tokenization the beam pruned away.

When no candidate can read the next byte, a candidate with partial bytes ``P``
backs off to a shorter token: it commits ``P[:k]`` (a whole token) and replays
``P[k:] + next_byte`` from a fresh token, committing again inside that suffix
when it gets stuck (an *intra-suffix split*). ``k`` goes from ``len(P)`` down to
``len(P) - max_backoff``; the first plan that reads every byte wins. The healed
candidate's weight is exactly the weight that tokenization has in an unpruned
beam: ``log P(committed) + log P(P[:k]) + ...`` (no approximation).
"""

from __future__ import annotations

import math

from genlm_core.bytes.state import LazyTrieState

__all__ = ["TokenHealer"]


class TokenHealer:
    """Finds a healed candidate for one state and one byte.

    Args:
        max_backoff: most bytes of the partial token to give back (None: all).
        max_splits: most commits inside the replayed suffix (None: no limit).
        verbose: print each attempt.
    """

    def __init__(
        self, max_backoff: int | None = None, max_splits: int | None = None, verbose: bool = False
    ) -> None:
        self.max_backoff = max_backoff
        self.max_splits = max_splits
        self.verbose = verbose

    def _log(self, msg: str) -> None:
        if self.verbose:
            print(f"[heal] {msg}")

    async def try_heal(self, state: LazyTrieState, next_byte: int) -> LazyTrieState | None:
        """A materialized candidate that has read ``state``'s bytes and ``next_byte``,
        or ``None``."""
        if state.terminated:
            return None
        await state.materialize()
        trie = state.trie
        partial = state.partial
        n = len(partial)
        base = state.base_weight
        lowest = 1 if self.max_backoff is None else max(1, n - self.max_backoff)
        # nodes along the partial token
        path = [trie.root]
        for b in partial:
            path.append(trie.children[path[-1]][b])
        self._log(f"next={next_byte!r} partial={partial!r} k={n}..{lowest}")
        for k in range(n, lowest - 1, -1):
            for leaf in trie.leaves(path[k]):
                lw = state.log_mass(leaf)
                if lw == -math.inf:
                    continue
                committed = LazyTrieState(
                    state.lm << trie.token_id(leaf),
                    trie,
                    trie.root,
                    base + lw - state.log_mass(trie.root),
                    state.mode,
                )
                healed = await self._replay(committed, [*partial[k:], next_byte], k)
                if healed is not None:
                    self._log(f"k={k}: healed, weight {healed.weight:.4f}")
                    return healed
        self._log("no healing found")
        return None

    async def _replay(self, current: LazyTrieState, data: list[int], k: int) -> LazyTrieState | None:
        splits = 0
        await current.materialize()
        for b in data:
            nxt = current << b
            if nxt is not None:
                current = nxt
                continue
            if self.max_splits is not None and splits >= self.max_splits:
                self._log(f"k={k}: max_splits={self.max_splits} reached at byte {b!r}")
                return None
            for ext in current.extend():
                await ext.materialize()
                nxt = ext << b
                if nxt is not None:
                    break
            else:
                self._log(f"k={k}: stuck at {current.partial!r} + {b!r}")
                return None
            splits += 1
            current = nxt
        return current
