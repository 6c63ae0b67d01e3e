"""Batched private copies (genlm_core.engine.memory.private_copies, OutputCache.put_many):
the same copies as one private_copy / put each. The batched copy runs on CUDA only; here
the CPU is let in (BATCHED_COPY_DEVICES) so that its path runs and is compared with the
copy-each path it replaces."""

from __future__ import annotations

import pytest
import torch

from genlm_core.engine import memory
from genlm_core.engine.caches import OutputCache


@pytest.fixture(params=[False, True], ids=["copy-each", "batched"])
def batched(request, monkeypatch):
    if request.param:
        monkeypatch.setattr(memory, "BATCHED_COPY_DEVICES", {"cuda", "cpu"})
    return request.param


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_copies_are_private_and_compact(batched) -> None:
    batch = torch.randn(5, 7)
    rows = list(batch.unbind(0)) + [torch.arange(3.0)]  # views of a batch, and a tensor of its own
    copies = memory.private_copies(rows)
    assert len(copies) == len(rows)
    for src, cp in zip(rows, copies):
        assert torch.equal(src, cp) and cp.dtype == src.dtype and cp.shape == src.shape
        assert memory.sizeof(cp) == cp.numel() * cp.element_size()  # compact: keeps no batch alive
    assert len({_storage(c) for c in copies} | {_storage(batch), _storage(rows[-1])}) == len(copies) + 2
    copies[0].add_(1.0)
    assert torch.equal(rows[0], batch[0]) and not torch.equal(copies[0], rows[0])  # the source is untouched


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_batched_copies_are_the_sources_bit_for_bit(batched, dtype) -> None:
    """Floating rows go through one ``x * 1.0`` (copies allocated in C++): the copy's bits
    are the source's - signed zeros, infinities, the smallest subnormal and the largest
    finite value included - and a NaN stays a NaN."""
    info = torch.finfo(dtype)
    special = torch.tensor(
        [0.0, -0.0, float("inf"), -float("inf"), info.max, -info.max, info.tiny], dtype=dtype
    )
    subnormal = torch.tensor([info.tiny], dtype=dtype) / 4  # below the normal range
    assert 0 < subnormal.item() < info.tiny
    g = torch.Generator().manual_seed(2)
    rows = [torch.cat([special, subnormal, (torch.randn(64, generator=g) * 30).to(dtype)]) for _ in range(3)]
    rows.append(torch.tensor([float("nan"), 1.0], dtype=dtype))
    copies = memory.private_copies(rows)
    bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[rows[0].element_size()]
    for src, cp in zip(rows[:3], copies[:3]):
        assert cp.dtype == dtype and cp.is_contiguous() and _storage(cp) != _storage(src)
        assert torch.equal(cp.view(bits), src.view(bits))
    assert torch.isnan(copies[3][0]) and copies[3][1] == 1.0


@pytest.mark.parametrize(
    "make",
    [
        lambda: [torch.arange(6), torch.arange(4)],  # integers: x * 1.0 would be a float
        lambda: [torch.tensor([True, False]), torch.tensor([False])],
        lambda: [torch.randn(3, requires_grad=True), torch.randn(2)],  # a gradient: detached copies
        lambda: [torch.randn(4, 6)[:, ::2], torch.randn(3)],  # a strided view: a contiguous copy
    ],
    ids=["int64", "bool", "requires-grad", "strided"],
)
def test_batched_copies_of_other_tensors_keep_dtype_and_layout(batched, make) -> None:
    values = make()
    copies = memory.private_copies(values)
    for src, cp in zip(values, copies):
        assert cp.dtype == src.dtype and torch.equal(cp, src.detach()) and cp.is_contiguous()
        assert not cp.requires_grad and _storage(cp) != _storage(src)
        assert memory.sizeof(cp) == cp.numel() * cp.element_size()


def test_mixed_values_are_copied_one_by_one(batched) -> None:
    import numpy as np

    values = [torch.ones(2), np.zeros(3), (1, 2)]
    copies = memory.private_copies(values)
    assert torch.equal(copies[0], values[0]) and copies[0] is not values[0]
    assert np.array_equal(copies[1], values[1]) and copies[1] is not values[1]
    assert copies[2] == (1, 2)


