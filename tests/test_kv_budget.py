"""Past its KV budget the core keeps the prompt and a fixed subset of particles
(genlm_core.engine.kv_resident): tokens computed against a brute-force count.

A toy engine holds KV in cells the way llama.cpp does: a row resuming a kept context at
depth ``d`` shares its first ``d`` cells and takes one new cell per new token; a cell is
free once no live payload holds it; the engine's room is ``capacity`` cells, kept
contexts and the part running alike. Particles run SIS over one prompt. The oracle is
the fixed-subset policy counted over the very calls: at each step the most particles
(the same ones as before, never one back) whose tails fit beside the prompt and one
recomputed row; each kept particle computes one token, each other its whole tail.
"""

from __future__ import annotations

import random

import pytest
import torch

from genlm_core.config import BackendConfig
from genlm_core.engine import Engine, KVCacheOptions, kv_resident
from genlm_core.engine.kv_calls import KVCalls
from genlm_core.engine.kv_resident import sis_token_bound
from genlm_core.engine.kv_rows import KVPolicy, ResumeRow, RowsOut

Context = tuple[int, ...]
P, N, T = 42, 16, 12  # prompt tokens, particles, tokens each


class Config(KVCacheOptions, BackendConfig):
    pass


class Payload:
    def __init__(self, context: Context, pages: list[int]) -> None:
        self.context = context
        self.pages = pages
        self.live = True


