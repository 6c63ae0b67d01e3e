"""Which kept contexts stay when an engine's KV budget is short: the shared prompt and a
fixed subset of particles (``KVPolicy.release="resident"``, the default).

Why least-recently-used release thrashes
----------------------------------------
Particles step in a round: each call asks for every particle's next context, and each
resumes from the context it asked for last. When the budget holds fewer particles than
the call runs, the call runs in parts, and a part makes room by releasing what it does
not read. Least recently used first, that is the particles of the *other* parts: the
first half of a call releases the second half's kept contexts, the second half then
recomputes them from the prompt and releases the first half's, and so on at every step,
so every particle recomputes its whole tail every step (and a plain LRU also releases the
shared prompt: it is found only through the particles, so it is the least recently
used entry). At 907 prompt tokens x 32 particles x 30 tokens genlm-hf under 64 MiB
computed 7.8x the minimum, under 48 MiB 8.2x: about ``P + N T (T - 1) / 2``, the cost of
keeping no particle at all, though the budget held about a third of them.

The rule here
-------------
Every kept context carries the *rank* of its lineage: a context computed by a row that
resumed from a kept context nobody extended before (a particle's own last context)
inherits that context's rank; any other (a particle recomputed from the prompt, a second
child of a resampled particle) takes a new rank, younger than every rank before it. So a
particle that stays keeps its rank from its first step on, and ranks order the particles
once. Then:

* room goes youngest rank first, leaves first (a context others extend, such as the
  prompt, goes only once nothing extends it: releasing it frees nothing they hold);
  before any of them, contexts of a lineage no call read for :data:`STALE_CALLS` calls
  (a particle that died at a resampling, a program that ended), least recently read
  first;
* a call's rows run oldest rank first when they do not fit together, and a part of
  several rows releases only contexts younger than its youngest resident row: a
  particle recomputed this call never pushes out an older particle's context; a single
  row that cannot fit otherwise releases the youngest context (the budget holds one
  particle fewer: the youngest resident one goes, for good);
* under a budget the cache counts itself (``KVPolicy.budget``), a context is kept only
  when younger ones make room for it (never keep what cannot stay).

The kept particles are the oldest ranks that fit, a fixed subset: it shrinks, youngest
first, as the particles' tails grow past the budget, and no particle returns to it.

The bound
---------
With a budget of ``B`` tokens of KV (kept contexts and the part running), a prompt of
``P`` tokens that ``N`` particles share, and ``T`` tokens each (calls at tails ``k = 0 ..
T - 1``: the prompt once, then each particle one token past its last context), the
minimum is ``P + N (T - 1)`` tokens. At step ``k`` a kept particle computes 1 token and
holds ``k``; a particle that is not kept is recomputed from the prompt, ``k`` tokens,
with ``k`` tokens of room while its row runs. So the particles kept at step ``k`` are

    R_k = N                           if P + N k <= B
    R_k = max(0, floor((B - P) / k) - 1)   otherwise (room for one recomputed row)

and the tokens computed are at most

    P + sum_{k=1}^{T-1} ( R_k + (N - R_k) k )
      <= P + (T - 1) R + (N - R) T (T - 1) / 2,     R = R_{T-1} = the fewest kept.

``R_k`` only grows with ``B``, so more budget never computes more, and it falls one
particle at a time as ``B`` shrinks: a budget one unit smaller keeps at most one particle
fewer at each step, at most ``T (T - 1) / 2`` tokens more in all (never a jump to
recomputing every particle). Below ``P + T`` (the prompt and one recomputed row) nothing
is kept past the prompt; a budget below one context is refused for that context (the
engine's limit: genlm-hf's ``kv_cache_bytes``, genlm-llamacpp's ``kv_cache_tokens``).

An engine whose memory comes in pages (genlm-hf: 16 tokens) counts units of pages: the
prompt holds ``ceil(P / 16)``, a particle its own copy of the prompt's partial last page
and its tail, ``ceil((P mod 16 + k) / 16)``, and so does a recomputed row (``page=16``
below; genlm-hf's room for a row is counted exactly,
``genlm_hf.pool.KVPool.pages_to_extend``). ``tests/test_kv_budget.py`` checks the bound
against a brute-force count over the calls at every budget, on tokens and on pages;
``benchmarks/bench_kv_budget_grid.py`` runs it over genlm-hf's pool accounting and
``benchmarks/results/long_prompt_kv_budget.md`` has the measured table.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["STALE_CALLS", "Lineages", "kept_particles", "sis_token_bound"]

Context = tuple[int, ...]


#: calls a lineage may go unread before its kept contexts count as stale (a particle
#: that died, or a program that ended): stale contexts go first, least recently read first
STALE_CALLS = 4


class Lineages:
    """The rank of every kept payload (by ``id``; forgotten when the cache drops it), which
    payloads a later context has extended already (``claimed``), and the last call that
    read each lineage (:meth:`begin_call`, :meth:`touch`)."""

    def __init__(self) -> None:
        self._rank: dict[int, int] = {}
        self._claimed: set[int] = set()
        self._shared: set[int] = set()  # payloads other lineages branched off
        self._next = 0
        self._call = 0
        #: rank -> [the last call that read the lineage, its kept payloads]
        self._lineage: dict[int, list[int]] = {}

    @property
    def next_rank(self) -> int:
        """The rank the next new lineage takes (younger than every rank given so far)."""
        return self._next

    def begin_call(self) -> None:
        self._call += 1

    def touch(self, payloads: Iterable[Any]) -> None:
        """The current call reads ``payloads`` (their lineages are live)."""
        for p in payloads:
            rank = self._rank.get(id(p))
            if rank is not None:
                self._lineage[rank][0] = self._call

    def rank(self, payload: Any) -> int:
        """The payload's rank (a payload the core did not rank: younger than all)."""
        return self._rank.get(id(payload), self._next)

    def stale(self, payload: Any) -> bool:
        """Whether no call read the payload's lineage for :data:`STALE_CALLS` calls."""
        rank = self._rank.get(id(payload))
        return rank is not None and self._call - self._lineage[rank][0] > STALE_CALLS

    def victim_key(self, payload: Any) -> tuple[int, int]:
        """The order kept payloads go in, largest first: stale ones (least recently read
        first), then the youngest lineage's."""
        rank = self._rank.get(id(payload))
        if rank is None:
            return (1, 0)
        last = self._lineage[rank][0]
        if self._call - last > STALE_CALLS:
            return (1, -last)
        return (0, rank)

    def priority(self, payload: Any, taken: set[int] | None = None) -> int | None:
        """The rank a row resuming from ``payload`` carries on (its lineage's), or None
        when it starts a new one: no payload, an unranked one, or one that a context has
        extended before (``taken``: payloads claimed earlier in the same ordering)."""
        if payload is None:
            return None
        key = id(payload)
        if key in self._claimed or key not in self._rank or (taken is not None and key in taken):
            return None
        if taken is not None:
            taken.add(key)
        return self._rank[key]

    def inherit(self, payload: Any) -> tuple[int, bool]:
        """The rank of the contexts a row resuming from ``payload`` computed, and whether
        they carry its lineage on: the payload's rank, which the row claims, or a new one
        (a row resuming from a payload another claimed branches off it: it is shared)."""
        rank = self.priority(payload)
        if rank is None:
            if payload is not None and id(payload) in self._rank:
                self._shared.add(id(payload))
            rank = self._next
            self._next += 1
            return rank, False
        self._claimed.add(id(payload))
        return rank, True

    def shared(self, payload: Any) -> bool:
        """Whether a lineage branched off ``payload``'s context (a prompt): the context
        that carries its own lineage on does not supersede it."""
        return id(payload) in self._shared

    def set(self, payload: Any, rank: int) -> None:
        """``payload`` is kept, of lineage ``rank`` (read by the current call)."""
        key = id(payload)
        if key in self._rank:
            self.forget(payload)
        self._rank[key] = rank
        entry = self._lineage.setdefault(rank, [self._call, 0])
        entry[0] = self._call
        entry[1] += 1

    def forget(self, payload: Any) -> None:
        """The cache dropped ``payload``."""
        key = id(payload)
        rank = self._rank.pop(key, None)
        self._claimed.discard(key)
        self._shared.discard(key)
        if rank is not None:
            entry = self._lineage[rank]
            entry[1] -= 1
            if entry[1] <= 0:
                del self._lineage[rank]

    def clear(self) -> None:
        self._rank.clear()
        self._claimed.clear()
        self._shared.clear()
        self._lineage.clear()

    def order(self, payloads: Sequence[Any]) -> list[int]:
        """Indices of rows resuming from ``payloads``, oldest lineage first (new lineages
        last, in their order)."""
        taken: set[int] = set()
        keys = []
        for i, p in enumerate(payloads):
            r = self.priority(p, taken)
            keys.append((0, r, i) if r is not None else (1, 0, i))
        return [i for *_, i in sorted(keys)]

    def youngest_resident(self, payloads: Iterable[Any], new_floor: int) -> int:
        """The youngest rank among rows resuming from ``payloads`` (a row starting a new
        lineage counts as ``new_floor - 1``: it may push out only lineages started since)."""
        taken: set[int] = set()
        out = -1
        for p in payloads:
            r = self.priority(p, taken)
            out = max(out, new_floor - 1 if r is None else r)
        return out


