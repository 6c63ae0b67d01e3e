"""Helpers of the genlm-hf tests (a unique module name: other plugins have a conftest too)."""

from __future__ import annotations

from typing import Any

# batched / cached results are compared with a full uncached forward pass at the bound
# derived from the arithmetic: genlm_core.testing.tolerance.assert_backend_close


def load_hf(path: str, **options: Any) -> Any:
    """A float32 CPU HFBackend through the public entry point; the KV pool required (a
    pool whose self-check fails on this machine fails the tests, it does not fall back)."""
    import genlm_core

    options.setdefault("dtype", "float32")
    options.setdefault("device", "cpu")
    options.setdefault("kv_pool", "required")
    return genlm_core.load("hf", model=path, **options)


def column_bytes(path: str, itemsize: int = 4) -> int:
    """The bytes one column of a static slot takes per row (every layer's K and V of one
    position), from the model's config: bounds in tests are counted in these."""
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(path)
    heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    return cfg.num_hidden_layers * 2 * heads * (cfg.hidden_size // cfg.num_attention_heads) * itemsize


def max_diff(a: Any, b: Any) -> float:
    return float((a.float().cpu() - b.float().cpu()).abs().max())


def reference(llm: Any, contexts: list[list[int]]) -> Any:
    """Full forward passes, one context at a time, no cache of any kind."""
    import torch

    return torch.stack([llm.next_token_logprobs_uncached(c) for c in contexts])


def make_lora_adapter(base_path: str, out: Any, seed: int) -> Any:
    """A tiny random LoRA adapter (peft) for the model in ``base_path``, saved in ``out``:
    random, non-zero B matrices, so the adapter changes the outputs."""
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    cfg = peft.LoraConfig(
        r=4,
        lora_alpha=16,
        target_modules=["q_proj", "v_proj", "down_proj"],
        init_lora_weights=False,
    )
    peft.get_peft_model(model, cfg).save_pretrained(str(out))
    return out
