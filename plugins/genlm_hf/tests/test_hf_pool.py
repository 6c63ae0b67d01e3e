"""The KV pool's pages: forks share, extensions write their own columns, copies on write
keep every context's columns, references free pages, and the bound holds.

The oracle is a plain list of values per context: every column a context writes gets a
value of its own in the pool's tensor, and every live context must read back exactly its
list, whatever other contexts forked, extended or released meanwhile."""

from __future__ import annotations

import random

import pytest
import torch
from genlm_hf.pool import PAGE, KVLayout, KVPool, KVSeq, PoolFullError

LAYOUT = KVLayout(layers=2, heads=1, head_dim=2, dtype=torch.float32, device=torch.device("cpu"))


def _write(pool: KVPool, slots: list[int], values: list[float]) -> None:
    v = torch.tensor(values)
    pool.storage[:, :, :, slots, :] = v.view(1, 1, 1, -1, 1)


def _read(pool: KVPool, seq: KVSeq) -> list[float]:
    return pool.storage[0, 0, 0, seq.slots(), 0].tolist()


def test_a_fork_shares_pages_and_the_second_writer_copies() -> None:
    pool = KVPool(LAYOUT, None)
    base = KVSeq(pool)
    _write(pool, base.extend(20), [float(i) for i in range(20)])  # a page and 4 columns
    a, b = base.fork(), base.fork()
    assert a.pages == base.pages and b.pages == base.pages
    _write(pool, a.extend(1), [100.0])  # a writes column 20 in place
    assert a.pages == base.pages
    _write(pool, b.extend(1), [200.0])  # b cannot: it copies the last page's 4 columns
    assert b.pages[0] == base.pages[0] and b.pages[1] != base.pages[1]
    assert pool.copied_columns == 20 - PAGE
    assert _read(pool, base) == [float(i) for i in range(20)]
    assert _read(pool, a) == [float(i) for i in range(20)] + [100.0]
    assert _read(pool, b) == [float(i) for i in range(20)] + [200.0]


def test_a_shorter_fork_and_release_free_every_page() -> None:
    pool = KVPool(LAYOUT, None)
    base = KVSeq(pool)
    base.extend(3 * PAGE)
    short = base.fork(PAGE + 2)
    assert short.pages == base.pages[:2] and short.length == PAGE + 2
    _write(pool, short.extend(1), [7.0])  # base wrote past column PAGE + 2: a copy
    assert short.pages[1] != base.pages[1]
    used = pool.pages_in_use
    base.release()
    assert pool.pages_in_use == used - 2  # its third page and its own second page
    short.release()
    short.release()  # idempotent
    assert pool.pages_in_use == 0
    with pytest.raises(ValueError, match="fork"):
        base.fork(1)


@pytest.mark.parametrize("seed", range(6))
def test_random_programs_keep_every_context_intact(seed: int) -> None:
    rng = random.Random(seed)
    pool = KVPool(LAYOUT, None)
    live: list[tuple[KVSeq, list[float]]] = []
    counter = 0.0
    for _ in range(300):
        op = rng.random()
        if op < 0.45 or not live:
            if live and rng.random() < 0.8:
                seq, vals = rng.choice(live)
                n = rng.randrange(0, seq.length + 1)
                seq, vals = seq.fork(n), vals[:n]
            else:
                seq, vals = KVSeq(pool), []
            k = rng.randrange(1, 2 * PAGE)
            new = [counter + i for i in range(k)]
            counter += k
            _write(pool, seq.extend(k), new)
            live.append((seq, vals + new))
        elif op < 0.8:
            seq, vals = rng.choice(live)
            new = [counter]
            counter += 1
            _write(pool, seq.extend(1), new)
            vals.append(new[0])
        else:
            seq, _ = live.pop(rng.randrange(len(live)))
            seq.release()
        for seq, vals in live:
            assert _read(pool, seq) == vals
        assert all(r >= 0 for r in pool.refs)
    for seq, _ in live:
        seq.release()
    assert pool.pages_in_use == 0 and pool.free_pages == pool.pages - 1


def test_the_bound_refuses_past_it_and_says_what_it_lacks() -> None:
    pool = KVPool(LAYOUT, max_bytes=5 * PAGE * LAYOUT.column_bytes)  # 5 pages, one reserved
    assert pool.max_pages == 5
    kept = [KVSeq(pool) for _ in range(3)]
    for s in kept:
        s.extend(PAGE)
    assert pool.shortfall(1) == 0 and pool.shortfall(3) == 2
    kept.pop(0).release()
    assert pool.shortfall(3) == 1
    with pytest.raises(PoolFullError, match="KV pool is full"):
        KVSeq(pool).extend(3 * PAGE)


