"""OutputCache and PrefixCache against brute-force models of what they must hold."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from genlm_core.engine.caches import OutputCache, sizeof
from genlm_core.engine.prefix_cache import PrefixCache

pytestmark = pytest.mark.numeric  # run again with the SIMD path capped (scripts/test.sh)


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
    # each value an array of its own (put keeps a private copy: a storage an entry): equal
    # bytes objects may be one object (b"x" * 1 is b"x"), which the cache rightly counts once
    cache = OutputCache(max_entries=max_entries, max_bytes=max_bytes)
    model: OrderedDict[tuple, np.ndarray] = OrderedDict()
    for op, k, size in ops:
        key = (k,)
        value = np.full(size, k, dtype=np.uint8)
        if op == "put":
            if max_entries == 0 or max_bytes == 0 or (max_bytes is not None and size > max_bytes):
                cache.put(key, value)
                continue
            model.pop(key, None)
            model[key] = value
            while (max_entries is not None and len(model) > max_entries) or (
                max_bytes is not None and sum(v.nbytes for v in model.values()) > max_bytes
            ):
                model.popitem(last=False)
            cache.put(key, value)
        else:
            got, want = cache.get(key), model.get(key)
            assert (got is None) == (want is None) and (want is None or np.array_equal(got, want))
            if key in model:
                model.move_to_end(key)
        assert cache.keys() == list(model.keys())
        assert cache.nbytes == sum(v.nbytes for v in model.values())


class BruteForcePrefixCache:
    """A dict of prefixes with an explicit LRU list: what PrefixCache must behave like."""

    def __init__(self, kv_budget):
        self.kv: OrderedDict[tuple, bytes] = OrderedDict()
        self.kv_budget = kv_budget

    def insert(self, tokens, kv):
        if self.kv_budget is None or len(kv) <= self.kv_budget:
            self.kv.pop(tokens, None)
            self.kv[tokens] = kv
        while self.kv_budget is not None and sum(map(len, self.kv.values())) > self.kv_budget:
            self.kv.popitem(last=False)

    def deepest_kv(self, tokens):
        for d in range(len(tokens), -1, -1):
            if tuple(tokens[:d]) in self.kv:
                self.kv.move_to_end(tuple(tokens[:d]))
                return d, self.kv[tuple(tokens[:d])]
        return 0, None


token_seqs = st.lists(st.integers(0, 3), max_size=5).map(tuple)


@settings(max_examples=80, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["insert", "deepest", "clear_kv"]), token_seqs, st.integers(1, 30)),
        max_size=120,
    ),
    kv_budget=st.one_of(st.none(), st.integers(0, 100)),
)
def test_prefix_cache_matches_brute_force(ops, kv_budget):
    _prefix_cache_against_brute_force(ops, kv_budget)


@settings(max_examples=80, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["insert", "deepest", "clear_kv"]), token_seqs, st.integers(1, 30)),
        max_size=120,
    ),
    kv_budget=st.one_of(st.none(), st.integers(0, 100)),
)
def test_prefix_cache_with_a_recent_index_of_two_matches_brute_force(ops, kv_budget):
    """The index of nodes stored lately (found by context, no walk) at its smallest: nodes
    leave it as often as they join, and pruned or evicted ones are never found through it."""
    from genlm_core.engine import prefix_cache

    kept = prefix_cache.RECENT
    prefix_cache.RECENT = 2
    try:
        _prefix_cache_against_brute_force(ops, kv_budget)
    finally:
        prefix_cache.RECENT = kept


def _prefix_cache_against_brute_force(ops, kv_budget):
    cache = PrefixCache(budget=kv_budget)
    model = BruteForcePrefixCache(kv_budget)
    for op, tokens, size in ops:
        payload = bytes([size % 256]) * size
        if op == "insert":
            cache.insert(tokens, kv=payload)
            model.insert(tokens, payload)
        elif op == "deepest":
            assert cache.deepest_kv(tokens) == model.deepest_kv(tokens)
        else:
            cache.clear_kv()
            model.kv.clear()
        assert cache.kv_prefixes() == list(model.kv.keys())
        assert cache.kv_bytes == sum(map(len, model.kv.values()))
        # nodes holding nothing are pruned: the trie is no bigger than the prefixes held
        closure = {p[:i] for p in model.kv for i in range(len(p) + 1)} | {()}
        assert cache.node_count() == len(closure)


def test_a_context_past_an_evicted_one_is_stored_in_the_trie():
    """A node the recent index holds whose payload the budget evicted (and which the trie
    pruned) must not take children: the context one token past it is stored under the
    trie's own path, found from the root."""
    cache = PrefixCache(budget=20, sizeof=len)
    cache.insert((1, 2), kv="x" * 10)
    cache.insert((3,), kv="y" * 15)  # evicts (1, 2): its nodes are pruned
    cache.insert((1, 2, 5), kv="z")
    assert cache.kv_prefixes() == [(3,), (1, 2, 5)]
    assert cache.deepest_kv((1, 2, 5, 6)) == (3, "z")
    assert cache.node_count() == 1 + 1 + 3


