"""``dtype`` on the vLLM backend: "auto" is the checkpoint's dtype (vLLM's own "auto"
runs a float32 checkpoint in bfloat16 on CPU), and ``llm.dtype`` is the dtype of the
engine's weights, read here independently of the backend."""

from __future__ import annotations

import pytest
import torch

import genlm_core
from genlm_core.engine import UnsupportedDtypeError

# starts and closes in-process engines of its own: a process of its own (scripts/test.sh)
pytestmark = pytest.mark.own_process


def _worker_weight_dtypes(worker) -> list[str]:
    return sorted({str(p.dtype).removeprefix("torch.") for p in worker.get_model().parameters()})


def test_auto_runs_a_float32_checkpoint_in_float32(tiny_path) -> None:
    llm = genlm_core.load("vllm", model=tiny_path, enforce_eager=True, max_model_len=128)
    try:
        (weights,) = llm.llm.collective_rpc(_worker_weight_dtypes)
        assert weights == ["float32"]
        assert llm.dtype == "float32"
        assert llm.next_token_logprobs_sync([1, 2, 3]).dtype == torch.float32
    finally:
        llm.close()


def test_engine_opts_dtype_is_refused(tiny_path) -> None:
    with pytest.raises(ValueError, match=r"engine_opts\['dtype'\].*pass dtype="):
        genlm_core.load("vllm", model=tiny_path, engine_opts={"dtype": "auto"})


def test_unsupported_dtype_is_refused_not_substituted(tiny_path, monkeypatch) -> None:
    from vllm.platforms import current_platform

    monkeypatch.setattr(type(current_platform), "supported_dtypes", property(lambda self: [torch.float32]))
    with pytest.raises(UnsupportedDtypeError, match="dtype='bfloat16' cannot run on device 'cpu'"):
        genlm_core.load("vllm", model=tiny_path, dtype="bfloat16")
