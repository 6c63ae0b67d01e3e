"""`LazyTrieState`: one tokenization candidate of the beam.

A candidate is a committed token context (``lm``) and a position ``node`` in the
token-byte trie (the bytes read since the last token boundary). Its ``weight`` is
``log P(committed tokens) + log P(next token starts with the partial bytes)``.
The masses of the next-token distribution are computed lazily (``materialize``)
and shared by every state reached from it without a new token.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from genlm_core.bytes.dist import EOS, EOS_INDEX, EOT_INDEX, SIZE, ByteDistribution
from genlm_core.bytes.lm import StatefulTokenizedLM
from genlm_core.bytes.masses import EOSMode, Masses, MassTrie, mode_of

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["LazyTrieState", "TrieMode", "EOSMode"]

TrieMode = EOSMode


class LazyTrieState:
    """A candidate: token context + trie node + log weight (immutable).

    Args:
        lm: the committed token context.
        trie: the shared :class:`~genlm_core.bytes.masses.MassTrie`.
        node: current trie node (the root right after a token boundary).
        weight: log weight of the candidate.
        mode: ``EOSMode.WITH_EOS`` (EOS tokens end the sequence) or
            ``WITHOUT_EOS`` (EOS tokens are ordinary tokens, as in prefill).
        terminated: the candidate has consumed EOS.
        masses: shared node masses of ``lm``'s next-token distribution.
    """

    __slots__ = (
        "lm",
        "trie",
        "node",
        "weight",
        "mode",
        "terminated",
        "_masses",
        "_logprobs",
        "_extensions",
        "_logp_next",
    )

    def __init__(
        self,
        lm: StatefulTokenizedLM,
        trie: MassTrie,
        node: int,
        weight: float,
        mode: Any = EOSMode.WITH_EOS,
        terminated: bool = False,
        masses: Masses | None = None,
        logprobs: "torch.Tensor | None" = None,
    ) -> None:
        self.lm = lm
        self.trie = trie
        self.node = int(node)
        self.weight = float(weight)
        self.mode = mode_of(mode)
        self.terminated = terminated
        self._masses = masses
        self._logprobs = logprobs
        self._extensions: list[LazyTrieState] | None = None
        self._logp_next: ByteDistribution | None = None

    @classmethod
    def initial(
        cls, lm: StatefulTokenizedLM, trie: MassTrie, mode: Any = EOSMode.WITH_EOS
    ) -> "LazyTrieState":
        return cls(lm, trie, trie.root, 0.0, mode)

    # ------------------------------------------------------------------ views
    @property
    def with_eos(self) -> bool:
        return self.mode is EOSMode.WITH_EOS

    @property
    def materialized(self) -> bool:
        return self._masses is not None

    @property
    def masses(self) -> Masses:
        if self._masses is None:
            raise ValueError("the state is not materialized yet: `await state.materialize()`")
        return self._masses

    def log_mass(self, node: int) -> float:
        """Log mass of ``node`` under this state's distribution and mode."""
        return self.masses.log(node, self.with_eos)

    @property
    def partial(self) -> bytes:
        """Bytes read since the last token boundary."""
        return bytes(self.trie.node2prefix[self.node])

    @property
    def at_root(self) -> bool:
        return self.node == self.trie.root

    @property
    def base_weight(self) -> float:
        """Log probability of the committed tokens (the weight at the token's start)."""
        return self.weight - self.log_mass(self.node) + self.log_mass(self.trie.root)

    def actions(self) -> dict:
        """Edges out of the current node (bytes, ``None`` = EOT, ``257`` = EOS)."""
        return self.trie.children[self.node]

    def with_mode(self, mode: Any) -> "LazyTrieState":
        """The same candidate read in another EOS mode (exact: the weight of the
        partial token is recomputed from the shared masses, no model call)."""
        mode = mode_of(mode)
        if mode is self.mode:
            return self
        new = LazyTrieState(
            self.lm, self.trie, self.node, self.weight, mode, self.terminated, self._masses, self._logprobs
        )
        if self._masses is not None and not self.at_root and not self.terminated:
            new.weight = self.base_weight + new.log_mass(self.node) - new.log_mass(self.trie.root)
        return new

    # ------------------------------------------------------------------ moves
    def __lshift__(self, b: int) -> "LazyTrieState | None":
        """The candidate after reading byte ``b`` (``257`` = EOS, from the root
        only), or ``None`` if it cannot (no such edge, zero mass, terminated)."""
        if self.terminated:
            return None
        child = self.trie.children[self.node].get(b)
        if child is None:
            return None
        lm_child = self.log_mass(child)
        if lm_child == -math.inf:
            return None
        return LazyTrieState(
            self.lm,
            self.trie,
            child,
            self.weight + lm_child - self.log_mass(self.node),
            self.mode,
            b == EOS,
            self._masses,
            self._logprobs,
        )

    def extend(self) -> list["LazyTrieState"]:
        """Candidates after committing the current partial as a token (one per
        token with these bytes; none at the root or with zero mass). Memoized, so
        a beam's ``logp_next`` and ``<<`` share the same (materialized) states."""
        if self._extensions is None:
            out: list[LazyTrieState] = []
            if not self.terminated and not self.at_root:
                here = self.log_mass(self.node)
                for leaf in self.trie.leaves(self.node):
                    lw = self.log_mass(leaf)
                    if lw == -math.inf:
                        continue
                    out.append(
                        LazyTrieState(
                            self.lm << self.trie.token_id(leaf),
                            self.trie,
                            self.trie.root,
                            self.weight + lw - here,
                            self.mode,
                        )
                    )
            self._extensions = out
        return self._extensions

    @property
    def logp_next(self) -> ByteDistribution:
        """Log-probabilities of the next byte / EOT / EOS given this candidate
        (not normalised over the beam; sums to 1 up to empty tokens)."""
        if self._logp_next is None:
            logps = np.full(SIZE, -np.inf)
            here = self.log_mass(self.node)
            keys, kids, eos_child = self.trie.child_table(self.node)
            if kids.size:
                logps[keys] = self.masses.log_many(kids, self.with_eos) - here
            if eos_child is not None:
                logps[EOS_INDEX] = self.log_mass(eos_child) - here
            if not self.at_root:
                eot = sum(self.masses.get(leaf, self.with_eos) for leaf in self.trie.leaves(self.node))
                logps[EOT_INDEX] = (math.log(eot) if eot > 0 else -math.inf) - here
            self._logp_next = ByteDistribution(logps)
        return self._logp_next

    # ------------------------------------------------------------------ model calls
    async def fetch_logprobs(self) -> "torch.Tensor":
        if self._logprobs is None:
            self._logprobs = await self.lm.logp_next()
        return self._logprobs

    async def materialize(self) -> "LazyTrieState":
        """Compute the node masses (one model call and one trie call, both batched
        with concurrent callers). Returns ``self``."""
        if self._masses is None:
            lp = await self.fetch_logprobs()
            self._masses = await self.trie.masses(lp)
        return self

    def forget(self) -> None:
        """Drop memoized extensions (frees their masses)."""
        self._extensions = None
        self._logp_next = None

    async def cleanup(self) -> None:
        self.forget()

    def __repr__(self) -> str:
        tail = "<EOS>" if self.terminated else ""
        return f"{self.weight:.2f}: {self.lm!r}|{self.partial!r}{tail}"
