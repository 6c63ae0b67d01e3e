"""Hook implementations of genlm-llamacpp. Imports nothing heavy (no llama_cpp, no torch)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from genlm_core import hookimpl


@hookimpl
def genlm_register_backends(register: Callable[..., Any]) -> None:
    register(
        "llamacpp",
        "genlm_llamacpp.engine:LlamaCppEngine",
        config="genlm_llamacpp.config:LlamaCppConfig",
        devices=["cpu"],
        # below transformers (50), which wins a folder holding both config.json and a .gguf;
        # only GGUF readers compete for a .gguf file (model_formats)
        priority={"cpu": 20},
        aliases=["llama.cpp", "gguf"],
        requires=["llama_cpp"],
        install="pip install genlm-llamacpp",
        description="llama.cpp (GGUF files): batched logprobs, one KV sequence per context, prefix reuse",
        model_formats=["gguf"],  # a .gguf file or a folder holding one (a hub id needs gguf_file=)
    )


@hookimpl
def genlm_doctor(hardware: Any) -> dict[str, Any]:
    from genlm_llamacpp.doctor import doctor_section

    return doctor_section(hardware)
