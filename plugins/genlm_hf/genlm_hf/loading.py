"""Loading a transformers model and tokenizer from an :class:`HFConfig`."""

from __future__ import annotations

from typing import Any

from genlm_core.engine import DTYPES, UnsupportedDtypeError, normalize_dtype, note, resolve_dtype
from genlm_core.registry import hardware
from genlm_hf.config import HFConfig

__all__ = [
    "check_config",
    "check_dtype",
    "requested_dtype",
    "resolve_device",
    "load_model_and_tokenizer",
    "with_model",
]


def check_config(config: HFConfig) -> None:
    """Fail early, before any weights are read, on options this machine cannot honour."""
    config.check_model()
    requested_dtype(config)  # a conflicting hf_opts dtype fails before any weights are read
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


def with_model(config: HFConfig) -> HFConfig:
    """``config`` with ``model=None`` replaced by the checkpoint policy's default model
    (the embedded SmolLM2-135M-Instruct, :func:`genlm_core.engine.checkpoint.default_model`)."""
    if config.model is not None:
        return config
    if config.gguf_file is not None:
        raise ValueError("hf: gguf_file needs model= (the folder or hub id holding the file)")
    from genlm_core.engine import checkpoint

    return config.model_copy(update={"model": checkpoint.default_model()})


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


def requested_dtype(config: HFConfig) -> str:
    """``config.dtype``, or genlm-backend's ``hf_opts={"torch_dtype": ...}`` when dtype is 'auto'."""
    legacy = [(k, config.hf_opts[k]) for k in ("torch_dtype", "dtype") if k in config.hf_opts]
    if not legacy:
        return config.dtype
    key, value = legacy[0]
    name = normalize_dtype(value)
    if name is None:
        raise ValueError(f"hf_opts[{key!r}]={value!r}: expected one of {', '.join(DTYPES[1:])}")
    if config.dtype not in ("auto", name):
        raise ValueError(
            f"hf_opts[{key!r}]={value!r} conflicts with dtype={config.dtype!r}; pass dtype= only"
        )
    return name


def check_dtype(dtype: str, device: str) -> None:
    """Refuse a dtype torch cannot compute in on ``device`` (no silent substitute)."""
    import torch

    kind = device.split(":")[0]
    if dtype == "bfloat16" and kind == "cuda" and not torch.cuda.is_bf16_supported():
        raise UnsupportedDtypeError("hf", dtype, device, "this GPU has no bfloat16 support")


def load_model_and_tokenizer(config: HFConfig) -> tuple[Any, Any, str]:
    """``(model, tokenizer, device)`` through transformers' ``from_pretrained``.

    ``dtype="auto"`` is resolved to the checkpoint's dtype by
    :func:`genlm_core.engine.dtypes.resolve_dtype` (the meaning every backend shares) and
    passed to transformers explicitly.
    """
    config = with_model(config)
    check_config(config)
    device = resolve_device(config.device)
    dtype = resolve_dtype(requested_dtype(config), config.model)
    check_dtype(dtype, device)
    if config.gguf_file is not None:
        note(
            f"hf: loading {config.gguf_file} from {config.model}: transformers dequantizes every "
            "GGUF tensor first (slow for large models; save_pretrained() once to skip it)"
        )
    else:
        note(f"hf: loading {config.model} on {device} ({dtype})")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    common: dict[str, Any] = {"trust_remote_code": config.trust_remote_code}
    if config.gguf_file is not None:
        common["gguf_file"] = config.gguf_file
    tokenizer = AutoTokenizer.from_pretrained(config.model, **common)
    opts: dict[str, Any] = {**common, "dtype": getattr(torch, dtype)}
    if config.device_map is not None:
        opts["device_map"] = config.device_map
    if config.bitsandbytes_opts:
        from transformers import BitsAndBytesConfig

        opts["quantization_config"] = BitsAndBytesConfig(**config.bitsandbytes_opts)
        opts.setdefault("device_map", {"": device})
    opts.update({k: v for k, v in config.hf_opts.items() if k not in ("dtype", "torch_dtype")})
    model = AutoModelForCausalLM.from_pretrained(config.model, **opts)
    if "device_map" not in opts:
        model = model.to(device)
    model.eval()
    return model, tokenizer, str(model.device)
