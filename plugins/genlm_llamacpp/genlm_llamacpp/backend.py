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
    engine: LlamaCppEngine

    @property
    def weights_type(self) -> str:
        """The GGUF's weight type as llama.cpp names it: ``"F32"``, ``"F16"``, ``"Q4_1"``..."""
        return self.engine.weights_type

    @property
    def batch_invariant(self) -> bool:
        """Whether every context is computed alone (``LlamaCppConfig.batch_invariant``)."""
        return self.engine.batch_invariant
