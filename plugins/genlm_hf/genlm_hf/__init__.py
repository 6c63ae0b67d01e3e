"""genlm-hf: the Hugging Face transformers LogprobBackend (import-light: no torch here)."""

__all__ = ["HFBackend", "HFConfig", "HFEngine"]


def __getattr__(name: str):  # lazy: `import genlm_hf` must not import torch
    if name in ("HFBackend", "HFEngine"):
        from genlm_hf import backend

        return getattr(backend, name)
    if name == "HFConfig":
        from genlm_hf.config import HFConfig

        return HFConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