def test_put_many_equals_put_each(batched) -> None:
    g = torch.Generator().manual_seed(0)
    items = [((i,), torch.randn(16, generator=g)) for i in range(12)]
    items.append(((99,), torch.randn(1000, generator=g)))  # over the byte budget: never cached
    items.append(((3,), torch.randn(16, generator=g)))  # a key again: replaces its entry
    one, many = OutputCache(max_entries=8, max_bytes=2000), OutputCache(max_entries=8, max_bytes=2000)
    for key, value in items:
        one.put(key, value)
    many.put_many(items)
    assert one.keys() == many.keys() and one.nbytes == many.nbytes and one.evictions == many.evictions
    for key in one.keys():
        a, b = one.get(key), many.get(key)
        assert torch.equal(a, b) and b is not dict(items)[key]
    items[-1][1].zero_()  # the caller's tensor changes: the cached copy does not
    assert not torch.equal(many.get((3,)), items[-1][1])


async def test_the_backend_caches_rows_nobody_else_holds(batched) -> None:
    """A computed batch: every caller's row is a compact tensor of its own; the output cache
    holds the batch's rows as one block (copy-each: the CPU's way) or a copy of each made
    in the callers' batched copy (batched: a GPU's way); no row is shared, and the cache
    answers the uncached forward pass after the callers scribble on their rows."""
    import asyncio

    import genlm_core

    llm = genlm_core.load("mock", batch_size=16, timeout=0.01)
    V = llm.vocab_size
    ctxs = [[4, i] for i in range(16)]
    truth = [llm.next_token_logprobs_uncached(c) for c in ctxs]
    rows = await asyncio.gather(*(llm.next_token_logprobs(c) for c in ctxs))
    held = [llm.output_cache._data[tuple(c)][0] for c in ctxs]
    storages = {_storage(h) for h in held}
    if batched:
        assert len(storages) == 16 and llm.output_cache.nbytes == 16 * V * 4
        assert all(memory.sizeof(h) == V * 4 for h in held)
    else:
        assert len(storages) == 1 and llm.output_cache.nbytes == 16 * V * 4
    assert not storages & {_storage(r) for r in rows}
    assert all(memory.sizeof(r) == V * 4 for r in rows)
    for r in rows:
        r.zero_()
    for c, t in zip(ctxs, truth):
        assert torch.equal(await llm.next_token_logprobs(c), t)
    llm.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bfloat16, torch.bool])
def test_copies_of_rows_above_the_parallel_grain(dtype) -> None:
    """Rows of 49k elements and more are copied by numpy where it can view them (not in
    an OpenMP region: see test_openmp_threads), by torch where it cannot (bfloat16): the
    same values, dtype and shape as torch's clone, compact and private, whatever the
    source's strides."""
    g = torch.Generator().manual_seed(1)
    batch = (torch.randn(4, 49_152, generator=g) * 100).to(dtype)
    sources = [batch[2], batch[:, ::2], batch.t()[100:20_000]]  # a row, strided views
    for src in sources:
        assert src.numel() * src.element_size() < memory.sizeof(src)  # views of the batch
        for cp in (memory.private_copy(src), memory.compact(src)):
            assert torch.equal(cp, src.clone()) and cp.dtype == dtype and cp.shape == src.shape
            assert cp.is_contiguous() and memory.sizeof(cp) == cp.numel() * cp.element_size()
            assert _storage(cp) != _storage(batch)


def test_accelerator_names_torch_devices_other_than_the_cpu() -> None:
    assert memory.accelerator("cuda") == "cuda" and memory.accelerator("cuda:1") == "cuda:1"
    assert memory.accelerator(torch.device("cuda", 0)) == torch.device("cuda", 0)
    assert memory.accelerator("mps") == "mps"
    for other in ("cpu", torch.device("cpu"), None, "meta", {"": 0}, "auto"):
        assert memory.accelerator(other) is None


def test_moved_from_cpu_moves_cpu_tensors_only() -> None:
    """A CPU tensor goes to the device given (``meta`` here: the CPU has no other); a
    tensor there already, an array, or no device: nothing moves (None)."""
    row = torch.arange(4.0)
    moved = memory.moved_from_cpu(row, "meta")
    assert moved.device.type == "meta" and moved.shape == row.shape and moved.dtype == row.dtype
    assert memory.moved_from_cpu(row, None) is None
    assert memory.moved_from_cpu(moved, "meta") is None
    assert memory.moved_from_cpu(row.numpy(), "meta") is None
