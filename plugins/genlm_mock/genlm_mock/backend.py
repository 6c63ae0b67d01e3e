"""MockBackend: deterministic pseudo-random log-probabilities seeded by the whole context."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from genlm_core.engine import BaseLogprobBackend, Token
from genlm_mock.byte_tokenizer import ByteTokenizer
from genlm_mock.config import MockConfig


class MockBackend(BaseLogprobBackend):
    """A LogprobBackend whose distributions are pseudo-random but fixed per context.

    The seed is the whole context, through numpy's ``SeedSequence``, so different
    contexts never share a distribution by construction (a seed such as
    ``sum((i + 1) * t)`` would let them). Uses the shared batcher and output cache, like every engine.
    """

    config_class = MockConfig
    backend_name = "mock"

    def __init__(self, tokenizer: Any = None, config: MockConfig | None = None) -> None:
        config = config or MockConfig()
        if config.dtype not in ("auto", "float32"):
            from genlm_core.engine.dtypes import UnsupportedDtypeError

            raise UnsupportedDtypeError("mock", config.dtype, "cpu", "the mock computes in float32 only")
        if tokenizer is None:
            tokenizer = ByteTokenizer()
        if isinstance(tokenizer, ByteTokenizer):
            vocab = [Token(i, b) for i, b in enumerate(tokenizer.byte_vocab_bytes)]
            super().__init__(tokenizer, config, byte_vocab=vocab, eos_token_ids=[tokenizer.eos_token_id])
        else:
            super().__init__(tokenizer, config)
        self.forward_calls = 0

    @classmethod
    def from_config(cls, config: MockConfig) -> "MockBackend":
        tokenizer = None
        config.check_model()
        if config.model is not None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(config.model)
        return cls(tokenizer, config)

    @property
    def max_context_length(self) -> int | None:
        return self.config.max_context_length

    def logits_for(self, context: tuple[int, ...]) -> np.ndarray:
        rng = np.random.default_rng(np.random.SeedSequence(list(context) or [0]))
        return rng.random(self.vocab_size, dtype=np.float32) * np.float32(self.config.scale)

    def _forward(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        self.forward_calls += 1
        if self.config.work_s:
            time.sleep(self.config.work_s)
        return torch.from_numpy(np.stack([self.logits_for(c) for c in contexts]))