@pytest.mark.parametrize("seed", range(4))
def test_pages_for_bounds_what_forks_take(seed: int) -> None:
    """Oracle: the pages a fork at ``depth`` extended to ``length`` really takes (copy on
    write included), counted by the pool; pages_for is never below it, and exact for a
    single fork of a fully written source."""
    rng = random.Random(seed)
    pool = KVPool(LAYOUT, None)
    for _ in range(30):
        src = KVSeq(pool)
        src.extend(rng.randrange(1, 3 * PAGE))
        depth = rng.randrange(0, src.length + 1)
        length = depth + rng.randrange(1, 3 * PAGE)
        before = pool.pages_in_use
        fork = src.fork(depth) if depth else KVSeq(pool)
        fork.extend(length - depth)
        taken = pool.pages_in_use - before
        assert taken <= pool.pages_for([(length, depth)]), (depth, length, taken)
        if depth % PAGE == 0:
            assert taken == pool.pages_for([(length, depth)])
        fork.release()
        src.release()


@pytest.mark.parametrize("seed", range(6))
def test_pages_to_extend_is_what_a_call_of_forks_takes(seed: int) -> None:
    """Oracle: the pages a call's forks really take, extended one after another as a pass
    does (copies on write included), counted by the pool: ``pages_to_extend`` counts them
    exactly, before any is taken. Sources are kept contexts and their chains (a particle's
    step writes on in place), several forks share a source and a depth (the first writes
    on, the others copy), and some start from nothing."""
    rng = random.Random(seed)
    pool = KVPool(LAYOUT, None)
    for _ in range(12):
        kept: list[KVSeq] = []
        for _ in range(rng.randrange(1, 4)):
            root = KVSeq(pool)
            root.extend(rng.randrange(1, 3 * PAGE))
            kept.append(root)
            for _ in range(rng.randrange(0, 3)):  # a chain: each step forks the last at its end
                step = kept[-1].fork()
                step.extend(rng.randrange(1, PAGE))
                kept.append(step)
        forks: list[tuple[KVSeq | None, int, int]] = []
        for _ in range(rng.randrange(1, 6)):
            if rng.random() < 0.2:
                forks.append((None, 0, rng.randrange(1, 2 * PAGE)))
                continue
            src = rng.choice(kept)
            depth = rng.choice([src.length, src.length, rng.randrange(1, src.length + 1)])
            forks.append((src, depth, depth + rng.randrange(1, 2 * PAGE)))
        forks += forks[: rng.randrange(0, 2)]  # the same fork twice: the second copies
        expected = pool.pages_to_extend(forks)
        before = pool.pages_in_use
        made = []
        for src, depth, length in forks:
            seq = src.fork(depth) if src is not None else KVSeq(pool)
            seq.extend(length - depth)
            made.append(seq)
        assert pool.pages_in_use - before == expected, forks
        assert expected <= pool.pages_for((n, d) for _, d, n in forks)
        for seq in made + kept:
            seq.release()
    assert pool.pages_in_use == 0


def test_growth_keeps_the_columns() -> None:
    pool = KVPool(LAYOUT, None)
    first = pool.pages
    seqs = []
    for i in range(first + 3):  # past the first size: the tensor doubles
        s = KVSeq(pool)
        _write(pool, s.extend(3), [float(i)] * 3)
        seqs.append(s)
    assert pool.grown >= 1 and pool.pages >= 2 * first
    for i, s in enumerate(seqs):
        assert _read(pool, s) == [float(i)] * 3


@pytest.mark.parametrize("seed", range(4))
def test_what_the_pool_hands_matches_the_slots_of_each_column(seed: int) -> None:
    """The pool's page arithmetic against each column's slot (``slots``): the first
    columns several contexts hold at the same slots, whether a context's first columns lie
    at consecutive slots, the pages a count of columns fills, and the bound a context
    needs (the least whose capacity holds it)."""
    rng = random.Random(seed)
    pool = KVPool(LAYOUT, None)
    seqs = [KVSeq(pool)]
    seqs[0].extend(rng.randrange(1, 4 * PAGE))
    for _ in range(30):  # forks of forks, extended, some released: pages shared, copied, reused
        parent = rng.choice(seqs)
        child = parent.fork(rng.randrange(parent.length + 1))
        child.extend(rng.randrange(1, 2 * PAGE))
        seqs.append(child)
        if rng.random() < 0.2 and len(seqs) > 2:
            seqs.pop(rng.randrange(len(seqs) - 1)).release()
    for _ in range(40):
        group = rng.sample(seqs, rng.randrange(1, min(4, len(seqs)) + 1))
        shortest = min(s.length for s in group)
        agree = 0
        while agree < shortest and len({s.slots(agree, agree + 1)[0] for s in group}) == 1:
            agree += 1
        assert group[0].shared_columns(group[1:]) == agree
        seq, length = group[0], rng.randrange(1, group[0].length + 1)
        slots = seq.slots(0, length)
        want = slots[0] if slots == list(range(slots[0], slots[0] + length)) else None
        assert seq.contiguous_start(length) == want
    for columns in range(3 * PAGE + 1):
        assert pool.pages_holding(columns) == len({col // PAGE for col in range(columns)})
    for tokens in range(1, 3 * PAGE):
        need = pool.bytes_to_hold(tokens)
        assert KVPool(LAYOUT, need).capacity() >= tokens
        assert KVPool(LAYOUT, need - pool.page_bytes).capacity() < tokens
    keys, values = pool.layer_kv(1)
    assert (
        keys.data_ptr() == pool.storage[1, 0].data_ptr()
        and values.data_ptr() == pool.storage[1, 1].data_ptr()
    )
