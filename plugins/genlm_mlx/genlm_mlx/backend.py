"""MLXBackend: genlm-core's backend holding an :class:`~genlm_mlx.engine.MLXEngine`.

Importing this module does not import mlx; creating a backend does. Around a model
loaded by hand: ``MLXBackend(MLXEngine(model, tokenizer, config), config)``.
"""

from __future__ import annotations

from genlm_core.engine import BaseLogprobBackend
from genlm_mlx.config import MLXConfig
from genlm_mlx.engine import MLXEngine

__all__ = ["MLXBackend"]


class MLXBackend(BaseLogprobBackend):
    """Batched, prefix-caching next-token log-probabilities from an mlx-lm model."""

    config_class = MLXConfig
    backend_name = "mlx"
    engine_class = MLXEngine
