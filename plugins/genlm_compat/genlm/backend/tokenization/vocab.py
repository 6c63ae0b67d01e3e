"""``genlm.backend.tokenization.vocab``: ``decode_vocab`` and the vocabulary helpers of
genlm-backend on genlm-core's vocabulary decoder (``ByteVocabError`` is ``ValueError``:
genlm-core's decoder raises that, naming the tokenizer)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from genlm.backend._surface import public_dir  # noqa: E402

from genlm_core.engine import Token
from genlm_core.engine.vocab import decode_vocab as _core_decode_vocab

ByteVocabError = ValueError

__all__ = ["ByteVocabError", "Token", "bytes_to_strs", "decode_vocab", "get_byte_vocab"]

_FALLBACKS = ("latin1", "tokenizer", "replace")


def decode_vocab(tokenizer: Any, byte2str_fallback: str = "tokenizer") -> tuple[list[Token], list[str]]:
    """``(byte_vocab, str_vocab)``: genlm-core's decoding (``Token`` objects), strings
    as genlm-backend makes them (:func:`bytes_to_strs`)."""
    if byte2str_fallback not in _FALLBACKS:
        raise ValueError(f"Unknown byte2str_fallback strategy: {byte2str_fallback}")
    byte_vocab, _ = _core_decode_vocab(tokenizer)
    return byte_vocab, bytes_to_strs(tokenizer, byte_vocab, byte2str_fallback)


def get_byte_vocab(tokenizer: Any) -> list[bytes]:
    """Every token's bytes (plain ``bytes``, by id), as genlm-core decodes them; a
    tokenizer that cannot be decoded raises ``ValueError`` naming it."""
    return [bytes(t) for t in _core_decode_vocab(tokenizer)[0]]


def bytes_to_strs(tokenizer: Any, byte_vocab: Sequence[bytes], byte2str_fallback: str) -> list[str]:
    """Each token as a string: its UTF-8 text, else by ``byte2str_fallback``:
    ``"tokenizer"`` (``convert_ids_to_tokens``), ``"latin1"`` or ``"replace"`` (U+FFFD)."""
    out = []
    for token_id, raw in enumerate(byte_vocab):
        raw = bytes(raw)
        try:
            out.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            if byte2str_fallback == "latin1":
                out.append(raw.decode("latin1"))
            elif byte2str_fallback == "tokenizer":
                out.append(tokenizer.convert_ids_to_tokens(token_id))
            else:
                out.append(raw.decode("utf-8", errors="replace"))
    return out


__dir__ = public_dir(__name__)  # the API only, as the reference lists it