def test_eviction_on_demand_takes_leaves_only():
    """``evict_lru_kv(leaves_only=True)``: a leaf or nothing. With the particles' leaves
    kept (a pass reads them), ``leaves_first`` falls back to the least recently used
    context, the prompt they extend; ``leaves_only`` answers None and the prompt stays."""
    for only, want in ((False, "prompt"), (True, None)):
        cache = PrefixCache(budget=None)
        cache.insert((1, 2, 3), kv="prompt")
        cache.insert((1, 2, 3, 4), kv="a")
        cache.insert((1, 2, 3, 5), kv="b")
        keep = {"a", "b"}.__contains__
        got = cache.evict_lru_kv(keep, leaves_first=True, leaves_only=only)
        assert got == want
        assert cache.kv_prefixes() == (
            [(1, 2, 3, 4), (1, 2, 3, 5)] if not only else [(1, 2, 3), (1, 2, 3, 4), (1, 2, 3, 5)]
        )
    assert cache.evict_lru_kv(leaves_only=True) == "a"  # nothing kept: the leaves, then the prompt
    assert cache.evict_lru_kv(leaves_only=True) == "b"
    assert cache.evict_lru_kv(leaves_only=True) == "prompt"


def test_eviction_on_demand_takes_leaves_first():
    """``evict_lru_kv(leaves_first=True)``: the least recently used payload that no other
    kept context extends, so a prompt its particles share stays while they do; a branch
    goes leaf by leaf, and the prompt last."""
    cache = PrefixCache(budget=None)
    cache.insert((1, 2, 3), kv="prompt")
    cache.insert((1, 2, 3, 4), kv="a")
    cache.insert((1, 2, 3, 5), kv="b")
    cache.insert((1, 2, 3, 5, 6), kv="b2")
    assert cache.evict_lru_kv(leaves_first=True) == "a"
    assert cache.evict_lru_kv(leaves_first=True) == "b2"
    assert cache.evict_lru_kv(leaves_first=True) == "b"
    assert cache.evict_lru_kv(leaves_first=True) == "prompt"
    assert cache.evict_lru_kv(leaves_first=True) is None
    cache.insert((1,), kv="x")
    cache.insert((1, 2), kv="y")
    assert cache.evict_lru_kv() == "x"  # without it: the least recently used, a prefix or not


def test_prefix_cache_deepest_respects_max_depth():
    cache = PrefixCache()
    cache.insert((1, 2, 3), kv="abc")
    cache.insert((1,), kv="a")
    assert cache.deepest_kv((1, 2, 3, 4)) == (3, "abc")
    assert cache.deepest_kv((1, 2, 3), max_depth=2) == (1, "a")
    assert cache.deepest_kv((2,)) == (0, None)


# ---------------------------------------------------------------- byte accounting against real storage
def _storage_of(value) -> tuple[object, int]:
    """(identity, bytes) of the buffer a tensor/array keeps alive, read from the library itself."""
    if isinstance(value, torch.Tensor):
        s = value.untyped_storage()
        return ("torch", s.data_ptr()), s.nbytes()
    root = value
    while isinstance(root.base, np.ndarray):
        root = root.base
    return ("numpy", id(root)), root.nbytes


