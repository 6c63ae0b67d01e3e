"""The KV cache goes to a model by the name its forward declares.

transformers 5.24 renamed the forward's ``past_key_values`` to ``cache``; the old name
logs a deprecation there and goes in 5.40, which genlm-hf's pin admits. CI's suites run
the transformers vLLM pins (5.19: the old name), and the installed-wheel tests
(``scripts/test_artifacts.py``) the newest on the index: each checks its own version.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from genlm_hf.cache_names import cache_kwarg, output_cache
from hf_helpers import load_hf, reference

from genlm_core.testing.tolerance import assert_backend_close


@pytest.fixture
def transformers_log() -> Iterator[list[str]]:
    """What transformers logs at WARNING and above while the test runs (its library
    logger does not propagate to pytest's), with ``warning_once``'s memory cleared so
    a message logged earlier in the session shows again."""
    once = getattr(logging.Logger, "warning_once", None)
    if hasattr(once, "cache_clear"):
        once.cache_clear()
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Keep(logging.WARNING)
    logger = logging.getLogger("transformers")
    logger.addHandler(handler)
    try:
        yield seen
    finally:
        logger.removeHandler(handler)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_the_cache_goes_by_a_name_the_forward_declares(name: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    from genlm_core.testing import models as model_paths

    model = AutoModelForCausalLM.from_pretrained(str(model_paths.tiny_model(name)), dtype=torch.float32)
    kwarg = cache_kwarg(model)
    assert kwarg in inspect.signature(model.forward).parameters, (kwarg, model.forward)
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([[5, 6, 7]]), use_cache=True, **{kwarg: cache})
        assert output_cache(out) is cache  # the forward wrote into the cache it was given
        assert cache.get_seq_length() == 3
        assert output_cache(model(input_ids=torch.tensor([[5]]), use_cache=False)) is None


@pytest.mark.parametrize(
    "options",
    [{}, {"static_decode": "on"}, {"static_decode": "on", "fused_decode": False}],
    ids=["kv-reuse", "static-fused", "static-model-forward"],
)
def test_no_deprecated_cache_name_reaches_transformers(
    tiny_llama_path: str, transformers_log: list[str], options: dict[str, Any]
) -> None:
    """Prefill, KV reuse and the static step (fused, and the model's own forward in the
    static slots): rows right, and nothing logged about ``past_key_values``."""
    import torch

    llm = load_hf(tiny_llama_path, **options)
    try:
        contexts = [[5, 6, 7], [5, 6, 8, 9]]
        got = [llm.batch_next_token_logprobs_sync(contexts)]
        for tok in (11, 12, 13):  # every row one token longer: resumed / resident rows
            contexts = [c + [tok] for c in contexts]
            got.append(llm.batch_next_token_logprobs_sync(contexts))
        assert_backend_close(llm, got[-1], reference(llm, contexts), "rows after three one-token steps")
        assert torch.isfinite(torch.stack(got)).all()
    finally:
        llm.close()
    cache_noise = [m for m in transformers_log if "past_key_values" in m or "cache_params" in m]
    assert not cache_noise, cache_noise
