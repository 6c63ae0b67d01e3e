"""Loading a transformers model and tokenizer from the checkpoint the core read."""

from __future__ import annotations

from typing import Any

from genlm_core.engine import Checkpoint, note
from genlm_core.registry import hardware
from genlm_hf.config import HFConfig

__all__ = ["check_config", "load_model_and_tokenizer", "resolve_device", "supported_dtypes"]


def check_config(config: HFConfig) -> None:
    """Fail early, before any weights are read, on options this machine cannot honour."""
    if config.bitsandbytes_opts:
        wants_cpu = config.device is not None and not str(config.device).startswith("cuda")
        if wants_cpu or not hardware.probe().cuda:
            where = f"device={config.device!r}" if wants_cpu else hardware.probe().cuda_reason
            raise ValueError(
                "bitsandbytes quantization needs a CUDA GPU, but this backend would run "
                f"without one ({where}); drop `bitsandbytes_opts` or run on a CUDA machine"
            )
        import importlib.util

        if importlib.util.find_spec("bitsandbytes") is None:
            raise ValueError(
                "bitsandbytes_opts was given but the `bitsandbytes` package is not installed; "
                "install it with `pip install genlm-hf[bitsandbytes]`"
            )


def resolve_device(requested: str | None) -> str:
    """The torch device to run on: the requested one (checked) or the best one present."""
    import torch

    if requested is not None:
        kind = str(requested).split(":")[0]
        if kind == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device={requested!r} was requested but torch sees no CUDA device")
        if kind == "mps" and not torch.backends.mps.is_available():
            raise ValueError(f"device={requested!r} was requested but torch has no MPS support here")
        if kind not in ("cuda", "mps", "cpu"):
            raise ValueError(f"device={requested!r}: expected 'cuda', 'cuda:N', 'mps' or 'cpu'")
        return str(requested)
    for dev in hardware.probe().devices:  # cheap probe first, then ask torch
        if dev == "cuda" and torch.cuda.is_available():
            return "cuda"
        if dev == "mps" and torch.backends.mps.is_available():
            return "mps"
    return "cpu"


def supported_dtypes(config: HFConfig) -> tuple[str, tuple[str, ...]]:
    """The device the model will run on and the dtypes torch computes in there (no
    bfloat16 on a GPU without it)."""
    import torch

    device = resolve_device(config.device)
    if device.split(":")[0] == "cuda" and not torch.cuda.is_bf16_supported():
        return device, ("float32", "float16")
    return device, ("float32", "float16", "bfloat16")


def load_model_and_tokenizer(checkpoint: Checkpoint, config: HFConfig) -> tuple[Any, Any, str]:
    """``(model, tokenizer, device)`` through transformers' ``from_pretrained``, in the
    dtype the checkpoint resolved (a quantised GGUF under ``"auto"``: float32, what
    transformers dequantises it to)."""
    check_config(config)
    device = resolve_device(config.device)
    dtype = checkpoint.dtype or "float32"
    model = checkpoint.model
    if config.gguf_file is not None:
        note(
            f"hf: loading {config.gguf_file} from {model}: transformers dequantizes every "
            "GGUF tensor first (slow for large models; save_pretrained() once to skip it)"
        )
    else:
        note(f"hf: loading {model} on {device} ({dtype})")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    common: dict[str, Any] = {"trust_remote_code": config.trust_remote_code}
    if config.gguf_file is not None:
        common["gguf_file"] = config.gguf_file
    tokenizer = AutoTokenizer.from_pretrained(model, **common)
    opts: dict[str, Any] = {**common, "dtype": getattr(torch, dtype)}
    if config.device_map is not None:
        opts["device_map"] = config.device_map
    if config.bitsandbytes_opts:
        from transformers import BitsAndBytesConfig

        opts["quantization_config"] = BitsAndBytesConfig(**config.bitsandbytes_opts)
        opts.setdefault("device_map", {"": device})
    opts.update({k: v for k, v in config.hf_opts.items() if k not in ("dtype", "torch_dtype")})
    hf_model = AutoModelForCausalLM.from_pretrained(model, **opts)
    if "device_map" not in opts:
        hf_model = hf_model.to(device)
    hf_model.eval()
    return hf_model, tokenizer, str(hf_model.device)
