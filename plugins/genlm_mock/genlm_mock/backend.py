"""MockBackend: the core's backend holding a :class:`~genlm_mock.engine.MockEngine`."""

from __future__ import annotations

from typing import Any

import numpy as np

from genlm_core.engine import BaseLogprobBackend
from genlm_mock.config import MockConfig
from genlm_mock.engine import MockEngine

__all__ = ["MockBackend"]


class MockBackend(BaseLogprobBackend):
    """A LogprobBackend whose distributions are pseudo-random but fixed per context."""

    config_class = MockConfig
    backend_name = "mock"
    engine_class = MockEngine
    engine: MockEngine

    @classmethod
    def from_tokenizer(cls, tokenizer: Any = None, config: MockConfig | None = None) -> "MockBackend":
        """The mock over ``tokenizer``'s vocabulary (None: its built-in byte tokenizer)."""
        config = config or MockConfig()
        return cls(MockEngine(tokenizer, config), config)

    def logits_for(self, context: tuple[int, ...]) -> np.ndarray:
        """The scores of ``context`` before normalisation (what the engine computes)."""
        return self.engine.logits_for(context)
