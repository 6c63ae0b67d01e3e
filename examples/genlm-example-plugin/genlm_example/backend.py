"""A byte bigram language model as a genlm-core LogprobBackend: the whole engine is
a 257 x 257 count table. Shows what a third-party backend needs to write."""

from __future__ import annotations

import torch
from pydantic import Field

from genlm_core.engine import BackendConfig, BaseLogprobBackend, Token

DEFAULT_TEXT = (
    "The quick brown fox jumps over the lazy dog. Montreal is a city in Canada. "
    "An apple a day keeps the doctor away. The capital of France is Paris. "
)


class BigramConfig(BackendConfig):
    text: str = Field(DEFAULT_TEXT, description="training text")


class _ByteTok:
    eos_token_id = 256

    def __len__(self) -> int:
        return 257

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class BigramBackend(BaseLogprobBackend):
    config_class = BigramConfig
    backend_name = "example-bigram"

    def __init__(self, config: BigramConfig) -> None:
        vocab = [Token(i, bytes([i])) for i in range(256)] + [Token(256, b"<eos>")]
        super().__init__(_ByteTok(), config, byte_vocab=vocab, eos_token_ids=[256])
        counts = torch.ones(257, 257)
        data = list(config.text.encode("utf-8")) + [256]
        for a, b in zip(data, data[1:]):
            counts[a, b] += 1
        self.table = torch.log(counts / counts.sum(-1, keepdim=True))

    @classmethod
    def from_config(cls, config: BigramConfig) -> "BigramBackend":
        return cls(config)

    def _forward(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        return self.table[torch.tensor([c[-1] for c in contexts])]
