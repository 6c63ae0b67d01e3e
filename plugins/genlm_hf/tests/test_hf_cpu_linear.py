"""Linear layers through oneDNN over packed weights (genlm_hf.cpu_linear), on the CPU.

The oracle is the same model with its layers as loaded (MKL's product): rows of both are
two float32 computations of the same network, compared at the bound derived from the
arithmetic. Unpacking (a LoRA adapter loads) must give back exactly the weights, and the
tie of a head to the input embedding."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from genlm_hf.cpu_linear import PackedLinear, pack_linears, packing_problem, unpack_linears
from hf_helpers import load_hf, reference

from genlm_core.testing.tolerance import assert_backend_close


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_packed_rows_equal_the_models_own(name: str) -> None:
    from genlm_core.testing import models

    path = str(models.tiny_model(name))
    packed = load_hf(path, cache_size=0)
    plain = load_hf(path, cache_size=0, cpu_packed_linears=False)
    try:
        stats = packed.stats()["engine"]
        assert stats["cpu_packed_linears"] > 0 and stats["cpu_packed_linears_off"] is None
        assert plain.stats()["engine"]["cpu_packed_linears"] == 0
        g = torch.Generator().manual_seed(1)
        ctxs = [torch.randint(3, packed.vocab_size, (k,), generator=g).tolist() for k in (1, 7, 30)]
        got = packed.batch_next_token_logprobs_sync(ctxs)
        assert_backend_close(packed, got, reference(plain, ctxs), "packed vs MKL")
    finally:
        packed.close()
        plain.close()


def test_unpacking_gives_back_the_weights_and_the_tie() -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "llama", vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.inference_mode():
        want = model(ids).logits
    assert packing_problem(model) is None
    n = pack_linears(model)
    assert n == 8 and isinstance(model.lm_head, PackedLinear)  # q k v o, gate up down, head
    assert model.lm_head.tied is model.model.embed_tokens.weight
    with torch.inference_mode():
        got = model(ids).logits
    assert float((got - want).abs().max()) < 1e-4 * float(want.abs().max())  # float32 rounding
    assert unpack_linears(model) == n
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied again
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)


def test_what_keeps_mkl() -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        "llama", vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1
    )
    model: Any = AutoModelForCausalLM.from_config(config).eval()
    assert "float16" in packing_problem(model.to(torch.float16))
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    assert "meta" in packing_problem(meta)


def test_a_lora_adapter_unpacks(tiny_llama_path: str, tmp_path: Any) -> None:
    pytest.importorskip("peft")
    from hf_helpers import make_lora_adapter

    adapter = make_lora_adapter(tiny_llama_path, tmp_path / "a", seed=2)
    llm = load_hf(tiny_llama_path, cache_size=0)
    try:
        assert llm.stats()["engine"]["cpu_packed_linears"] > 0
        ctx = [5, 6, 7, 8]
        base = llm.next_token_logprobs_sync(ctx)
        llm.load_lora(adapter, "a")
        stats = llm.stats()["engine"]
        assert stats["cpu_packed_linears"] == 0 and "'a'" in stats["cpu_packed_linears_off"]
        assert_backend_close(llm, llm.next_token_logprobs_sync(ctx), base, "base model after unpacking")
        llm.set_lora("a")
        adapted = llm.next_token_logprobs_sync(ctx)
        assert float((adapted - base).abs().max()) > 1e-3  # the adapter is applied
    finally:
        llm.close()
