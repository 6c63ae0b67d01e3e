"""A byte bigram language model as a genlm-core engine: the whole engine is a 257 x 257
count table.

What a third-party backend writes, whole: its config (the options, and the engine's one
default dtype, ``BackendConfig.default_dtype``), the one question the core asks before
loading (``dtypes_on``), ``load(checkpoint, config, services)`` on the device and in the
dtype the core placed, and ``forward``. genlm-core does the batching, caching,
validation, normalisation and sampling, and writes nothing into the engine.
"""

from __future__ import annotations

import torch
from pydantic import Field

from genlm_core.engine import BackendConfig, Checkpoint, Engine, EngineServices, Token

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

    @classmethod
    def dtypes_on(cls, device: str) -> tuple[str, ...]:
        return ("float32", "bfloat16")  # what the table can be held in (asked before load)

    @classmethod
    def load(cls, checkpoint: Checkpoint, config: BigramConfig, services: EngineServices) -> BigramEngine:
        counts = torch.ones(257, 257)
        data = list(config.text.encode("utf-8")) + [256]
        for a, b in zip(data, data[1:]):
            counts[a, b] += 1
        table = torch.log(counts / counts.sum(-1, keepdim=True))
        return cls(table.to(services.device, getattr(torch, services.dtype)))

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table
        self.tokenizer = ByteTokenizer()
        self.byte_vocab = [Token(i, bytes([i])) for i in range(256)] + [Token(256, b"<eos>")]

    def forward(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        return self.table[torch.tensor([c[-1] for c in contexts], device=self.table.device)]
