"""``Token`` and ``decode_vocab`` (genlm-backend's ``genlm.backend.tokenization``)."""

from __future__ import annotations

from typing import Any

from genlm_core.engine import Token
from genlm_core.engine.vocab import decode_vocab as _core_decode_vocab

__all__ = ["Token", "decode_vocab"]

_FALLBACKS = ("latin1", "tokenizer", "replace")


def decode_vocab(tokenizer: Any, byte2str_fallback: str = "tokenizer") -> tuple[list[Token], list[str]]:
    """``(byte_vocab, str_vocab)``: genlm-core's decoding (``Token`` objects), strings
    as genlm-backend makes them: UTF-8, else the ``byte2str_fallback`` strategy
    (``"tokenizer"``: ``convert_ids_to_tokens``, ``"latin1"``, ``"replace"``)."""
    if byte2str_fallback not in _FALLBACKS:
        raise ValueError(f"Unknown byte2str_fallback strategy: {byte2str_fallback}")
    byte_vocab, _ = _core_decode_vocab(tokenizer)
    strs = []
    for tok in byte_vocab:
        try:
            strs.append(bytes(tok).decode("utf-8"))
        except UnicodeDecodeError:
            if byte2str_fallback == "tokenizer" and hasattr(tokenizer, "convert_ids_to_tokens"):
                strs.append(tokenizer.convert_ids_to_tokens(tok.token_id))
            elif byte2str_fallback == "latin1":
                strs.append(bytes(tok).decode("latin1"))
            else:
                strs.append(bytes(tok).decode("utf-8", errors="replace"))
    return byte_vocab, strs
