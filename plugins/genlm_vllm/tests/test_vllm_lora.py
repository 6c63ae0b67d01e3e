"""LoRA adapters: load / set / clear, caches dropped on switch, rows match peft."""

from __future__ import annotations

import pytest
import torch
from oracles import max_abs_diff

import genlm_core


@pytest.fixture(scope="module")
def adapter(tiny_path, tmp_path_factory) -> str:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    cfg = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(base, cfg)
    with torch.no_grad():  # a visible effect on the tiny model
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(20.0)
    out = tmp_path_factory.mktemp("lora") / "adapter"
    model.save_pretrained(out)
    return str(out)


def _peft_rows(tiny_path: str, adapter: str, contexts: list[list[int]], V: int) -> torch.Tensor:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter).eval()
    with torch.no_grad():
        return torch.stack(
            [torch.log_softmax(model(torch.tensor([c])).logits[0, -1, :V].float(), -1) for c in contexts]
        )


@pytest.mark.filterwarnings("ignore:closing an in-process vLLM engine:RuntimeWarning")
def test_lora_switching(tiny_path, adapter) -> None:
    contexts = [[5, 6, 7, 8], [40, 41, 42, 43, 44, 45, 46, 47, 48], [300]]
    with genlm_core.load(
        "vllm",
        model=tiny_path,
        dtype="float32",
        enforce_eager=True,
        max_model_len=128,
        enable_lora=True,
        max_lora_rank=8,
    ) as llm:
        V = len(llm.byte_vocab)
        base = llm.batch_next_token_logprobs_sync(contexts)
        llm.load_lora(adapter, "a")
        assert llm.active_lora is None
        llm.set_lora("a")
        assert llm.active_lora == "a"
        tuned = llm.batch_next_token_logprobs_sync(contexts)  # not served from the cache
        assert tuned.shape == (len(contexts), V)
        assert max_abs_diff(tuned, base) > 1e-2
        assert max_abs_diff(tuned, _peft_rows(tiny_path, adapter, contexts, V)) <= 1e-3
        llm.clear_lora()
        again = llm.batch_next_token_logprobs_sync(contexts)
        assert max_abs_diff(again, base) <= 1e-4
        with pytest.raises(ValueError, match="unknown LoRA"):
            llm.set_lora("missing")
        with pytest.raises(ValueError, match="not found"):
            llm.load_lora("/nonexistent/adapter", "b")
