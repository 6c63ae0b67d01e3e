"""The fused Llama decode step (genlm_hf.fused) against transformers' own forward.

The oracle is the model's uncached forward over each whole context (transformers'
LlamaForCausalLM, another implementation of the same arithmetic); the bound is
:func:`~genlm_core.testing.tolerance.row_atol` for two paths in the dtype. The step runs
in a decode-step bucket over a KV pool whose columns hold the model's own KV of each
context's past (written from transformers' cache, not by genlm-hf), with and without a
shared span. Configurations cover what the tiny Llama does not: several KV heads with
several query heads each (grouped-query attention's grouping), scaled rope (``llama3``,
``linear``), a tied head, Mistral, Qwen2's q/k/v biases, Qwen3's per-head q and k norms,
bfloat16, padded rows and columns; the real SmolLM2-135M (9 query heads over 3 KV heads,
30 layers) runs through the engine.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from genlm_hf.cache_names import output_cache
from genlm_hf.fused import FusedLlama, fused_reason
from genlm_hf.pass_layout import PassRow, extend_rows, lay_out
from genlm_hf.pool import KVPool, KVSeq
from genlm_hf.pool_probe import probe_layout
from genlm_hf.step import StepBucket
from hf_helpers import load_hf, make_lora_adapter

from genlm_core.testing.tolerance import ModelShape, assert_rows_close

#: name -> (architecture, its config's options beyond the common ones)
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "gqa-llama3": (
        "llama",
        dict(
            num_attention_heads=4,
            num_key_value_heads=2,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
    ),
    "gqa3-linear-tied": (
        "llama",
        dict(
            num_attention_heads=6,
            num_key_value_heads=3,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0},
        ),
    ),
    "mha": ("llama", dict(num_attention_heads=4, num_key_value_heads=4)),
    "mistral": ("mistral", dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=None)),
    "qwen2-bias": ("qwen2", dict(num_attention_heads=6, num_key_value_heads=2)),
    "qwen3-qk-norm": ("qwen3", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=24)),
}


#: layer 0 of the models below (hidden size 96) as the tolerance's model of the arithmetic
KV_SHAPE = ModelShape(width=96, layers=1)


def _model(name: str, dtype: torch.dtype, device: str = "cpu", **extra: Any) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(7)
    arch, options = CONFIGS[name]
    common = dict(
        vocab_size=96, hidden_size=96, intermediate_size=160, num_hidden_layers=2, max_position_embeddings=256
    )
    config = AutoConfig.for_model(arch, **{**common, **options, **extra})
    model = AutoModelForCausalLM.from_config(config).to(dtype=dtype, device=device).eval()
    with torch.no_grad():  # logits spread over several nats, as a trained model's; biases and
        model.lm_head.weight.mul_(8.0)  # per-head norm weights away from their init
        for p_name, p in model.named_parameters():
            if p_name.endswith(
                ("q_proj.bias", "k_proj.bias", "v_proj.bias", "q_norm.weight", "k_norm.weight")
            ):
                p.add_(torch.randn_like(p) * 0.5)
    return model


def _model_kv(model: Any, ctx: list[int]) -> list[Any]:
    """The model's own cache layers of ``ctx`` (one uncached prefill)."""
    return output_cache(model(torch.tensor([ctx], device=model.device), use_cache=True)).layers


