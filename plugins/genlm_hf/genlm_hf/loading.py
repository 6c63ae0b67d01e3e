"""Loading a transformers model and tokenizer from the checkpoint the core read, on the
device and in the dtype it placed (:mod:`genlm_core.engine.placement`)."""

from __future__ import annotations

from typing import Any

from genlm_core.engine import Checkpoint, Placement, note
from genlm_hf.config import HFConfig

__all__ = ["check_config", "dtypes_on", "load_model_and_tokenizer"]


def check_config(config: HFConfig, device: str) -> None:
    """Fail early, before any weights are read, on options this placement cannot honour."""
    if config.bitsandbytes_opts:
        if not device.startswith("cuda"):
            raise ValueError(
                "bitsandbytes quantization needs a CUDA GPU, but this backend would run on "
                f"{device!r}; drop `bitsandbytes_opts` or run on a CUDA machine"
            )
        import importlib.util

        if importlib.util.find_spec("bitsandbytes") is None:
            raise ValueError(
                "bitsandbytes_opts was given but the `bitsandbytes` package is not installed; "
                "install it with `pip install genlm-hf[bitsandbytes]`"
            )


def dtypes_on(device: str) -> tuple[str, ...]:
    """The dtypes torch computes in on ``device`` (no bfloat16 on a GPU without it); a
    ``ValueError`` naming the fix where this torch cannot run on ``device`` at all."""
    import torch

    kind = device.split(":")[0]
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device={device!r}: this machine has a GPU but torch sees no CUDA device (a CPU build "
            "of torch?); install a CUDA build of torch, or pass device='cpu' (GENLM_DEVICE=cpu)"
        )
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device={device!r}: torch has no MPS support here; pass device='cpu'")
    if kind == "cuda" and not torch.cuda.is_bf16_supported():
        return ("float32", "float16")
    return ("float32", "float16", "bfloat16")


def load_model_and_tokenizer(
    checkpoint: Checkpoint, config: HFConfig, placement: Placement
) -> tuple[Any, Any, str]:
    """``(model, tokenizer, device)`` through transformers' ``from_pretrained``, on the
    placement's device and in its dtype."""
    device, dtype = str(placement.device), str(placement.dtype)
    check_config(config, device)
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
    opts.update(config.hf_opts)  # a dtype in it is config.dtype already (HFConfig)
    hf_model = AutoModelForCausalLM.from_pretrained(model, **opts)
    if "device_map" not in opts:
        hf_model = hf_model.to(device)
    hf_model.eval()
    return hf_model, tokenizer, str(hf_model.device)
