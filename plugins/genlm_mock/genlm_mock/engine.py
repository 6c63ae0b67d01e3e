"""MockEngine: deterministic pseudo-random next-token scores seeded by the whole context."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from genlm_core.engine import Checkpoint, Engine, EngineServices, Token
from genlm_mock.byte_tokenizer import ByteTokenizer
from genlm_mock.config import MockConfig

__all__ = ["MockEngine"]


class MockEngine(Engine[MockConfig]):
    """Scores fixed per context: the seed is the whole context, through numpy's
    ``SeedSequence``, so different contexts never share a distribution by construction (a
    seed such as ``sum((i + 1) * t)`` would let them).

    ``tokenizer=None`` is the built-in byte-level tokenizer; a Hugging Face tokenizer
    lends its vocabulary (decoded once here, as the core would: the rows are as wide as it).
    Computes in float32 only.
    """

    config_class = MockConfig
    supports = frozenset({"burst"})
    #: named when a context is past the limit it sets
    max_positions_option = "max_context_length"

    def __init__(self, tokenizer: Any = None, config: MockConfig | None = None) -> None:
        config = config or MockConfig()
        self.tokenizer = ByteTokenizer() if tokenizer is None else tokenizer
        if isinstance(self.tokenizer, ByteTokenizer):
            self.byte_vocab = [Token(i, b) for i, b in enumerate(self.tokenizer.byte_vocab_bytes)]
        else:
            from genlm_core.engine.vocab import decode_vocab

            self.byte_vocab, self.str_vocab = decode_vocab(self.tokenizer)
        #: the width of a row: the vocabulary's
        self.width = len(self.byte_vocab)
        limit = config.max_context_length  # a limit of L tokens: L + 1 positions
        self.max_positions = None if limit is None else limit + 1
        self.scale = np.float32(config.scale)
        self.work_s = config.work_s
        self.forward_calls = 0

    @classmethod
    def load(cls, checkpoint: Checkpoint, config: MockConfig, services: EngineServices) -> "MockEngine":
        tokenizer = None
        if checkpoint.tokenizer is not None:  # a folder lends its tokenizer
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(checkpoint.tokenizer)
        return cls(tokenizer, config)

    @classmethod
    def dtypes_on(cls, device: str) -> tuple[str, ...]:
        return ("float32",)

    def logits_for(self, context: tuple[int, ...]) -> np.ndarray:
        rng = np.random.default_rng(np.random.SeedSequence(list(context) or [0]))
        return rng.random(self.width, dtype=np.float32) * self.scale

    def forward(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        self.forward_calls += 1
        if self.work_s:
            time.sleep(self.work_s)
        return torch.from_numpy(np.stack([self.logits_for(c) for c in contexts]))

    def stats(self) -> dict[str, Any]:
        return {"forward_calls": self.forward_calls}
