"""Hook implementations of genlm-mlx. Imports nothing heavy (no mlx, no torch)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from genlm_core import hookimpl


@hookimpl
def genlm_register_backends(register: Callable[..., Any]) -> None:
    register(
        "mlx",
        "genlm_mlx.engine:MLXEngine",
        config="genlm_mlx.config:MLXConfig",
        devices=["mps", "cpu"],
        priority={"mps": 100, "cpu": 0},
        requires=["mlx", "mlx_lm"],
        install="pip install genlm-mlx",
        description="MLX (mlx-lm): batched logprobs with KV prefix reuse; Apple silicon GPU or CPU",
        model_formats=["hf-folder", "hub-id"],  # what mlx_lm.load reads
    )
