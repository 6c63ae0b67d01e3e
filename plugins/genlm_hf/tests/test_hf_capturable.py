"""The decode step can be captured as a CUDA graph: checked on the CPU.

A CUDA graph replays kernels with the values their inputs hold at replay; a step that
reads a device value on the host (``.item()``, ``bool(t)``, ``nonzero``, a shape that
depends on data) or copies a host tensor in while it runs cannot be captured (the
capture raises, or worse, bakes in the value of the capture's step). On a GPU the
engine then falls back to the uncaptured step (slow, still right) and the speed of
issue 44 is gone; on the CPU the step runs without graphs, so no CPU test would see it.

This suite runs the step (:meth:`genlm_hf.step.StepBucket.step`, the model's forward
through the KV pool's attention or the fused Llama step of :mod:`genlm_hf.fused`, with a
shared span and without) with the model, the pool and the inputs on the ``meta`` device,
where tensors have shapes and no values:
an op that needs a value raises there, and a dispatch mode records every op fed a host
tensor of one or more dimensions (0-d host tensors are scalars to a kernel and are
fine in a capture). Run for the architectures the tests build, SmolLM2-135M's config
and SmolLM2-1.7B's shape (the GPU benchmarks' model, scripts/gpu_models.py), in float32
and bfloat16.
A model that calls ``.item()`` in its forward, or mixes a host tensor in, fails the
check (the last tests), so the check can fail.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from genlm_hf.fused import FusedLlama
from genlm_hf.pool import KVLayout, KVPool
from genlm_hf.step import StepBucket
from torch.utils._python_dispatch import TorchDispatchMode

META = torch.device("meta")
ROOT = Path(__file__).resolve().parents[3]


class HostWatch(TorchDispatchMode):
    """Records the ops fed a host tensor of one or more dimensions."""

    def __init__(self) -> None:
        super().__init__()
        self.host_inputs: list[str] = []
        self.ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        self.ops += 1
        flat = [*args, *kwargs.values()]
        flat += [t for a in flat if isinstance(a, (list, tuple)) for t in a]
        if any(isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dim() > 0 for t in flat):
            self.host_inputs.append(str(func))
        return func(*args, **kwargs)


def _config(name: str) -> Any:
    from transformers import AutoConfig

    from genlm_core.testing import models

    if name in ("llama", "gpt2"):
        return AutoConfig.from_pretrained(models.tiny_model(name))
    if name in ("qwen2", "qwen3"):  # the fused step's other architectures, small
        shape = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2)
        return AutoConfig.for_model(name, num_attention_heads=4, num_key_value_heads=2, head_dim=16, **shape)
    spec = importlib.util.spec_from_file_location("gpu_models", ROOT / "scripts" / "gpu_models.py")
    assert spec is not None and spec.loader is not None
    gpu_models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_models)
    source = models.smollm2()
    shape = {"smollm2-135m": "135m", "smollm2-1.7b": "1.7b"}[name]
    config = gpu_models.shape_config(shape, source, "float32")
    return AutoConfig.for_model(**config)


def _meta_slot(
    config: Any, dtype: torch.dtype, rows: int = 4, span: int = 64, fused: bool = False
) -> StepBucket:
    """A decode-step bucket of ``rows`` rows, 32 private columns and a ``span``-column span,
    over a pool on the meta device."""
    from transformers import AutoModelForCausalLM

    with torch.device(META):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    pool = KVPool(KVLayout(config.num_hidden_layers, heads, head_dim, dtype, META), None)
    return StepBucket(model, pool, (rows, 32, span), FusedLlama.build(model) if fused else None, graph=False)


def _run_watched(slot: StepBucket) -> tuple[torch.Tensor, HostWatch]:
    watch = HostWatch()
    with torch.inference_mode(), watch:
        out = slot.step()
    return out, watch


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("span", [0, 64])
@pytest.mark.parametrize("name", ["llama", "gpt2", "smollm2-135m", "smollm2-1.7b"])
def test_the_step_reads_no_device_value_and_no_host_tensor(name: str, span: int, dtype: torch.dtype) -> None:
    config = _config(name)
    slot = _meta_slot(config, dtype, span=span)
    out, watch = _run_watched(slot)
    assert out.shape == (4, config.vocab_size)
    assert watch.ops > 20, "the step ran too few ops to be the model's forward"
    assert not watch.host_inputs, (
        f"{name}/span {span}: ops fed a host tensor inside the step: {watch.host_inputs}"
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3", "smollm2-135m", "smollm2-1.7b"])
def test_the_fused_step_reads_no_device_value_and_no_host_tensor(name: str, dtype: torch.dtype) -> None:
    config = _config(name)
    slot = _meta_slot(config, dtype, fused=True)
    out, watch = _run_watched(slot)
    assert out.shape == (4, config.vocab_size)
    assert watch.ops > 10 * config.num_hidden_layers, "the step ran too few ops to be the fused step"
    assert not watch.host_inputs, f"{name} fused: ops fed a host tensor inside the step: {watch.host_inputs}"


def _patched_forward(slot: StepBucket, extra: Any) -> None:
    model = slot.model
    forward = model.forward

    def patched(*args: Any, **kwargs: Any) -> Any:
        extra(kwargs)
        return forward(*args, **kwargs)

    model.forward = patched


def test_a_step_that_reads_a_device_value_fails_the_check() -> None:
    slot = _meta_slot(_config("llama"), torch.float32)

    def sync(kwargs: dict) -> None:
        if kwargs["position_ids"].all():  # a host sync: bool() of a device tensor
            pass

    _patched_forward(slot, sync)
    with pytest.raises((RuntimeError, NotImplementedError), match="meta"):
        _run_watched(slot)


def test_a_step_that_copies_a_host_tensor_in_fails_the_check() -> None:
    slot = _meta_slot(_config("llama"), torch.float32)

    def host(kwargs: dict) -> None:
        kwargs["position_ids"] = kwargs["position_ids"] + torch.zeros((4, 1), dtype=torch.long).to(META)

    _patched_forward(slot, host)
    _, watch = _run_watched(slot)
    assert watch.host_inputs, "a host tensor copied in went unseen"
