"""Independent references: vLLM's ``logprobs=-1`` dictionaries and a plain
transformers forward pass (float32, log_softmax of the last position)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch


def vllm_dict_oracle(backend: Any, contexts: Sequence[Sequence[int]]) -> torch.Tensor:
    """Full distributions through ``SamplingParams(logprobs=-1)`` (test oracle only)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=-1, ignore_eos=True, detokenize=False)
    with backend.batcher.model_lock:
        backend.llm.reset_prefix_cache()
        outs = backend.llm.generate(
            [TokensPrompt(prompt_token_ids=list(c)) for c in contexts], params, use_tqdm=False
        )
    V = len(backend.byte_vocab)
    rows = []
    for out in outs:
        lp = out.outputs[0].logprobs[0]
        row = torch.full((V,), float("-inf"), dtype=torch.float64)
        for tok, entry in lp.items():
            if tok < V:
                row[tok] = entry.logprob
        rows.append(torch.log_softmax(row, -1).float())
    return torch.stack(rows)


@functools.cache
def _hf_model(path: str) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model


def hf_oracle(path: str, contexts: Sequence[Sequence[int]], vocab_size: int) -> torch.Tensor:
    """One unbatched transformers forward pass per context (no padding effects)."""
    model = _hf_model(path)
    rows = []
    with torch.no_grad():
        for c in contexts:
            logits = model(torch.tensor([list(c)])).logits[0, -1, :vocab_size].float()
            rows.append(torch.log_softmax(logits, -1))
    return torch.stack(rows)


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| over finite entries (both must be -inf at the same places)."""
    a, b = a.float().cpu(), b.float().cpu()
    fa, fb = torch.isfinite(a), torch.isfinite(b)
    assert torch.equal(fa, fb), "the two distributions disagree on impossible tokens"
    return float((a[fa] - b[fb]).abs().max()) if fa.any() else 0.0


_OPENED: set[str] = set()


@functools.cache
def _genlm_hf(path: str) -> Any:
    import genlm_core

    _OPENED.add(path)
    return genlm_core.load("hf", model=path, dtype="float32", device="cpu", cache_size=0)


def genlm_hf_oracle(path: str, contexts: Sequence[Sequence[int]]) -> torch.Tensor:
    """genlm-hf's batched distributions for the same model folder (float32, CPU)."""
    return _genlm_hf(path).batch_next_token_logprobs_sync([list(c) for c in contexts])


def close_all() -> None:
    """Release the reference models (end of the test session)."""
    if _genlm_hf.cache_info().currsize:
        for path in list(_OPENED):
            _genlm_hf(path).close()
    _genlm_hf.cache_clear()
    _hf_model.cache_clear()
    _OPENED.clear()
