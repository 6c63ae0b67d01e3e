"""Independent references: vLLM's ``logprobs=-1`` dictionaries and a plain
transformers forward pass (float32, log_softmax of the last position); and the
workloads several suites share (mixed batches, the preemption workload, a LoRA
adapter built offline)."""

from __future__ import annotations

import functools
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch


def vllm_dict_oracle(backend: Any, contexts: Sequence[Sequence[int]]) -> torch.Tensor:
    """Full distributions through ``SamplingParams(logprobs=-1)`` (test oracle only)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=-1, ignore_eos=True, detokenize=False)
    with backend.engine_lock:
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


def assert_smol_close(got: torch.Tensor, want: torch.Tensor, what: str = "rows") -> float:
    """Two float32 computations of SmolLM2-135M rows (engines, batch shapes, TP splits:
    the order of float32 sums only), within the bound derived from that arithmetic."""
    from genlm_core.testing.models import smollm2
    from genlm_core.testing.tolerance import assert_rows_close, model_shape

    return assert_rows_close(got, want, model_shape(smollm2()), what=what)


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


# ---------------------------------------------------------------- workloads


def random_ids(vocab_size: int, n: int, seed: int, avoid: Sequence[int] = ()) -> list[int]:
    """``n`` token ids drawn (seeded) from ``3..vocab_size-1`` less ``avoid`` (EOS ids)."""
    rng = random.Random(seed)
    skip = set(avoid)
    pool = [i for i in range(3, vocab_size) if i not in skip]
    return [rng.choice(pool) for _ in range(n)]


def mixed_batch(backend: Any) -> list[list[int]]:
    """Eight contexts for an engine with a 32-token step budget: a 1-token context,
    a repeated one, two that differ only in their last token, shared prefixes, and a
    90-token one that is prefilled in chunks over several steps."""
    V, eos = len(backend.byte_vocab), backend.eos_token_ids
    base = random_ids(V, 90, 0, eos)
    return [
        base[:1],
        base[:7],
        random_ids(V, 23, 1, eos),
        base[:40],
        base[:41],
        base[:7],  # repeated
        base[:90],  # alone larger than a step's budget: chunked prefill
        base[:40] + random_ids(V, 12, 3, eos),
    ]


#: KV blocks (of :data:`PREEMPTION_BLOCK_SIZE` tokens) the preemption workload is made for
PREEMPTION_BLOCKS = 6
PREEMPTION_BLOCK_SIZE = 32


def preemption_engine_opts() -> dict[str, Any]:
    """``engine_opts`` of an engine on which :func:`run_preemption_workload` preempts:
    6 KV blocks of 32 tokens, and the metrics that count preemptions."""
    return {
        "num_gpu_blocks_override": PREEMPTION_BLOCKS,
        "block_size": PREEMPTION_BLOCK_SIZE,
        "disable_log_stats": False,
    }


def preemptions(backend: Any) -> int:
    """vLLM's preemption counter (needs ``disable_log_stats=False``)."""
    return int(sum(m.value for m in backend.llm.get_metrics() if m.name == "vllm:num_preemptions"))


def run_preemption_workload(backend: Any, tag_prefix: str) -> tuple[list[list[int]], torch.Tensor, int]:
    """Eight requests on an engine with 6 KV blocks of 32 tokens (:func:`preemption_engine_opts`):
    four decodes that grow from 1 block to 3 (80 sampled tokens each) beside four
    captured prompts of 30-100 tokens. The decodes run out of blocks, so requests are
    preempted and recomputed while the captured prompts are prefilled.

    Returns the captured prompts, their logits rows as the backend fetches them (in
    that order, raw: not normalised, possibly wider than ``byte_vocab``) and how many
    preemptions the run caused.
    """
    from genlm_vllm.capture import TAG_KEY
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    rng = random.Random(0)
    prompts: list[list[int]] = []
    params: list[Any] = []
    tags: list[str] = []
    for i in range(8):
        if i % 2 == 0:  # a decode that grows from 1 block to 3
            prompts.append([rng.randrange(3, 1000) for _ in range(10)])
            params.append(SamplingParams(max_tokens=80, ignore_eos=True, temperature=1.0))
        else:
            prompts.append([rng.randrange(3, 1000) for _ in range(rng.randint(30, 100))])
            tags.append(f"{tag_prefix}:preempt{i}")
            params.append(SamplingParams(max_tokens=1, temperature=0.0, extra_args={TAG_KEY: tags[-1]}))
    before = preemptions(backend)
    with backend.engine_lock:
        backend.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        rows, missing = backend.engine.fetch(tags)
    assert not missing, f"no row captured for requests {missing}"
    return [p for i, p in enumerate(prompts) if i % 2], rows, preemptions(backend) - before


# ---------------------------------------------------------------- LoRA


def build_lora_adapter(model_path: str, out: Path, scale: float = 20.0, seed: int = 0) -> str:
    """A random rank-8 LoRA adapter on ``q_proj`` / ``v_proj`` of ``model_path``, saved
    by peft to ``out`` (offline, seconds). ``scale`` multiplies its ``lora_B`` weights:
    the adapter's effect on the log-probabilities grows with it; ``seed`` draws them."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    cfg = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(base, cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(scale)
    model.save_pretrained(out)
    return str(out)
