"""LoRA adapters through peft: a tiny random adapter built offline on the tiny Llama."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hf_helpers import load_hf, make_lora_adapter, max_diff

from genlm_core.testing.tolerance import assert_tiny_close

peft = pytest.importorskip("peft")
pytestmark = pytest.mark.filterwarnings("ignore:Already found a `peft_config`:UserWarning")

CONTEXTS = [[5, 6, 7], [5, 6, 7, 8, 9], [40, 41]]


def _make_adapter(base_path: str, out: Path, seed: int) -> Path:
    return make_lora_adapter(base_path, out, seed)


def _peft_reference(base_path: str, adapter: Path, contexts: list[list[int]]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(model, str(adapter)).eval()
    with torch.inference_mode():
        rows = [model(torch.tensor([c])).logits[0, -1] for c in contexts]
    return torch.log_softmax(torch.stack(rows).float(), dim=-1)


@pytest.fixture(scope="module")
def adapters(tiny_llama_path: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora")
    return {name: _make_adapter(tiny_llama_path, root / name, seed) for name, seed in (("a", 1), ("b", 2))}


def test_lora_changes_distributions_and_clear_restores(
    tiny_llama_path: str, adapters: dict[str, Path]
) -> None:
    from genlm_core.protocols import LoraBackend

    llm = load_hf(tiny_llama_path)
    try:
        assert isinstance(llm, LoraBackend)
        base = llm.batch_next_token_logprobs_sync(CONTEXTS)
        llm.load_lora(adapters["a"], "a")
        llm.load_lora(adapters["b"], "b")
        assert llm.active_lora is None
        assert_tiny_close(llm.batch_next_token_logprobs_sync(CONTEXTS), base)  # loading alone: no change
        llm.cache_kv(CONTEXTS[0])
        llm.set_lora("a")
        assert llm.prefix_cache.kv_bytes == 0 and len(llm.output_cache) == 0  # switching cleared caches
        with_a = llm.batch_next_token_logprobs_sync(CONTEXTS)
        assert max_diff(with_a, base) > 1e-2
        assert_tiny_close(with_a, _peft_reference(tiny_llama_path, adapters["a"], CONTEXTS))
        # KV reuse under the adapter stays exact
        ext = [c + [11] for c in CONTEXTS]
        assert_tiny_close(
            llm.batch_next_token_logprobs_sync(ext),
            torch.stack([llm.next_token_logprobs_uncached(c) for c in ext]),
        )
        llm.set_lora("b")
        with_b = llm.batch_next_token_logprobs_sync(CONTEXTS)
        assert max_diff(with_b, with_a) > 1e-2
        assert_tiny_close(with_b, _peft_reference(tiny_llama_path, adapters["b"], CONTEXTS))
        llm.clear_lora()
        assert llm.active_lora is None
        assert_tiny_close(llm.batch_next_token_logprobs_sync(CONTEXTS), base)
        with pytest.raises(ValueError, match="no LoRA adapter named 'c'"):
            llm.set_lora("c")
        with pytest.raises(ValueError, match="already loaded"):
            llm.load_lora(adapters["a"], "a")
    finally:
        llm.close()


def test_lora_from_config(tiny_llama_path: str, adapters: dict[str, Path]) -> None:
    llm = load_hf(tiny_llama_path, lora_path=str(adapters["a"]), lora_name="mine")
    try:
        assert llm.active_lora == "mine"
        ref = _peft_reference(tiny_llama_path, adapters["a"], CONTEXTS[:1])[0]
        assert_tiny_close(llm.next_token_logprobs_sync(CONTEXTS[0]), ref)
    finally:
        llm.close()


def test_switching_adapters_in_a_burst_drops_its_kept_kv(
    tiny_llama_path: str, adapters: dict[str, Path]
) -> None:
    """A burst's rows resume from KV kept between its steps (the pool); a program switching
    the adapter between two steps gets, from then on, the new adapter's rows (peft's own
    forward, no cache), not rows over KV the old weights computed."""
    from genlm_core.testing.burst import AdapterSwitchControl, SMCProgram

    llm = load_hf(tiny_llama_path)
    try:
        llm.load_lora(adapters["a"], "a")
        program = SMCProgram([5, 6, 7, 8], llm.eos_token_ids, n=4, max_tokens=7, resample_every=0, seed=3)
        control = AdapterSwitchControl(llm, program, "a", at=3)
        llm.run_burst(control, max_steps=8)
        after = [(c, row) for c, row, lora in control.seen if lora == "a"]
        assert len(after) >= 8
        ref = _peft_reference(tiny_llama_path, adapters["a"], [c for c, _ in after])
        assert_tiny_close(torch.stack([row for _, row in after]), ref)
    finally:
        llm.close()