def _real_bytes(values) -> int:
    """Bytes really kept alive by ``values`` (each buffer once)."""
    return sum(dict(_storage_of(v) for v in values).values())


# a value: (torch or numpy, rows of the batch it is cut from, width, which row); rows=0: a whole tensor
values = st.tuples(
    st.sampled_from(["torch", "numpy"]), st.integers(0, 6), st.integers(1, 8), st.integers(0, 5)
)


def _make(kind: str, rows: int, width: int, row: int, fill: float):
    n = max(rows, 1)
    data = np.arange(n * width, dtype=np.float32).reshape(n, width) + np.float32(fill)
    batch = torch.from_numpy(data.copy()) if kind == "torch" else data.copy()
    return batch[min(row, n - 1)] if rows else batch[0].clone() if kind == "torch" else batch[0].copy()


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["put", "put", "get", "scribble"]), st.integers(0, 9), values), max_size=80
    ),
    max_entries=st.one_of(st.none(), st.integers(1, 6)),
    max_bytes=st.one_of(st.none(), st.integers(0, 120)),
)
def test_output_cache_accounts_the_storage_it_keeps_alive(ops, max_entries, max_bytes):
    """Random put/get sequences with values that are views of batch tensors/arrays.

    Oracle: an LRU of expected contents; what the cache really keeps alive is read from
    ``untyped_storage().nbytes()`` / the numpy base of every stored value. The producer
    then scribbles on its own buffers, which must never reach the cache.
    """
    cache = OutputCache(max_entries=max_entries, max_bytes=max_bytes)
    model: OrderedDict[tuple, np.ndarray] = OrderedDict()
    given_away = []
    for step, (op, k, (kind, rows, width, row)) in enumerate(ops):
        key = (k,)
        if op == "put":
            value = _make(kind, rows, width, row, fill=step)
            content = np.array(value, copy=True)
            cache.put(key, value)
            given_away.append(value)
            own = content.nbytes  # a compact private copy holds exactly its elements
            if max_entries != 0 and max_bytes != 0 and (max_bytes is None or own <= max_bytes):
                model.pop(key, None)
                model[key] = content
                while (max_entries is not None and len(model) > max_entries) or (
                    max_bytes is not None and sum(v.nbytes for v in model.values()) > max_bytes
                ):
                    model.popitem(last=False)
        elif op == "get":
            got = cache.get(key)
            if key in model:
                model.move_to_end(key)
                assert np.array_equal(np.asarray(got), model[key])
            else:
                assert got is None
        else:  # the producer reuses its buffers
            for v in given_away:
                v[...] = -1
        assert cache.keys() == list(model.keys())
        held = [cache._data[key][0] for key in cache.keys()]
        assert cache.nbytes == _real_bytes(held) == sum(v.nbytes for v in model.values())
        if max_bytes is not None:
            assert cache.nbytes <= max_bytes
        for key, value in zip(cache.keys(), held):
            assert np.array_equal(np.asarray(value), model[key])


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["insert", "insert", "deepest", "clear"]), token_seqs, values), max_size=60
    ),
    kv_budget=st.one_of(st.none(), st.integers(0, 200)),
)
def test_prefix_cache_accounts_the_storage_its_payloads_keep_alive(ops, kv_budget):
    """KV payloads that view larger buffers are charged for the buffer; the budget holds.

    Oracle: a brute-force LRU of prefixes whose sizes are read from the payloads'
    storages; what the trie keeps alive is read from the nodes it holds.
    """
    cache = PrefixCache(budget=kv_budget)
    model = OrderedDict()
    for step, (op, tokens, (kind, rows, width, row)) in enumerate(ops):
        if op == "insert":
            kv = _make(kind, rows, width, row, fill=step)
            size = _storage_of(kv)[1]
            cache.insert(tokens, kv=kv)
            if kv_budget is None or size <= kv_budget:
                model.pop(tokens, None)
                model[tokens] = (kv, size)
                while kv_budget is not None and sum(s for _, s in model.values()) > kv_budget:
                    model.popitem(last=False)
        elif op == "deepest":
            depth, kv = cache.deepest_kv(tokens)
            expect = next(((d, tokens[:d]) for d in range(len(tokens), -1, -1) if tokens[:d] in model), None)
            if expect is None:
                assert (depth, kv) == (0, None)
            else:
                assert depth == expect[0] and kv is model[expect[1]][0]
                model.move_to_end(expect[1])
        else:
            cache.clear()
            model.clear()
        assert cache.kv_prefixes() == list(model.keys())
        held = []
        stack = [cache.root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node.kv is not None:
                held.append(node.kv)
        assert cache.kv_bytes == sum(s for _, s in model.values())
        assert _real_bytes(held) <= cache.kv_bytes  # a buffer shared by two payloads counts twice
        if kv_budget is not None:
            assert cache.kv_bytes <= kv_budget


@settings(max_examples=150, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["adopt", "adopt", "put", "get"]),
            st.integers(0, 9),
            st.integers(1, 5),
            st.integers(1, 6),
        ),
        max_size=60,
    ),
    max_entries=st.one_of(st.none(), st.integers(1, 8)),
    max_bytes=st.one_of(st.none(), st.integers(0, 200)),
)
def test_adopted_rows_are_one_block_counted_once(ops, max_entries, max_bytes):
    """adopt_many keeps the rows of a batch as views of it: the batch counts once and
    goes with its last entry; the budget holds; a block larger than the budget is copied.

    Oracle: an LRU of keys whose bytes are each distinct block's size once (a brute-force
    sum over the held entries), against what the held values' storages really are."""
    cache = OutputCache(max_entries=max_entries, max_bytes=max_bytes)
    model: OrderedDict[tuple, tuple[np.ndarray, object, int]] = OrderedDict()

    def model_bytes() -> int:
        return sum(dict((block, size) for _, block, size in model.values()).values())

    def model_insert(key: tuple, content: np.ndarray, block: object, size: int) -> None:
        if max_entries == 0 or max_bytes == 0 or (max_bytes is not None and size > max_bytes):
            return
        model.pop(key, None)
        model[key] = (content, block, size)
        while (max_entries is not None and len(model) > max_entries) or (
            max_bytes is not None and model_bytes() > max_bytes
        ):
            model.popitem(last=False)

    for step, (op, k, rows, width) in enumerate(ops):
        batch = torch.arange(rows * width, dtype=torch.float32).view(rows, width) + step
        if op == "adopt":
            keys = [(k + i,) for i in range(rows)]
            cache.adopt_many(list(zip(keys, batch.unbind(0))))
            block_bytes = batch.numel() * 4
            copied = max_bytes is not None and block_bytes > max_bytes
            for i, key in enumerate(keys):
                row = batch[i].numpy().copy()
                if copied:  # each row a private copy of its own
                    model_insert(key, row, ("copy", step, i), width * 4)
                else:
                    model_insert(key, row, ("batch", step), block_bytes)
        elif op == "put":
            cache.put((k,), batch[0])
            model_insert((k,), batch[0].numpy().copy(), ("copy", step, 0), width * 4)
        else:
            got = cache.get((k,))
            if (k,) in model:
                model.move_to_end((k,))
                assert np.array_equal(got.numpy(), model[(k,)][0])
            else:
                assert got is None
        assert cache.keys() == list(model.keys())
        held = [cache._data[key][0] for key in cache.keys()]
        assert cache.nbytes == _real_bytes(held) == model_bytes()
        if max_bytes is not None:
            assert cache.nbytes <= max_bytes
        for key, value in zip(cache.keys(), held):
            assert np.array_equal(value.numpy(), model[key][0])
    cache.clear()
    assert cache.nbytes == 0 and not cache._blocks


