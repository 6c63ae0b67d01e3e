"""MLXBackend: genlm-core's backend holding an :class:`~genlm_mlx.engine.MLXEngine`.

Importing this module does not import mlx; creating a backend does.
"""

from __future__ import annotations

from typing import Any

from genlm_core.engine import BaseLogprobBackend, Checkpoint
from genlm_mlx.config import MLXConfig
from genlm_mlx.engine import MLXEngine

__all__ = ["MLXBackend"]


class MLXBackend(BaseLogprobBackend):
    """Batched, prefix-caching next-token log-probabilities from an mlx-lm model."""

    config_class = MLXConfig
    backend_name = "mlx"
    engine_class = MLXEngine
    engine: MLXEngine

    @classmethod
    def from_model(
        cls,
        model: Any,
        tokenizer: Any,
        config: MLXConfig | None = None,
        *,
        model_config: dict[str, Any] | None = None,
    ) -> "MLXBackend":
        """Around an mlx-lm model and tokenizer you loaded yourself (``mlx_lm.load``); its
        checkpoint: ``model_config`` (default: the model's ``args``), its dtype the model's."""
        config = config or MLXConfig()
        return cls(
            MLXEngine(model, tokenizer, config, model_config=model_config),
            config,
            Checkpoint.of_files(config.model),
        )

    @property
    def mlx_model(self) -> Any:
        return self.engine.mlx_model

    @property
    def mlx_tokenizer(self) -> Any:
        return self.engine.mlx_tokenizer

    @property
    def kv_reuse_problem(self) -> str | None:
        """Why the model's KV state cannot be reused (None: it can)."""
        return self.engine.kv_reuse_problem
