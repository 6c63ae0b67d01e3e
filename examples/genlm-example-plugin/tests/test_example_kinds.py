"""The plugin's cache and byte model, found through its entry point and used by name.

Oracles: an LRU would keep an entry read since it arrived, a FIFO evicts it (the same
reads on the core's ``output`` cache show the difference); the byte model's
distribution is the backend's own row for the same bytes.
"""

import pytest
import torch

import genlm_core


@pytest.fixture
def rows():
    return {(r["kind"], r["name"]): r for r in genlm_core.list_implementations()}


def test_registered_by_this_distribution(rows) -> None:
    assert rows[("cache", "example-fifo")]["distribution"] == "genlm-example"
    assert rows[("byte_model", "example-bytes")]["distribution"] == "genlm-example"


def _after_reads(cache_impl: str) -> list[bool]:
    """Which of a, b, c are cached after a, b, a again (a hit), c, with room for two."""
    llm = genlm_core.load("example-bigram", output_cache_impl=cache_impl, cache_size=2)
    a, b, c = [72], [101], [108]
    for ctx in (a, b, a, c):
        llm.next_token_logprobs_sync(ctx)
    cache = llm.output_cache
    kept = [tuple(x) in cache for x in (a, b, c)]
    assert type(cache).__name__ == {"example-fifo": "FifoCache", "output": "OutputCache"}[cache_impl]
    assert cache.stats()["hits"] == 1
    llm.close()
    return kept


def test_the_backend_keeps_its_rows_in_the_cache_named() -> None:
    assert _after_reads("output") == [True, False, True]  # LRU: the read made a young again
    assert _after_reads("example-fifo") == [False, True, True]  # FIFO: a arrived first, a went first


async def test_the_byte_model_by_name_reads_the_backends_rows() -> None:
    llm = genlm_core.load("example-bigram")
    state = await genlm_core.load_byte_model(llm, "example-bytes", prompt="Th")
    assert torch.equal(await state.logp_next(), llm.next_token_logprobs_sync(list(b"Th")))
    after = await (state << ord("e"))
    assert torch.equal(await after.logp_next(), llm.next_token_logprobs_sync(list(b"The")))
    start = await genlm_core.load_byte_model(llm, "example-bytes")  # after the EOS token
    assert torch.equal(await start.logp_next(), llm.next_token_logprobs_sync([256]))
    with pytest.raises(ValueError, match="0..255"):
        await (state << 300)
    with pytest.raises(genlm_core.ConfigError, match="prompt"):
        await genlm_core.load_byte_model(llm, "example-bytes", promt="x")
    await state.cleanup()
    llm.close()


async def test_the_byte_model_refuses_a_backend_whose_tokens_are_not_bytes() -> None:
    from genlm_core.bytes.testing import TableBackend

    llm = TableBackend([b"a", b"ab", b"<e>"], eos_token_ids=[2])
    with pytest.raises(ValueError, match="single bytes"):
        await genlm_core.load_byte_model(llm, "example-bytes")
    llm.close()