def test_a_cpu_cache_adopts_rows_already_on_the_cpu() -> None:
    """``to_cpu`` with rows on the CPU: adopted as they are (no copy), one block."""
    cache = OutputCache(max_entries=None, max_bytes=None, to_cpu=True)
    batch = torch.arange(12, dtype=torch.float32).view(3, 4)
    rows = batch.unbind(0)
    cache.adopt_many([((i,), r) for i, r in enumerate(rows)])
    assert all(cache.get((i,)) is r for i, r in enumerate(rows))
    assert cache.nbytes == batch.numel() * 4


def test_cpu_copies_are_private_and_equal() -> None:
    from genlm_core.engine.memory import cpu_copies

    batch = torch.arange(12, dtype=torch.float32).view(3, 4)
    values = [*batch.unbind(0), np.arange(3.0), "x"]
    out = cpu_copies(values)
    for v, c in zip(values[:3], out[:3]):
        assert c.device.type == "cpu" and torch.equal(c, v)
        assert c.untyped_storage().data_ptr() != batch.untyped_storage().data_ptr()
    assert np.array_equal(out[3], values[3]) and out[3] is not values[3] and out[4] == "x"


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_cpu_cache_moves_a_gpu_batch_in_one_block(dtype) -> None:  # pragma: no cover - GPU only
    """``to_cpu`` with a GPU batch's rows (the backend's normalised rows), or separate GPU
    rows (put): on the CPU, bit for bit, as one block counted once."""
    from genlm_core.engine.memory import cpu_copies

    batch = torch.randn(5, 700, device="cuda").to(dtype)
    rows = batch.unbind(0)
    cache = OutputCache(max_entries=None, max_bytes=None, to_cpu=True)
    cache.adopt_many([((i,), r) for i, r in enumerate(rows)])
    for i, r in enumerate(rows):
        got = cache.get((i,))
        assert got.device.type == "cpu" and got.dtype == dtype and torch.equal(got, r.cpu())
    assert cache.nbytes == batch.numel() * batch.element_size()  # one block
    separate = [torch.randn(700, device="cuda") for _ in range(4)]  # no common batch: stacked
    moved = cpu_copies(separate)
    assert all(m.device.type == "cpu" and torch.equal(m, s.cpu()) for m, s in zip(moved, separate))
    assert len({m.untyped_storage().data_ptr() for m in moved[:4]}) == 1


