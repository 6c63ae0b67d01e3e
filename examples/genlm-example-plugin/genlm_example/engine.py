"""A byte bigram language model as a genlm-core engine: the whole engine is a 257 x 257
count table. Shows what a third-party backend writes: its config, ``__init__`` and
``forward``; genlm-core does the batching, caching, validation, normalisation and
sampling."""

from __future__ import annotations

import torch
from pydantic import Field

from genlm_core.engine import BackendConfig, Engine, Token

DEFAULT_TEXT = (
    "The quick brown fox jumps over the lazy dog. Montreal is a city in Canada. "
    "An apple a day keeps the doctor away. The capital of France is Paris. "
)


class BigramConfig(BackendConfig):
    text: str = Field(DEFAULT_TEXT, description="training text")


class ByteTokenizer:
    eos_token_id = 256

    def __len__(self) -> int:
        return 257

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class BigramEngine(Engine):
    config_class = BigramConfig

    def __init__(self, checkpoint: object, config: BigramConfig) -> None:
        self.tokenizer = ByteTokenizer()
        self.byte_vocab = [Token(i, bytes([i])) for i in range(256)] + [Token(256, b"<eos>")]
        counts = torch.ones(257, 257)
        data = list(config.text.encode("utf-8")) + [256]
        for a, b in zip(data, data[1:]):
            counts[a, b] += 1
        self.table = torch.log(counts / counts.sum(-1, keepdim=True))

    def forward(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        return self.table[torch.tensor([c[-1] for c in contexts])]
