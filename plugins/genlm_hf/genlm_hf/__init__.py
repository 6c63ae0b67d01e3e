"""genlm-hf: the Hugging Face transformers LogprobBackend (import-light: no torch here)."""

__all__ = ["HFBackend", "HFConfig", "HFEngine"]


def __getattr__(name: str):  # lazy: `import genlm_hf` must not import torch
    if name == "HFEngine":
        from genlm_hf.engine import HFEngine

        return HFEngine
    if name == "HFConfig":
        from genlm_hf.config import HFConfig

        return HFConfig
    if name == "HFBackend":  # deprecated (genlm_hf._deprecated)
        from genlm_hf._deprecated import hf_backend_class
        from genlm_hf.engine import HFEngine

        return hf_backend_class(HFEngine)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