@pytest.mark.cuda
def test_a_cpu_cache_hands_rows_back_where_they_came_from() -> None:  # pragma: no cover - GPU only
    """``get`` is the row held in host memory; ``get_back`` and ``cache[key]`` a copy of it
    back on the device it was put from (a CPU row stays the stored object); a key put again
    from the CPU, evicted or cleared forgets its device."""
    cache = OutputCache(max_entries=2, max_bytes=None, to_cpu=True)
    gpu, cpu = torch.randn(9, device="cuda"), torch.randn(9)
    cache.adopt_many([((1,), gpu)])
    cache.put((2,), cpu)
    assert cache.get((1,)).device.type == "cpu"
    for back in (cache.get_back((1,)), cache[(1,)]):
        assert back.device == gpu.device and torch.equal(back, gpu) and back.data_ptr() != gpu.data_ptr()
    assert cache.get_back((2,)) is cache.get((2,))
    cache.put((1,), cpu)
    assert cache[(1,)].device.type == "cpu"
    cache.put((3,), gpu)  # evicts (2,)
    cache.put((2,), cpu)  # evicts (1,)
    assert cache[(3,)].device == gpu.device and cache[(2,)].device.type == "cpu"
    cache.clear()
    assert cache.get_back((3,)) is None


def test_get_back_is_get_where_nothing_was_moved() -> None:
    """A cache without ``to_cpu``, or with CPU values: ``get_back`` and ``cache[key]`` are
    the stored object, counted as hits like ``get``; a missing key is the default."""
    for to_cpu in (False, True):
        cache = OutputCache(max_entries=4, max_bytes=None, to_cpu=to_cpu)
        cache.put((1,), torch.arange(3.0))
        stored = cache.get((1,))
        assert cache.get_back((1,)) is stored and cache[(1,)] is stored
        assert cache.get_back((9,), "none") == "none"
        assert cache.stats()["hits"] == 3 and cache.stats()["misses"] == 1
