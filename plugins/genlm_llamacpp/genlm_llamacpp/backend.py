"""LlamaCppBackend: genlm-core's backend holding a :class:`~genlm_llamacpp.engine.LlamaCppEngine`.

Importing this module does not import llama_cpp; creating a backend does.
"""

from __future__ import annotations

from genlm_core.engine import BaseLogprobBackend
from genlm_llamacpp.config import LlamaCppConfig
from genlm_llamacpp.engine import LlamaCppEngine

__all__ = ["LlamaCppBackend"]


class LlamaCppBackend(BaseLogprobBackend):
    """Batched, prefix-reusing next-token log-probabilities from a GGUF model on llama.cpp."""

    config_class = LlamaCppConfig
    backend_name = "llamacpp"
    engine_class = LlamaCppEngine
