"""The GGUF's own tokenizer, through llama.cpp: encode/decode and the exact byte vocabulary."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from genlm_core.engine import Token

if TYPE_CHECKING:  # pragma: no cover
    from genlm_llamacpp.llama_context import LlamaContext

__all__ = ["GGUFTokenizer", "byte_vocab"]


def byte_vocab(context: "LlamaContext") -> tuple[list[Token], list[str]]:
    """One :class:`Token` per id: the bytes llama.cpp's detokenizer emits for it.

    Byte-level BPE pieces are mapped back to their bytes, sentencepiece ``▁`` is a space
    and ``<0xNN>`` the byte ``NN``, special tokens are their text: the conventions of
    the core's decoding of tokenizers, :mod:`genlm_core.engine.vocab` (the tests check equality on Hugging Face
    tokenizers of the same models).
    """
    values = [context.token_bytes(i) for i in range(context.n_vocab)]
    tokens = list(map(Token, range(len(values)), values))
    return tokens, [b.decode("utf-8", errors="replace") for b in values]


class GGUFTokenizer:
    """The subset of a Hugging Face tokenizer genlm-core uses (``encode``, ``decode``,
    ``eos_token_id``, ``len``), on the GGUF's tokenizer."""

    def __init__(self, context: "LlamaContext", byte_vocab: list[Token]) -> None:
        self._context = context
        self._bytes = byte_vocab
        eos = context.eos_ids()
        self.eos_token_ids = eos  # every end-of-generation id (EOS, EOT, ...)
        self.eos_token_id = context.eos_id()  # the GGUF's tokenizer.ggml.eos_token_id
        self.bos_token_id = context.bos_id()
        self.all_special_ids = sorted(set(eos) | ({self.bos_token_id} - {None}))

    def __len__(self) -> int:
        return len(self._bytes)

    def encode(self, text: str, add_special_tokens: bool = True, **_: Any) -> list[int]:
        return self._context.tokenize(text, add_special=add_special_tokens)

    def __call__(self, text: str, add_special_tokens: bool = True, **_: Any) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text, add_special_tokens)}

    def decode(self, ids: Iterable[int], **_: Any) -> str:
        return b"".join(bytes(self._bytes[int(i)]) for i in ids).decode("utf-8", errors="replace")

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[bytes]:
        return [self._bytes[int(i)] for i in ids]
