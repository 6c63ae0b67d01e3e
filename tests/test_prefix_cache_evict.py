"""PrefixCache's eviction callback and slot-driven eviction (engines whose KV payload is
a handle on engine memory, e.g. a llama.cpp KV sequence, must free it exactly once)."""

from __future__ import annotations

import random

import pytest

from genlm_core.engine.prefix_cache import PrefixCache


class Handle:
    def __init__(self, n: int) -> None:
        self.n = n


def _held(cache: PrefixCache) -> set[int]:
    return {id(n.kv) for n in cache._kv_lru.values()}


def test_every_dropped_payload_is_reported_once_and_none_held_is():
    """Random inserts (new, replacing), LRU budget evictions, evict_lru_kv, clear_kv and
    clear: the payloads reported == inserted - held, each reported once."""
    rng = random.Random(0)
    dropped: list[Handle] = []
    cache = PrefixCache(budget=30, sizeof=lambda h: h.n,
                        on_evict_kv=dropped.append)  # fmt: skip
    inserted: list[Handle] = []
    for _step in range(400):
        op = rng.random()
        if op < 0.75:
            ctx = tuple(rng.randrange(3) for _ in range(rng.randint(1, 5)))
            h = Handle(len(ctx) * 2)
            inserted.append(h)
            cache.insert(ctx, kv=h)
        elif op < 0.9:
            keep_small = rng.random() < 0.5
            got = cache.evict_lru_kv(keep=(lambda h: h.n <= 4) if keep_small else None)
            if got is not None:
                assert not (keep_small and got.n <= 4)
        elif op < 0.95:
            cache.clear_kv()
        else:
            cache.clear()
        assert len({id(h) for h in dropped}) == len(dropped)  # once each
        assert {id(h) for h in dropped} | _held(cache) == {id(h) for h in inserted}
        assert not ({id(h) for h in dropped} & _held(cache))
        assert cache.kv_bytes == sum(n.kv_bytes for n in cache._kv_lru.values()) <= 30


def test_evict_lru_kv_takes_the_least_recently_used_unkept():
    dropped: list[Handle] = []
    cache = PrefixCache(budget=None, sizeof=lambda h: h.n,
                        on_evict_kv=dropped.append)  # fmt: skip
    a, b, c = Handle(1), Handle(1), Handle(1)
    cache.insert((1,), kv=a)
    cache.insert((2,), kv=b)
    cache.insert((3,), kv=c)
    cache.deepest_kv((1,))  # a is now the most recent
    assert cache.evict_lru_kv(keep=lambda h: h is b) is c
    assert cache.evict_lru_kv() is b
    assert cache.evict_lru_kv() is a
    assert cache.evict_lru_kv() is None
    assert dropped == [c, b, a] and cache.node_count() == 1


def test_the_deprecated_budget_keyword_warns_and_still_bounds() -> None:
    with pytest.warns(DeprecationWarning, match="kv_budget_bytes.*removed in genlm-core 0.3.*budget="):
        cache = PrefixCache(kv_budget_bytes=30, sizeof=lambda h: h)
    assert cache.budget == 30
    with pytest.raises(TypeError, match="unexpected keyword"):
        PrefixCache(budjet=30)
