"""The defect catalogue's machinery (genlm_core.testing.defects) on the mock engine: a
defect changes what the engine serves and nothing else (the uncached reference stays
right, nothing outlives the block), and catch() fails when a gate cannot see a defect or
never meets it. Each engine's own catalogue run lives with its plugin's tests."""

from __future__ import annotations

import pytest
import torch

import genlm_core
from genlm_core.testing.defects import CATALOGUE, NeighbourRow, Scale, StaleRow, inject
from genlm_core.testing.gates import Gate, catch, gate_settings, measure


@pytest.fixture
def llm():
    backend = genlm_core.load("mock")
    yield backend
    backend.close()


def test_a_defect_changes_the_served_rows_only_inside_its_block(llm) -> None:
    ctx, longer = [5, 6, 7], [5, 6, 7, 8]
    right = llm.next_token_logprobs_uncached(longer)
    with inject(llm, StaleRow()) as inj:
        llm.next_token_logprobs_sync(ctx)
        stale = llm.next_token_logprobs_sync(longer)  # resumes ctx: the row of ctx
        assert torch.equal(stale, llm.next_token_logprobs_uncached(ctx))
        assert torch.equal(llm.next_token_logprobs_uncached(longer), right)  # the reference stays right
        assert inj.altered == 1 and inj.resumed_prefix(tuple(longer)) == tuple(ctx)
        llm.clear_cache()  # the engine forgets what it computed: nothing is resumed after
        assert inj.resumed_prefix(tuple(longer)) is None
    assert not {"forward", "forward_uncached", "decode_step", "clear_cache"} & set(vars(llm.engine))
    assert torch.equal(llm.next_token_logprobs_sync(longer), right)  # no defective row cached


def test_scale_and_neighbour_rows() -> None:
    llm = genlm_core.load("mock", cache_size=0)
    try:
        ctxs = [[1], [2], [3]]
        right = llm.batch_next_token_logprobs_sync(ctxs)
        with inject(llm, NeighbourRow()):
            assert torch.equal(llm.batch_next_token_logprobs_sync(ctxs), right[[1, 2, 0]])
            assert torch.equal(llm.next_token_logprobs_sync([1]), right[0])  # a batch of one: right
        with inject(llm, Scale(1.1)):
            got = llm.batch_next_token_logprobs_sync(ctxs)
            logits = torch.stack([torch.from_numpy(llm.engine.logits_for((i,))) for i in (1, 2, 3)])
            assert torch.allclose(got, torch.log_softmax(logits * 1.1, -1), atol=1e-6)
    finally:
        llm.close()


def test_catch_fails_when_the_gate_cannot_see_the_defect_or_never_meets_it(llm) -> None:
    settings = gate_settings(llm, atol=0.0)
    blind = Gate("blind", lambda backend, s: backend.batch_next_token_logprobs_sync([[1], [2]]))
    with pytest.raises(AssertionError, match="the gate cannot see this defect"):
        catch(llm, NeighbourRow(), blind, settings)
    idle = Gate("idle", lambda backend, s: None)
    with pytest.raises(AssertionError, match="changed no row"):
        catch(llm, NeighbourRow(), idle, settings)


def test_measure_runs_a_gate_to_its_end(llm) -> None:
    from genlm_core.testing.gates import GATES

    settings = gate_settings(llm, atol=0.0)
    gate = GATES[0]
    clean = measure(llm, None, gate, settings)
    assert clean.ratio == 0.0 and clean.comparisons > 2 * settings.n_contexts and not clean.stopped
    wrong = measure(llm, CATALOGUE[0], gate, settings)
    assert wrong.ratio == float("inf") and wrong.comparisons == clean.comparisons