def _step(
    fused: FusedLlama, model: Any, contexts: list[list[int]], rows_bucket: int, shared: int = 0
) -> torch.Tensor:
    """The fused step over a pool holding each context's past, as the model computed it:
    ``shared`` leading tokens common to every context held once (one span), in a bucket
    of ``rows_bucket`` rows (padding rows past the contexts)."""
    pool = KVPool(probe_layout(model, 0), None)

    def write(seq_slots: list[int], layers: list[Any], start: int) -> None:
        for layer, lay in enumerate(layers):
            n = len(seq_slots)
            pool.storage[layer, 0, :, seq_slots] = lay.keys[0, :, start : start + n]
            pool.storage[layer, 1, :, seq_slots] = lay.values[0, :, start : start + n]

    prompt = KVSeq(pool)
    if shared:
        write(prompt.extend(shared), _model_kv(model, contexts[0][:shared]), 0)
    rows = []
    for ctx in contexts:
        seq = prompt.fork()
        write(seq.extend(len(ctx) - 1 - shared), _model_kv(model, ctx[:-1]), shared)
        rows.append(PassRow(tuple(ctx), len(ctx) - 1, seq))
    layout = lay_out(rows, extend_rows(rows), min_span=16, max_spans=1)
    if shared:  # the prompt's full pages: one span every row reads
        assert layout.spans[0] == (list(range(len(rows))), shared // pool.page * pool.page)
    B = rows_bucket
    U = max(16, layout.width)
    L = 64 if layout.spans else 0
    bucket = StepBucket(model, pool, (B, U, L), fused, graph=pool.layout.device.type == "cuda")
    bucket.fill(rows, layout, pad_id=0)
    logits = bucket.run()[: len(rows)].clone()
    # the new token's KV went where the model's own prefill of the whole context puts it
    dtype = str(pool.layout.dtype).removeprefix("torch.")
    for i, ctx in enumerate(contexts):
        whole = _model_kv(model, ctx)[0]
        col = len(ctx) - 1
        # layer 0's key and value: a norm and a projection of the token's embedding (and the
        # rope) on each side, well within one block's bound in the model's dtype
        for j, want in enumerate((whole.keys[0, :, col], whole.values[0, :, col])):
            got = pool.storage[0, j, :, layout.new[i][0]]
            assert_rows_close(got, want, KV_SHAPE, dtype=dtype, what=f"row {i}: the new {'kv'[j]} written")
    return torch.log_softmax(logits.float(), dim=-1).cpu()


def _uncached(model: Any, contexts: list[list[int]]) -> torch.Tensor:
    rows = [model(torch.tensor([c], device=model.device)).logits[0, -1] for c in contexts]
    return torch.log_softmax(torch.stack(rows).float(), dim=-1).cpu()


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_the_fused_step_equals_the_models_forward(name: str, dtype: str, device: str) -> None:
    if device == "cuda" and not torch.cuda.is_available():  # pragma: no cover - GPU
        pytest.skip("no CUDA device (the cuda marker deselects this test on such machines)")
    model = _model(name, getattr(torch, dtype), device)
    g = torch.Generator().manual_seed(3)
    contexts = [torch.randint(1, 96, (k,), generator=g).tolist() for k in (3, 17, 9)]
    prompt = torch.randint(1, 96, (37,), generator=g).tolist()
    sharing = [prompt + c for c in contexts]
    shape = ModelShape(width=160, layers=2)
    with torch.inference_mode():
        before = _uncached(model, contexts)
        fused = FusedLlama.build(model)
        want = _uncached(model, contexts)
        # the model's weights are views of the fused ones: its own forward is unchanged
        assert torch.equal(before, want)
        attn = model.model.layers[0].self_attn
        assert (
            attn.k_proj.weight.untyped_storage().data_ptr()
            == fused.layers[0].qkv.untyped_storage().data_ptr()
        )
        for rows_bucket in (4, 3):  # a padding row, or none
            got = _step(fused, model, contexts, rows_bucket)
            assert_rows_close(got, want, shape, dtype=dtype, what=f"{name} {dtype} {device} {rows_bucket}")
        got = _step(fused, model, sharing, 4, shared=len(prompt))  # a span of 32 columns
        want = _uncached(model, sharing)
        assert_rows_close(got, want, shape, dtype=dtype, what=f"{name} {dtype} {device}: a shared span")


def test_what_cannot_take_the_fused_step() -> None:
    from genlm_core.testing import models

    assert fused_reason(_model("mha", torch.float32)) is None
    assert "biases" in fused_reason(_model("mha", torch.float32, attention_bias=True))  # o_proj's too
    assert "biases" in fused_reason(_model("mha", torch.float32, mlp_bias=True))
    assert "sliding" in fused_reason(_model("mistral", torch.float32, sliding_window=64))
    assert "hidden_act" in fused_reason(_model("mha", torch.float32, hidden_act="gelu"))
    dynamic = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    assert "dynamic" in fused_reason(_model("mha", torch.float32, rope_parameters=dynamic))
    gpt2 = load_hf(str(models.tiny_model("gpt2")), static_decode="on")
    try:
        stats = gpt2.stats()["engine"]
        assert stats["fused_decode"] is False and "GPT2LMHeadModel" in stats["fused_decode_off"]
    finally:
        gpt2.close()


def _steps(llm: Any, prompts: list[list[int]], steps: int, vocab: int) -> list[list[tuple[int, ...]]]:
    """The contexts of each call: the prompts, then one random token a step each."""
    g = torch.Generator().manual_seed(5)
    rows = [tuple(p) for p in prompts]
    out = [list(rows)]
    for _ in range(steps):
        rows = [c + (int(torch.randint(3, vocab, (1,), generator=g)),) for c in rows]
        out.append(list(rows))
    return out


def _check_steps(llm: Any, program: list[list[tuple[int, ...]]], what: str) -> None:
    from genlm_core.testing.tolerance import model_shape

    shape = model_shape(llm)
    llm.clear_cache()
    for step, contexts in enumerate(program):
        got = llm.batch_next_token_logprobs_sync(contexts)
        ref = llm.rows.finalize(torch.stack(llm.engine.forward_uncached(contexts)))
        assert_rows_close(got, ref, shape, what=f"{what}, step {step}: decode step vs uncached")


def test_smollm2_through_the_engine() -> None:
    from genlm_core.testing import models

    path = str(models.smollm2())
    llm = load_hf(path, static_decode="on", batch_size=4, cache_size=0)
    try:
        assert llm.stats()["engine"]["fused_decode"] is True
        prompts = [list(llm.tokenizer.encode(t)) for t in ("Montreal is", "The cat sat on the", "1, 2, 3,")]
        _check_steps(llm, _steps(llm, prompts, 3, len(llm.byte_vocab)), "SmolLM2-135M fused")
        assert llm.stats()["engine"]["static_steps"] >= 3
    finally:
        llm.close()


def test_a_lora_adapter_turns_the_fused_step_off(tiny_llama_path: str, tmp_path: Any) -> None:
    pytest.importorskip("peft")
    adapter = make_lora_adapter(tiny_llama_path, tmp_path / "a", seed=1)
    llm = load_hf(tiny_llama_path, static_decode="on", batch_size=4, cache_size=0)
    try:
        assert llm.stats()["engine"]["fused_decode"] is True
        llm.load_lora(adapter, "a")
        llm.set_lora("a")
        stats = llm.stats()["engine"]
        assert stats["fused_decode"] is False and "'a'" in stats["fused_decode_off"]
        # the adapter's rows on the static path (the model's own forward, adapted)
        _check_steps(llm, _steps(llm, [[5, 6, 7], [9, 10]], 3, 100), "tiny Llama with a LoRA adapter")
    finally:
        llm.close()


@pytest.mark.parametrize("name", ["qwen2-bias", "qwen3-qk-norm"])
def test_other_architectures_through_the_engine(name: str, tiny_llama_path: str, tmp_path: Any) -> None:
    """A random Qwen2 (q/k/v biases) and Qwen3 (per-head q/k norms, a head_dim of its own)
    saved as a model folder with the tiny Llama's tokenizer: calls on the fused decode step
    against the uncached model."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_path)
    model = _model(name, torch.float32, vocab_size=len(tokenizer))
    model.save_pretrained(str(tmp_path))
    tokenizer.save_pretrained(str(tmp_path))
    llm = load_hf(str(tmp_path), static_decode="on", batch_size=4, cache_size=0)
    try:
        assert llm.stats()["engine"]["fused_decode"] is True
        _check_steps(llm, _steps(llm, [[5, 6, 7], [9, 10], [11, 12, 13, 14, 15]], 4, 100), f"{name} fused")
        assert llm.stats()["engine"]["static_steps"] >= 4
    finally:
        llm.close()


def test_a_fused_step_that_fails_at_once_falls_back_to_the_models(
    tiny_llama_path: str, monkeypatch: Any
) -> None:
    """An op the fused step needs and this torch or device lacks: its first step raises, and
    the decode step runs the model's own forward instead (same rows as the uncached model)."""

    def broken(self: FusedLlama, *args: Any) -> torch.Tensor:
        raise NotImplementedError("an op this device lacks")

    monkeypatch.setattr(FusedLlama, "step", broken)
    llm = load_hf(tiny_llama_path, static_decode="on", batch_size=4, cache_size=0)
    try:
        assert llm.stats()["engine"]["fused_decode"] is True
        _check_steps(llm, _steps(llm, [[5, 6, 7], [9, 10]], 3, 100), "after the fused step failed")
        stats = llm.stats()["engine"]
        assert stats["fused_decode"] is False and "an op this device lacks" in stats["fused_decode_off"]
        assert stats["static_steps"] >= 3
    finally:
        llm.close()
