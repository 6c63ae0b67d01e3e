"""The fewest tokens a backend can compute for the contexts a program asked for.

A causal model's row for a context needs every position of that context computed once:
over a run, the distinct prefixes of every context asked for - the nodes of their prefix
tree. A prompt shared by every particle counts once, and so does the history a resampled
particle shares with its copies. :class:`PrefixTree` counts those nodes exactly from the
calls themselves (``wrap`` puts it in front of ``next_token_logprobs``); a backend's
``tokens_computed`` divided by it says how often a token was computed again.
Standard library only (the anchor venv runs it too).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any


class PrefixTree:
    """The prefix tree of the contexts :meth:`add` saw; :attr:`tokens` is its size.

    ``shared``: a prefix most contexts start with (the prompt); ``prompts``: several
    (many programs' prompts, one engine). Only a shortcut: a context starting with one
    walks the tree from that prompt's node, so a call costs its own suffix (plus a slice
    and a lookup of the prompt's ids), not the whole context; the count is the same
    either way."""

    def __init__(self, shared: Sequence[int] = (), prompts: Sequence[Sequence[int]] = ()) -> None:
        self.children: dict[tuple[int, int], int] = {}  # (node, token) -> child node; root 0
        self.shared = list(shared)
        self._shared_tuple = tuple(self.shared)
        self._shared_node: int | None = None
        # the other prompts by length: their ids -> their node (None until first walked)
        self._prompts: dict[int, dict[tuple[int, ...], int | None]] = {}
        for p in prompts:
            self._prompts.setdefault(len(p), {})[tuple(int(t) for t in p)] = None
        self._prompts.pop(0, None)
        self.calls = 0
        self.own_s = 0.0  # time spent counting (the instrument's, not the program's)

    @property
    def tokens(self) -> int:
        """Distinct non-empty prefixes seen: the fewest tokens a backend can compute."""
        return len(self.children)

    def _walk(self, node: int, tokens: Sequence[int]) -> int:
        children = self.children
        for tok in tokens:
            key = (node, int(tok))
            child = children.get(key)
            if child is None:
                child = children[key] = len(children) + 1
            node = child
        return node

    def add(self, context: Sequence[int]) -> None:
        """Count ``context`` (each of its prefixes once over the tree's life)."""
        n = len(self.shared)
        prefix = self._shared_tuple if isinstance(context, tuple) else self.shared
        if n and len(context) >= n and context[:n] == prefix:
            if self._shared_node is None:
                self._shared_node = self._walk(0, self.shared)
            self._walk(self._shared_node, context[n:])
            return
        for m, nodes in self._prompts.items():
            if len(context) < m:
                continue
            head = tuple(context[:m])
            if head in nodes:
                node = nodes[head]
                if node is None:
                    node = nodes[head] = self._walk(0, head)
                self._walk(node, context[m:])
                return
        self._walk(0, context)

    def wrap(
        self,
        next_logprobs: Callable[[list[int]], Awaitable[Any]],
        on_call: Callable[[PrefixTree], None] | None = None,
    ) -> Callable[[list[int]], Awaitable[Any]]:
        """``next_logprobs`` counting every context it is asked for, then calling
        ``on_call(self)`` (a progress report); both are timed in :attr:`own_s`."""

        async def call(token_ids: list[int]) -> Any:
            t0 = time.perf_counter()
            self.add(token_ids)
            self.calls += 1
            if on_call is not None:
                on_call(self)
            self.own_s += time.perf_counter() - t0
            return await next_logprobs(token_ids)

        return call
