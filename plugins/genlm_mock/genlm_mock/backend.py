"""Deprecated: ``MockBackend`` (genlm-core 0.3 removes it). A plugin registers its engine,
:class:`~genlm_mock.engine.MockEngine`; ``genlm_core.load("mock", ...)`` builds the backend, and
``BaseLogprobBackend(MockEngine(...), config)`` holds an engine built by hand."""

from __future__ import annotations

from genlm_core.engine.backend import backend_class
from genlm_mock.engine import MockEngine

__all__ = ["MockBackend"]

MockBackend = backend_class("mock", MockEngine, deprecated="genlm_mock.MockBackend")
