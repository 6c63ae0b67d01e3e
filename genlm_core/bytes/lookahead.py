"""Lookahead for reading known bytes: score the tokenization lattice ahead of the beam.

When the bytes are known in advance (``prefill``, ``log_prefix_prob``,
``bits_per_byte``), every token context the beam can need later is a path through
the lattice of tokenizations of those bytes. Without lookahead the beam asks the
model for a context only at the byte where it commits that token, so a beam of K
candidates whose tokens end at different bytes pays about one forward pass per
byte, each with a handful of rows. On hardware where a forward costs about the
same for 2 or 16 rows (the weights are streamed once per pass), that is the whole
bill.

:class:`Lookahead` keeps a small lattice: the beam's committed contexts and, for
each scored context, the contexts one token further along the known bytes, with
their log weights (the parent's weight plus the token's log-probability, known
without a model call). Whenever the beam is about to need a context the lattice
has not scored (a miss, which costs a forward pass anyway), the same batch also
scores every plausible child of every scored, unexpanded lattice node within
``horizon`` bytes; plausible means within ``margin`` nats of the best path ending
at the same byte, at most ``width`` per byte. Each forward pass then advances
every plausible tokenization by a token instead of the beam by a byte.

It only warms the backend's output cache: the beam's own logic and results do not
change (its model calls return the cached rows), so the result is the same beam.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any

from genlm_core.bytes.lm import StatefulTokenizedLM

__all__ = ["Lookahead"]


@dataclass
class _Node:
    lm: StatefulTokenizedLM
    start: int  # byte position where the next token starts
    weight: float  # log P(committed tokens)
    # log-probabilities of the tokens that spell data[start:start+j], by token id
    along: dict[int, float] | None = None
    children: list[tuple[int, int]] = field(default_factory=list)  # (token id, end position)


class Lookahead:
    """Lattice lookahead over ``data`` for one beam run (see the module docstring).

    Args:
        token_index: ``(bytes -> token ids, longest token length)``, e.g.
            :meth:`~genlm_core.bytes.masses.MassTrie.token_index`.
        data: the bytes the beam will read.
        horizon: how many bytes past the beam's position the lattice may score.
        width: most children kept per end position and round.
        margin: children more than this many nats below the best path ending at
            the same byte are not scored.
        max_rows: most contexts per round (the backend's batch size: a round is
            one forward pass).
    """

    def __init__(
        self,
        token_index: tuple[dict[bytes, list[int]], int],
        data: bytes,
        *,
        horizon: int = 16,
        width: int = 16,
        margin: float = 12.0,
        max_rows: int = 32,
    ) -> None:
        self.data = data
        self.horizon = horizon
        self.width = width
        self.margin = margin
        self.max_rows = max_rows
        self._index, self._longest = token_index
        self._nodes: dict[tuple[int, ...], _Node] = {}
        self._frontier: list[_Node] = []  # scored, not yet expanded
        self._best_at: dict[int, float] = {}
        self.rounds = 0
        self.prefetched = 0

    # ------------------------------------------------------------------ lattice
    def _tokens_from(self, start: int) -> list[tuple[int, int]]:
        """(token id, end) for every token spelling ``data[start:end]``, end < len(data)."""
        out = []
        stop = min(len(self.data) - 1, start + self._longest)
        for end in range(start + 1, stop + 1):
            for t in self._index.get(self.data[start:end], ()):
                out.append((t, end))
        return out

    def _set_scores(self, node: _Node, logprobs: Any) -> None:
        pairs = self._tokens_from(node.start)
        node.children = pairs
        if not pairs:
            node.along = {}
            return
        ids = sorted({t for t, _ in pairs})
        vals = logprobs[ids]
        vals = vals.tolist() if hasattr(vals, "tolist") else list(vals)
        node.along = {t: float(v) for t, v in zip(ids, vals)}
        self._frontier.append(node)

    def _add(self, lm: StatefulTokenizedLM, start: int, weight: float) -> _Node:
        node = self._nodes.get(lm.context)
        if node is None:
            node = _Node(lm, start, weight)
            self._nodes[lm.context] = node
        return node

    def _forget_behind(self, pos: int) -> None:
        """Drop nodes no live candidate can still need (their token would be longer
        than any token in the vocabulary)."""
        cut = pos - self._longest - 1
        if cut <= 0 or len(self._nodes) < 256:
            return
        self._nodes = {k: n for k, n in self._nodes.items() if n.start >= cut}
        self._frontier = [n for n in self._frontier if n.start >= cut]
        self._best_at = {p: w for p, w in self._best_at.items() if p >= cut}

    # ------------------------------------------------------------------ one step
    async def before(self, states: Any, pos: int, needed: list[Any]) -> None:
        """Called with the beam's candidates before it reads ``data[pos]``.

        ``needed``: the extension candidates the beam will score at this byte. If
        the lattice already scored all of them, nothing runs; otherwise one batch
        scores them together with the lattice's frontier.
        """
        for s in states:
            if s.materialized and not s.terminated:
                node = self._add(s.lm, pos - len(s.partial), s.base_weight)
                if node.along is None and s._logprobs is not None:
                    self._set_scores(node, s._logprobs)
        misses = [e for e in needed if not self._scored(e.lm.context)]
        if not misses:
            return
        self.rounds += 1
        todo: dict[tuple[int, ...], _Node] = {}
        for e in misses:
            node = self._add(e.lm, pos, e.weight)
            todo[e.lm.context] = node
        # the frontier: scored, unexpanded nodes whose next token starts within reach
        cand: dict[int, list[tuple[float, StatefulTokenizedLM]]] = {}
        later = []
        for node in self._frontier:
            if node.start > pos + self.horizon:
                later.append(node)
                continue
            for t, end in node.children:
                lp = node.along.get(t, -math.inf)
                if lp == -math.inf:
                    continue
                w = node.weight + lp
                cand.setdefault(end, []).append((w, node.lm << t))
        self._frontier = later
        spec: list[tuple[float, int, StatefulTokenizedLM]] = []
        for end, items in cand.items():
            best = max(self._best_at.get(end, -math.inf), max(w for w, _ in items))
            self._best_at[end] = best
            items.sort(key=lambda x: -x[0])
            for w, lm in items[: self.width]:
                if w < best - self.margin:
                    break
                if lm.context not in self._nodes and lm.context not in todo:
                    spec.append((w, end, lm))
        # one forward pass: the misses first, then the likeliest speculative contexts
        room = max(0, self.max_rows - len(todo))
        for w, end, lm in sorted(spec, key=lambda x: -x[0])[:room]:
            todo[lm.context] = self._add(lm, end, w)
        fetch = [n for n in todo.values() if n.along is None]
        if fetch:
            model = fetch[0].lm.model
            rows = await asyncio.gather(*(model.next_token_logprobs(n.lm.context) for n in fetch))
            for n, lp in zip(fetch, rows):
                self._set_scores(n, lp)
            self.prefetched += len(fetch)
        self._forget_behind(pos)

    def _scored(self, ctx: tuple[int, ...]) -> bool:
        node = self._nodes.get(ctx)
        return node is not None and node.along is not None
