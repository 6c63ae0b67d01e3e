"""Options of the MLX backend (import-light: pydantic and genlm_core only)."""

from __future__ import annotations

from pydantic import Field

from genlm_core.config import BackendConfig


class MLXConfig(BackendConfig):
    """Options of :class:`genlm_mlx.backend.MLXBackend`.

    ``model`` is anything ``mlx_lm.load`` accepts: a local folder (Hugging Face
    layout; GPT-2 needs ``n_ctx`` and the hub weight names) or a hub id.
    """

    component = "mlx"

    prefill_step_size: int = Field(
        2048, ge=1, description="most tokens per model call while prefilling a batch"
    )
    prefix_cache: bool = Field(
        True,
        description="reuse the KV state of cached prefixes (off for models whose caches cannot be reused)",
    )
    kv_cache_bytes: int | None = Field(
        1 << 30, ge=0, description="bytes of KV state the prefix cache keeps (LRU; None: no bound)"
    )
