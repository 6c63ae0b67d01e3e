"""MockBackend: the core's backend holding a :class:`~genlm_mock.engine.MockEngine`."""

from __future__ import annotations

from genlm_core.engine import BaseLogprobBackend
from genlm_mock.config import MockConfig
from genlm_mock.engine import MockEngine

__all__ = ["MockBackend"]


class MockBackend(BaseLogprobBackend):
    """A LogprobBackend whose distributions are pseudo-random but fixed per context."""

    config_class = MockConfig
    backend_name = "mock"
    engine_class = MockEngine
