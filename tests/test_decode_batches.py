"""DecodeBatches' bookkeeping over fake engine ops whose KV payload is the tokens it holds:
a row is its handle (a kept batch resumes only for the rows whose handles were there),
a new handle extending a kept row's context starts from that row's KV, and every row's
output is the brute-force function of its context (the oracle). Also the one helper
for distinct contexts (run_distinct)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from genlm_core.engine.contexts import Context, run_distinct
from genlm_core.engine.decode_batches import DecodeBatches, KeptBatch
from genlm_core.engine.kv_reuse import KVReuse


def row(ctx: Context) -> torch.Tensor:
    """The oracle: a row that names its context (position-weighted sum, length)."""
    return torch.tensor([float(sum((i + 1) * t for i, t in enumerate(ctx))), float(len(ctx))])


class FakeOps:
    """DecodeOps whose KV of a row is the tuple of tokens it holds: an assemble checks each
    source is its context's prefix, a resume that each row continues its kept row."""

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []

    def assemble(self, contexts: list[Context], sources: list[tuple[int, Any]]) -> tuple[Any, Any]:
        for c, (depth, payload) in zip(contexts, sources):
            assert depth == 0 or tuple(payload) == c[:depth], (c, depth, payload)
        self.log.append(("assemble", [d for d, _ in sources]))
        return torch.stack([row(c) for c in contexts]), "kept"

    def resume(self, batch: KeptBatch, contexts: list[Context]) -> Any:
        assert all(c[:-1] == p for c, p in zip(contexts, batch.contexts))
        self.log.append(("resume", len(contexts)))
        return torch.stack([row(c) for c in contexts])

    def row_kv(self, batch: KeptBatch, i: int, depth: int, copy: bool) -> Any:
        return batch.contexts[i][:depth]


def setup(enabled: bool = True) -> tuple[DecodeBatches, FakeOps, KVReuse]:
    ops = FakeOps()
    return DecodeBatches(ops), ops, KVReuse(None, enabled=enabled)


def step(
    batches: DecodeBatches,
    kv: KVReuse,
    rows: dict[int, Context],
    released: set[int] | None = None,
    bs: int = 4,
) -> torch.Tensor:
    forwarded: list[list[Context]] = []

    def forward(contexts: list[Context]) -> torch.Tensor:
        forwarded.append(contexts)
        return torch.stack([row(c) for c in contexts])

    out = batches.decode_step(rows, released or set(), batch_size=bs, kv=kv, forward=forward, cat=torch.cat)
    assert torch.equal(out, torch.stack([row(c) for c in rows.values()]))  # every row is its context's
    return out


def test_a_batch_resumes_for_the_handles_that_were_there() -> None:
    batches, ops, kv = setup()
    step(batches, kv, {0: (1, 2), 1: (1, 3), 2: (4,)}, bs=2)
    assert ops.log == [("assemble", [0, 0]), ("assemble", [0])]
    step(batches, kv, {0: (1, 2, 5), 1: (1, 3, 6), 2: (4, 7)}, bs=2)
    assert ops.log[2:] == [("resume", 2), ("resume", 1)]
    assert batches.stats()["decode_batches_resumed"] == 2


def test_new_handles_start_from_the_kept_rows_kv_without_resuming_them() -> None:
    """The contexts extend the kept ones row by row (prefix matching would resume), but
    under new handles: rows of a resample, assembled from their parents' kept KV."""
    batches, ops, kv = setup()
    step(batches, kv, {0: (1, 2), 1: (1, 3)})
    step(batches, kv, {2: (1, 2, 5), 3: (1, 3, 6)}, released={0, 1})
    assert ops.log == [("assemble", [0, 0]), ("assemble", [2, 2])]


def test_a_released_handle_added_again_is_a_new_row() -> None:
    batches, ops, kv = setup()
    step(batches, kv, {0: (1, 2)})
    step(batches, kv, {0: (1, 2, 5)}, released={0})
    assert ops.log == [("assemble", [0]), ("assemble", [2])]
    step(batches, kv, {0: (1, 2, 5, 6)})  # its new row continues
    assert ops.log[-1] == ("resume", 1)


def test_every_row_of_a_batch_must_continue_it() -> None:
    batches, ops, kv = setup()
    step(batches, kv, {0: (1, 2), 1: (1, 3)})
    step(batches, kv, {0: (1, 2, 5), 1: (1, 3, 6, 7)})  # row 1 jumped two tokens
    assert ops.log[-1] == ("assemble", [2, 0])


def test_duplicate_contexts_are_one_row_and_part_next_step() -> None:
    batches, ops, kv = setup()
    out = step(batches, kv, {0: (1, 2), 1: (1, 2)})
    assert out.shape[0] == 2 and ops.log == [("assemble", [0])]
    step(batches, kv, {0: (1, 2, 5), 1: (1, 2, 6)})
    assert ops.log[-1] == ("assemble", [2, 2])  # both from the one kept row
    step(batches, kv, {0: (1, 2, 5, 8), 1: (1, 2, 6, 9)})
    assert ops.log[-1] == ("resume", 2)


def test_the_burst_ends_with_every_kept_row_in_the_prefix_cache() -> None:
    batches, ops, kv = setup()
    step(batches, kv, {0: (1, 2), 1: (1, 3)})
    step(batches, kv, {0: (1, 2, 5), 1: (1, 3, 6)})
    batches.end_burst({0, 1}, kv)
    assert batches.stats()["decode_batches"] == 0
    assert [d for d, _ in kv.lookup([(1, 2, 5, 9), (1, 3, 6, 9)])] == [3, 3]
    with pytest.raises(ValueError, match="end_burst"):
        step(batches, kv, {})


def test_without_kv_reuse_every_step_runs_forward_in_the_step_loops_batches() -> None:
    batches, ops, kv = setup(enabled=False)
    step(batches, kv, {0: (1, 2), 1: (1, 3), 2: (1, 2)}, bs=1)
    assert ops.log == [] and batches.stats()["decode_batches"] == 0


def test_the_deprecated_step_assembles_from_kept_rows() -> None:
    batches, ops, kv = setup()
    step(batches, kv, {0: (1, 2)})
    with pytest.warns(DeprecationWarning, match="run_batches"):
        outs = batches.step([(1, 2, 5)], 4, kv)
    assert torch.equal(outs[0], row((1, 2, 5)).unsqueeze(0)) and ops.log[-1] == ("assemble", [2])


def test_run_distinct_runs_each_context_once_in_chunks_and_re_expands() -> None:
    contexts = [(1,), (2,), (1,), (3,), (2,), (4,)]
    seen: list[list[list[Context]]] = []

    def as_list(chunks: list[list[Context]]) -> list[Context]:
        seen.append(chunks)
        return [c for chunk in chunks for c in chunk]

    assert run_distinct(contexts, 3, as_list) == contexts
    assert seen == [[[(1,), (2,), (3,)], [(4,)]]]

    def as_tensor(chunks: list[list[Context]]) -> torch.Tensor:
        return torch.stack([row(c) for chunk in chunks for c in chunk])

    assert torch.equal(run_distinct(contexts, 2, as_tensor), torch.stack([row(c) for c in contexts]))
    distinct = [(1,), (2,)]
    out = as_tensor([distinct])
    assert run_distinct(distinct, 8, lambda chunks: out) is out  # no copy when distinct
    with pytest.raises(ValueError, match="one result per distinct context"):
        run_distinct(contexts, 2, lambda chunks: [])
    with pytest.raises(ValueError, match="batch_size"):
        run_distinct(contexts, 0, as_list)
