"""Deprecated: ``MLXBackend`` (genlm-core 0.3 removes it). A plugin registers its engine,
:class:`~genlm_mlx.engine.MLXEngine`; ``genlm_core.load("mlx", ...)`` builds the backend, and
``BaseLogprobBackend(MLXEngine(...), config)`` holds an engine built by hand."""

from __future__ import annotations

from genlm_core.engine.backend import backend_class
from genlm_mlx.engine import MLXEngine

__all__ = ["MLXBackend"]

MLXBackend = backend_class("mlx", MLXEngine, deprecated="genlm_mlx.MLXBackend")
