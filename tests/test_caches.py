"""OutputCache and PrefixCache against brute-force models of what they must hold."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from genlm_core.caches import OutputCache, sizeof
from genlm_core.prefix_cache import PrefixCache


def test_output_cache_byte_budget_after_100k_inserts():
    cache = OutputCache(max_entries=None, max_bytes=1_000_000)
    row = 4 * 1000
    for i in range(100_000):
        cache.put((i,), np.zeros(1000, dtype=np.float32))
        assert cache.nbytes <= 1_000_000
    assert cache.nbytes == sum(sizeof(cache[k]) for k in cache.keys())
    assert len(cache) == 1_000_000 // row
    # the survivors are the most recent inserts, in order
    assert cache.keys() == [(i,) for i in range(100_000 - len(cache), 100_000)]


def test_output_cache_to_cpu_and_counters():
    cache = OutputCache(max_entries=2, max_bytes=None, to_cpu=True)
    cache.put((1,), torch.ones(3))
    assert cache.get((1,)).device.type == "cpu"
    assert cache.get((2,)) is None
    assert cache.stats()["hits"] == 1 and cache.stats()["misses"] == 1


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["put", "get"]), st.integers(0, 12), st.integers(1, 40)), max_size=200
    ),
    max_entries=st.one_of(st.none(), st.integers(1, 8)),
    max_bytes=st.one_of(st.none(), st.integers(0, 200)),
)
def test_output_cache_matches_brute_force_lru(ops, max_entries, max_bytes):
    cache = OutputCache(max_entries=max_entries, max_bytes=max_bytes)
    model: OrderedDict[tuple, bytes] = OrderedDict()
    for op, k, size in ops:
        key = (k,)
        if op == "put":
            if max_entries == 0 or max_bytes == 0 or (max_bytes is not None and size > max_bytes):
                cache.put(key, b"x" * size)
                continue
            model.pop(key, None)
            model[key] = b"x" * size
            while (max_entries is not None and len(model) > max_entries) or (
                max_bytes is not None and sum(map(len, model.values())) > max_bytes
            ):
                model.popitem(last=False)
            cache.put(key, b"x" * size)
        else:
            got = cache.get(key)
            assert got == model.get(key)
            if key in model:
                model.move_to_end(key)
        assert cache.keys() == list(model.keys())
        assert cache.nbytes == sum(map(len, model.values()))


class BruteForcePrefixCache:
    """A dict of prefixes with explicit LRU lists: what PrefixCache must behave like."""

    def __init__(self, kv_budget, lp_budget):
        self.kv: OrderedDict[tuple, bytes] = OrderedDict()
        self.lp: OrderedDict[tuple, bytes] = OrderedDict()
        self.kv_budget, self.lp_budget = kv_budget, lp_budget

    def insert(self, tokens, logprobs=None, kv=None):
        if logprobs is not None and (self.lp_budget is None or len(logprobs) <= self.lp_budget):
            self.lp.pop(tokens, None)
            self.lp[tokens] = logprobs
        if kv is not None and (self.kv_budget is None or len(kv) <= self.kv_budget):
            self.kv.pop(tokens, None)
            self.kv[tokens] = kv
        while self.kv_budget is not None and sum(map(len, self.kv.values())) > self.kv_budget:
            self.kv.popitem(last=False)
        while self.lp_budget is not None and sum(map(len, self.lp.values())) > self.lp_budget:
            self.lp.popitem(last=False)

    def deepest_kv(self, tokens):
        for d in range(len(tokens), -1, -1):
            if tuple(tokens[:d]) in self.kv:
                self.kv.move_to_end(tuple(tokens[:d]))
                return d, self.kv[tuple(tokens[:d])]
        return 0, None

    def get_logprobs(self, tokens):
        if tokens in self.lp:
            self.lp.move_to_end(tokens)
            return self.lp[tokens]
        return None


token_seqs = st.lists(st.integers(0, 3), max_size=5).map(tuple)


@settings(max_examples=80, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["insert_kv", "insert_lp", "insert_both", "deepest", "get", "clear_kv"]),
            token_seqs,
            st.integers(1, 30),
        ),
        max_size=120,
    ),
    kv_budget=st.one_of(st.none(), st.integers(0, 100)),
    lp_budget=st.one_of(st.none(), st.integers(0, 100)),
)
def test_prefix_cache_matches_brute_force(ops, kv_budget, lp_budget):
    cache = PrefixCache(kv_budget_bytes=kv_budget, logprobs_budget_bytes=lp_budget)
    model = BruteForcePrefixCache(kv_budget, lp_budget)
    for op, tokens, size in ops:
        payload = bytes([size % 256]) * size
        if op == "insert_kv":
            cache.insert(tokens, kv=payload)
            model.insert(tokens, kv=payload)
        elif op == "insert_lp":
            cache.insert(tokens, logprobs=payload)
            model.insert(tokens, logprobs=payload)
        elif op == "insert_both":
            cache.insert(tokens, logprobs=payload, kv=payload)
            model.insert(tokens, logprobs=payload, kv=payload)
        elif op == "deepest":
            assert cache.deepest_kv(tokens) == model.deepest_kv(tokens)
        elif op == "get":
            assert cache.get_logprobs(tokens) == model.get_logprobs(tokens)
        else:
            cache.clear_kv()
            model.kv.clear()
        assert cache.kv_prefixes() == list(model.kv.keys())
        assert cache.logprob_prefixes() == list(model.lp.keys())
        assert cache.kv_bytes == sum(map(len, model.kv.values()))
        # nodes holding nothing are pruned: the trie is no bigger than the prefixes held
        held = set(model.kv) | set(model.lp)
        closure = {p[:i] for p in held for i in range(len(p) + 1)} | {()}
        assert cache.node_count() == len(closure)


def test_prefix_cache_deepest_respects_max_depth():
    cache = PrefixCache()
    cache.insert((1, 2, 3), kv="abc")
    cache.insert((1,), kv="a")
    assert cache.deepest_kv((1, 2, 3, 4)) == (3, "abc")
    assert cache.deepest_kv((1, 2, 3), max_depth=2) == (1, "a")
    assert cache.deepest_kv((2,)) == (0, None)
