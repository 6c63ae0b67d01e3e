"""Options of the MLX backend (import-light: pydantic and genlm_core only)."""

from __future__ import annotations

from pydantic import Field

from genlm_core.engine import BackendConfig, KVCacheOptions


class MLXConfig(KVCacheOptions, BackendConfig):
    """Options of :class:`genlm_mlx.engine.MLXEngine` (``genlm_core.load("mlx", ...)``).

    ``model`` is anything ``mlx_lm.load`` accepts: a local folder (Hugging Face
    layout; GPT-2 needs ``n_ctx`` and the hub weight names) or a hub id; ``None`` is the
    embedded SmolLM2-135M-Instruct (:mod:`genlm_core.engine.checkpoint`). ``prefix_cache`` and
    ``kv_cache_bytes`` come from :class:`~genlm_core.engine.kv_reuse.KVCacheOptions`.
    """

    component = "mlx"

    prefill_step_size: int = Field(
        2048, ge=1, description="most tokens per model call while prefilling a batch"
    )