def _units(tokens: int, page: int) -> int:
    return -(-tokens // page)


def kept_particles(budget: int, prompt: int, particles: int, tail: int, page: int = 1) -> int:
    """``R_k`` of the module doc: the particles a budget of ``budget`` units keeps at tail
    ``tail`` (>= 1) beside a prompt of ``prompt`` tokens. ``page``: tokens a unit holds
    (genlm-hf: 16; the budget then counts pages): the prompt takes ``ceil(prompt / page)``
    units and a particle its own copy of the prompt's partial last page plus its tail."""
    held = _units(prompt, page)
    each = _units(prompt % page + tail, page)
    if held + particles * each <= budget:
        return particles
    return max(0, min(particles - 1, (budget - held) // each - 1))


def sis_token_bound(budget: int, prompt: int, particles: int, tokens: int, page: int = 1) -> int:
    """The most tokens the rule computes for ``particles`` particles of ``tokens`` tokens
    each over a prompt of ``prompt`` tokens, under a budget of ``budget`` units of KV of
    ``page`` tokens (the module doc's sum; the budget must hold the prompt and one
    recomputed row)."""
    total = prompt
    for k in range(1, tokens):
        r = kept_particles(budget, prompt, particles, k, page)
        total += r + (particles - r) * k
    return total
