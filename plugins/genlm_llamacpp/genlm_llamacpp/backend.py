"""Deprecated: ``LlamaCppBackend`` (genlm-core 0.3 removes it). A plugin registers its engine,
:class:`~genlm_llamacpp.engine.LlamaCppEngine`; ``genlm_core.load("llamacpp", ...)`` builds the backend, and
``BaseLogprobBackend(LlamaCppEngine(...), config)`` holds an engine built by hand."""

from __future__ import annotations

from genlm_core.engine.backend import backend_class
from genlm_llamacpp.engine import LlamaCppEngine

__all__ = ["LlamaCppBackend"]

LlamaCppBackend = backend_class("llamacpp", LlamaCppEngine, deprecated="genlm_llamacpp.LlamaCppBackend")
