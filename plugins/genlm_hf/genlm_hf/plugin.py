"""Hook implementations of genlm-hf. Imports nothing heavy (no torch, no transformers)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from genlm_core import hookimpl


@hookimpl
def genlm_register_backends(register: Callable[..., Any]) -> None:
    register(
        "hf",
        "genlm_hf.engine:HFEngine",
        config="genlm_hf.config:HFConfig",
        devices=["cuda", "mps", "cpu"],
        priority={"cuda": 50, "mps": 50, "cpu": 50},
        aliases=["transformers", "huggingface"],
        requires=["torch", "transformers"],
        install="pip install genlm-hf",
        description="Hugging Face transformers: auto-batching, KV prefix reuse, LoRA adapters",
        # a GGUF only inside a folder or hub repo named with gguf_file= (dequantised): not "gguf"
        model_formats=["hf-folder", "hub-id"],
    )


@hookimpl
def genlm_doctor(hardware: Any) -> dict[str, Any]:
    """The KV pool's self-check as the recorded loads saw it (genlm_hf.pool_check; no torch)."""
    from genlm_hf.pool_check import doctor_section

    return doctor_section()