class Paged(Engine):
    """KV in pages of ``page`` tokens under ``capacity`` pages (see the module doc)."""

    supports = frozenset({"resume"})

    def __init__(self, capacity: int, release: str, page: int) -> None:
        self.capacity = capacity
        self.release = release
        self.page = page
        self.refs: dict[int, int] = {}  # page -> payloads holding it
        self.written: dict[int, int] = {}  # page -> tokens written in it
        self.next_page = 0

    @property
    def used(self) -> int:
        return len(self.refs)

    def kv_policy(self) -> KVPolicy:
        return KVPolicy(budget=None, release=self.release)  # type: ignore[arg-type]

    def kv_size(self, payload: Payload) -> int:
        return 0

    def kv_owner(self, payload: Payload) -> Payload:
        return payload

    def release_kv(self, owner: Payload) -> None:
        assert owner.live, "a payload handed back twice"
        owner.live = False
        for q in owner.pages:
            self.refs[q] -= 1
            if not self.refs[q]:
                del self.refs[q], self.written[q]

    def _plan(self, rows: list[ResumeRow]) -> list[tuple[list[int], bool]]:
        """Per row: the pages it shares, and whether it writes on in its last one (the
        first row to resume where that page's writing stopped) or copies it."""
        G, taken, out = self.page, set(), []
        for r in rows:
            full, col = divmod(r.depth, G)
            pages = r.payload.pages[: full + (col > 0)] if r.payload is not None else []
            in_place = col > 0 and self.written[pages[-1]] == col and pages[-1] not in taken
            if in_place:
                taken.add(pages[-1])
            out.append((pages, in_place))
        return out

    def kv_shortfall(self, rows: list[ResumeRow]) -> int:
        G, need = self.page, 0
        for r, (_, in_place) in zip(rows, self._plan(rows)):
            need += -(-len(r.context) // G) - -(-r.depth // G) + (r.depth % G > 0 and not in_place)
        return max(0, self.used + need - self.capacity)

    def _take(self) -> int:
        self.next_page += 1
        self.refs[self.next_page] = 0
        self.written[self.next_page] = 0
        return self.next_page

    def forward_rows(self, rows: list[ResumeRow]) -> RowsOut:
        assert self.kv_shortfall(rows) == 0, "the core handed rows without room"
        G, kept = self.page, []
        for r, (shared, in_place) in zip(rows, self._plan(rows)):
            if r.payload is not None:
                assert r.payload.live and r.payload.context[: r.depth] == r.context[: r.depth]
            pages = list(shared)
            col = r.depth % G
            if col and not in_place:  # copy the partial page
                pages[-1] = self._take()
                self.written[pages[-1]] = col
            for pos in range(r.depth, len(r.context)):
                if pos % G == 0:
                    pages.append(self._take())
                self.written[pages[-1]] = pos % G + 1
            for n in (*r.read_off, len(r.context)):
                held = pages[: -(-n // G)]
                for q in held:
                    self.refs[q] += 1
                kept.append((r.context[:n], Payload(r.context[:n], held)))
        for q in [q for q, n in self.refs.items() if n == 0]:  # a copy no kept context holds
            del self.refs[q], self.written[q]
        assert self.used <= self.capacity
        return RowsOut(torch.zeros(len(kept), 4), kept)


def sis_calls(seed: int = 0) -> list[list[Context]]:
    """The calls of SIS: the prompt, then every particle one token further, T - 1 times."""
    rng = random.Random(seed)
    prompt = tuple(rng.randrange(100, 10_000) for _ in range(P))
    tails: list[list[int]] = [[] for _ in range(N)]
    calls = [[prompt]]
    for _ in range(1, T):
        for i, t in enumerate(tails):
            t.append(i * 1000 + rng.randrange(1, 1000))  # distinct particles
        calls.append([prompt + tuple(t) for t in tails])
    return calls


def run(capacity: int, release: str, calls: list[list[Context]], page: int) -> dict[str, int]:
    """The core's counters after ``calls`` on a :class:`Paged` engine."""
    engine = Paged(capacity, release, page)
    kv = KVCalls(engine, Config(), "paged")
    for contexts in calls:
        kv.forward(contexts)
        assert engine.used <= capacity
    return kv.stats()


def tokens_computed(capacity: int, release: str, calls: list[list[Context]], page: int) -> int:
    return run(capacity, release, calls, page)["tokens_computed"]


def minimum(calls: list[list[Context]]) -> int:
    """Every distinct prefix once."""
    return len({c[:n] for call in calls for c in call for n in range(1, len(c) + 1)})


def units(tokens: int, page: int) -> int:
    return -(-tokens // page)


def fixed_subset(capacity: int, calls: list[list[Context]], page: int) -> int:
    """The fixed-subset policy counted over the calls (the module doc): the prompt once;
    at each step the first ``R`` particles kept, ``R`` the most (never more than the step
    before) whose pages fit beside the prompt's and, where a particle is not kept, its
    recomputed tail's; a particle's pages are its copy of the prompt's partial last page
    and its tail."""
    prompt = len(calls[0][0])
    total = prompt
    kept = N
    for call in calls[1:]:
        held = [units(prompt % page + len(c) - prompt, page) for c in call]
        while kept > 0:
            if units(prompt, page) + sum(held[:kept]) + max(held[kept:], default=0) <= capacity:
                break
            kept -= 1
        total += kept + sum(len(c) - prompt for c in call[kept:])
    return total


CALLS = sis_calls()
PAGES = [1, 8]


def budgets(page: int) -> range:
    """From the prompt and one recomputed row to every particle kept, in pages."""
    tail = units(P % page + T - 1, page)
    return range(units(P, page) + tail, units(P, page) + N * tail + 3)


@pytest.mark.parametrize("page", PAGES)
def test_the_oracle_is_the_arithmetic_of_the_module_doc(page: int) -> None:
    assert minimum(CALLS) == P + N * (T - 1)
    for budget in budgets(page):
        assert fixed_subset(budget, CALLS, page) == sis_token_bound(budget, P, N, T, page), budget


@pytest.mark.parametrize("page", PAGES)
def test_past_the_budget_the_prompt_and_a_fixed_subset_stay(page: int) -> None:
    """At every budget: at most the fixed subset's count, at least the minimum; more
    budget never computes more; enough for every particle computes the minimum."""
    got = {b: tokens_computed(b, "resident", CALLS, page) for b in budgets(page)}
    low = minimum(CALLS)
    for budget, tokens in got.items():
        assert low <= tokens <= fixed_subset(budget, CALLS, page), budget
    ordered = sorted(got)
    for smaller, larger in zip(ordered, ordered[1:]):
        assert got[larger] <= got[smaller], (smaller, larger)
    assert got[ordered[-1]] == low
    # bounded steps: a budget one unit smaller keeps at most one particle fewer at a step:
    # at most its recomputed tails, T (T - 1) / 2 tokens
    for smaller, larger in zip(ordered, ordered[1:]):
        assert got[smaller] - got[larger] <= T * (T - 1) // 2, (smaller, larger)


@pytest.mark.parametrize("release", ["lru", "leaves"])
def test_least_recently_used_release_recomputes_past_the_bound(release: str) -> None:
    """The old rules, on pages: a part releases the other parts' particles, every step,
    so past the budget most particles recompute their whole tail each step (the leaves
    first rule too: a particle's first page is its copy of the prompt's, so releasing a
    page of it loses its tail)."""
    page = 8
    over = {}
    for b in budgets(page):
        tokens, bound = tokens_computed(b, release, CALLS, page), fixed_subset(b, CALLS, page)
        if tokens > bound:
            over[b] = round(tokens / bound, 2)
    assert len(over) > len(budgets(page)) // 2, over


def test_with_resampling_rows_stay_right_and_within_no_reuse() -> None:
    """Particles die and duplicate (two children of one kept context: one carries its
    lineage on, the other starts a new one); the core hands every row its own context's
    pages (the engine checks), keeps the prompt (no row from its start: a context
    recomputed from the prompt that extends a younger particle's kept prefix does not
    pin that prefix's pages) and never computes more than with nothing kept past the
    prompt."""
    rng = random.Random(1)
    prompt = CALLS[0][0]
    particles = [prompt] * N
    calls = [[prompt]]
    for _ in range(1, T):
        particles = [rng.choice(particles) for _ in particles]  # resample
        particles = [p + (rng.randrange(1, 50),) for p in particles]
        calls.append(sorted(set(particles)))
    no_reuse_past_prompt = P + sum(len(c) - P for call in calls[1:] for c in call)
    for page in PAGES:
        for budget in budgets(page)[::3]:
            stats = run(budget, "resident", calls, page)
            assert minimum(calls) <= stats["tokens_computed"] <= no_reuse_past_prompt, (page, budget)
            assert stats["rows_from_start"] == 0, (page, budget)


def smc_calls(seed: int = 0, tokens: int = 30, every: int = 5) -> list[list[Context]]:
    """SMC's calls: every ``every`` steps half the particles die and the other half
    duplicate (each survivor's two children extend its context)."""
    rng = random.Random(seed)
    prompt = CALLS[0][0]
    particles = [prompt] * N
    calls = [[prompt]]
    for k in range(1, tokens):
        if k % every == 0:
            live = rng.sample(particles, N // 2)
            particles = live + live
        particles = [p + (rng.randrange(1, 10**6),) for p in particles]
        calls.append(sorted(set(particles)))
    return calls


@pytest.mark.parametrize("stale_calls", [kv_resident.STALE_CALLS, 10**9])
def test_particles_that_died_give_their_room_to_the_living(
    stale_calls: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A budget that holds every live particle: the lineages of particles that died at a
    resampling (old ranks, never read again) go once no call read them for STALE_CALLS
    calls, so the survivors' second children stay and nothing is computed twice. Were
    they kept by rank alone (``STALE_CALLS`` never reached), the dead would keep their
    pages and the children would be recomputed at every step."""
    default = kv_resident.STALE_CALLS
    monkeypatch.setattr(kv_resident, "STALE_CALLS", stale_calls)
    page, tokens = 8, 30
    calls = smc_calls(tokens=tokens)
    budget = units(P, page) + N * units(P % page + tokens - 1, page)
    got = tokens_computed(budget, "resident", calls, page)
    if stale_calls == default:
        assert got == minimum(calls)
    else:
        assert got > 1.5 * minimum(calls)


class Whole(Engine):
    """Each kept context owns its whole KV: the cache's budget counts it
    (``KVPolicy.budget``, ``kv_size``: its length), as genlm-mlx's bytes."""

    supports = frozenset({"resume"})

    def __init__(self, budget: int, release: str) -> None:
        self.budget = budget
        self.release = release

    def kv_policy(self) -> KVPolicy:
        return KVPolicy(budget=self.budget, release=self.release)  # type: ignore[arg-type]

    def kv_size(self, payload: Payload) -> int:
        return len(payload.context)

    def kv_owner(self, payload: Payload) -> None:
        return None

    def forward_rows(self, rows: list[ResumeRow]) -> RowsOut:
        for r in rows:
            assert r.payload is None or r.payload.context == r.context[: r.depth]
        return RowsOut(torch.zeros(len(rows), 4), [(r.context, Payload(r.context, [])) for r in rows])


@pytest.mark.parametrize("release", ["resident", "lru"])
def test_under_a_cache_budget_the_prompt_stays_and_what_cannot_stay_is_not_kept(release: str) -> None:
    """A budget the cache counts (each kept context its whole length) that holds the prompt
    and three particles: under "resident" a particle's context is kept only when younger
    ones make room, so the prompt (the oldest) stays and three particles resume every
    step; least recently used, storing each step's contexts pushes the prompt out (it
    is found only through the particles) and every particle runs from its start."""
    budget = P + 3 * (P + T)
    kv = KVCalls(Whole(budget, release), Config(), "whole")
    for contexts in CALLS:
        kv.forward(contexts)
    tokens = kv.stats()["tokens_computed"]
    no_particle_kept = P + N * T * (T - 1) // 2
    three_kept = no_particle_kept - 3 * (T * (T - 1) // 2 - (T - 1))
    if release == "resident":
        assert tokens <= three_kept
    else:
        assert tokens > no_particle_kept + (T - 2) * P  # the prompt computed again every step
