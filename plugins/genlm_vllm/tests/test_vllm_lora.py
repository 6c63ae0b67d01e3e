"""LoRA adapters: load / set / clear, caches dropped on switch, rows match peft.
The engine is the session's LoRA-enabled tiny engine (``tiny_lora_backend``, also the
TP=1 LoRA reference of the distributed suite)."""

from __future__ import annotations

import pytest
import torch
from oracles import build_lora_adapter, max_abs_diff

from genlm_core.testing import LogprobBackendConformance
from genlm_core.testing.tolerance import assert_tiny_close


def _peft_rows(tiny_path: str, adapter: str, contexts: list[list[int]], V: int) -> torch.Tensor:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter).eval()
    with torch.no_grad():
        return torch.stack(
            [torch.log_softmax(model(torch.tensor([c])).logits[0, -1, :V].float(), -1) for c in contexts]
        )


def test_lora_switching(tiny_path, tiny_lora_adapter, tiny_lora_backend) -> None:
    contexts = [[5, 6, 7, 8], [40, 41, 42, 43, 44, 45, 46, 47, 48], [300]]
    from genlm_core.protocols import LoraBackend

    adapter, llm = tiny_lora_adapter, tiny_lora_backend
    assert isinstance(llm, LoraBackend)
    llm.clear_lora()
    llm.clear_cache()
    V = len(llm.byte_vocab)
    base = llm.batch_next_token_logprobs_sync(contexts)
    llm.load_lora(adapter, "a")
    assert llm.active_lora is None
    llm.set_lora("a")
    assert llm.active_lora == "a"
    try:
        tuned = llm.batch_next_token_logprobs_sync(contexts)  # not served from the cache
        assert tuned.shape == (len(contexts), V)
        assert max_abs_diff(tuned, base) > 1e-2
        assert_tiny_close(tuned, _peft_rows(tiny_path, adapter, contexts, V))
    finally:
        llm.clear_lora()
    again = llm.batch_next_token_logprobs_sync(contexts)
    assert_tiny_close(again, base)
    with pytest.raises(ValueError, match="no LoRA adapter named"):
        llm.set_lora("missing")
    with pytest.raises(ValueError, match="not found"):
        llm.load_lora("/nonexistent/adapter", "b")
    with pytest.raises(ValueError, match="already loaded"):  # the same rule as genlm-hf
        llm.load_lora(adapter, "a")


def test_switching_adapters_in_a_burst_restarts_its_sessions(
    tiny_path, tiny_lora_adapter, tiny_lora_backend
) -> None:
    """A burst's rows are vLLM sessions holding KV between steps (genlm_vllm.sessions); a
    program switching the adapter between two steps gets, from then on, the adapter's rows
    (peft's own forward, no cache), not rows over KV the base weights computed; and the
    rows before the switch are the base model's (the engine's uncached pass)."""
    from genlm_core.testing.burst import AdapterSwitchControl, SMCProgram

    llm = tiny_lora_backend
    llm.clear_lora()
    llm.clear_cache()
    if "a" not in llm.adapters.paths:
        llm.load_lora(tiny_lora_adapter, "a")
    program = SMCProgram([5, 6, 7, 8], llm.eos_token_ids, n=4, max_tokens=7, resample_every=0, seed=3)
    control = AdapterSwitchControl(llm, program, "a", at=3)
    try:
        llm.run_burst(control, max_steps=8)
    finally:
        llm.clear_lora()
    seen = control.seen
    before = [(c, row) for c, row, lora in seen if lora is None]
    after = [(c, row) for c, row, lora in seen if lora == "a"]
    assert len(after) >= 8 and len(before) >= 8
    V = len(llm.byte_vocab)
    ref = _peft_rows(tiny_path, tiny_lora_adapter, [c for c, _ in after], V)
    assert_tiny_close(torch.stack([row for _, row in after]), ref)
    base = torch.stack([llm.next_token_logprobs_uncached(c) for c, _ in before])
    assert_tiny_close(torch.stack([row for _, row in before]), base)
    assert llm.stats()["engine"]["decode_sessions"] == 0


class _LoraKit(LogprobBackendConformance):
    """The conformance kit's LoRA check on the session's LoRA engine (only that check:
    the kit's other checks run on ``tiny_backend``, test_vllm_conformance.py)."""

    n_contexts = 8
    max_len = 40
    folders: list[str] = []

    def lora_adapters(self, backend):
        return self.folders


def test_lora_conformance(tiny_path, tiny_lora_backend, tmp_path) -> None:
    """The kit's ``test_lora`` (capability ``"lora"``, bookkept by the core): loading
    changes no row, an active adapter's rows equal its uncached rows, no row is served
    across adapters, ``clear_lora`` restores the base."""
    kit = _LoraKit()
    kit.folders = [build_lora_adapter(tiny_path, tmp_path / f"a{seed}", 20.0, seed) for seed in (1, 2)]
    tiny_lora_backend.clear_lora()
    kit.test_lora(tiny_lora_backend)


def test_lora_disabled_is_a_clear_error(tiny_backend, tiny_lora_adapter) -> None:
    """An engine started without ``enable_lora`` refuses an adapter, naming the fix, and
    keeps no trace of it."""
    assert tiny_backend.supports_lora
    with pytest.raises(ValueError, match="LoRA is disabled: build the backend with enable_lora=True"):
        tiny_backend.load_lora(tiny_lora_adapter, "x")
    assert "x" not in tiny_backend.loras and tiny_backend.active_lora is None
