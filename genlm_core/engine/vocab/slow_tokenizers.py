"""Sentencepiece processors and Hugging Face slow tokenizers.

A bare ``sentencepiece.SentencePieceProcessor``, a slow tokenizer over a sentencepiece
model (anything with an ``sp_model``: transformers 5.x ``SentencePieceBackend``, 4.x
``LlamaTokenizer``; its own ``get_vocab`` is the id map), and a slow GPT-2-style
tokenizer with a ``byte_decoder`` (byte-level strings). Byte pieces are their byte,
control and unknown pieces and added tokens their UTF-8 text.
"""

from __future__ import annotations

from typing import Any

from genlm_core.engine.vocab.decoded import BYTE_LEVEL, SENTENCEPIECE, Raw, values_by_id
from genlm_core.engine.vocab.token_strings import SPIECE_UNDERLINE, map_byte_level, map_sentencepiece


def is_sp_processor(tokenizer: Any) -> bool:
    return all(hasattr(tokenizer, a) for a in ("id_to_piece", "get_piece_size", "is_byte"))


def raw_from_sp_processor(sp: Any) -> Raw:
    n = sp.get_piece_size()
    pieces: list[str | None] = [sp.id_to_piece(i) for i in range(n)]
    values = map_sentencepiece(pieces, byte_fallback=False)
    for i in range(n):
        if sp.is_byte(i):
            values[i] = bytes([int(pieces[i][3:5], 16)])  # type: ignore[index]
    special = {i for i in range(n) if sp.is_control(i) or sp.is_unknown(i)}
    for i in special:
        values[i] = pieces[i].encode("utf-8")  # type: ignore[union-attr]
    return Raw(SENTENCEPIECE, values, special)


def raw_from_slow_sp(tokenizer: Any) -> Raw:
    """A slow HF tokenizer over a sentencepiece model (ids may be offset from the
    model's, so the tokenizer's own ``get_vocab`` is the id map)."""
    sp = tokenizer.sp_model
    n = sp.get_piece_size()
    byte_pieces = {sp.id_to_piece(i) for i in range(n) if sp.is_byte(i)}
    control = {sp.id_to_piece(i) for i in range(n) if sp.is_control(i) or sp.is_unknown(i)}
    vocab: dict[str, int] = dict(tokenizer.get_vocab())
    added = _slow_added_tokens(tokenizer)
    by_id: dict[int, bytes] = {}
    for piece, i in vocab.items():
        if piece in byte_pieces:
            by_id[i] = bytes([int(piece[3:5], 16)])
        elif piece in control:
            by_id[i] = piece.encode("utf-8")
        else:
            by_id[i] = piece.replace(SPIECE_UNDERLINE, " ").encode("utf-8")
    for i, text in added.items():
        by_id[i] = text.encode("utf-8")
    special = set(added) | {vocab[p] for p in control if p in vocab}
    return Raw(SENTENCEPIECE, values_by_id(by_id, len(tokenizer)), special)


def _slow_added_tokens(tokenizer: Any) -> dict[int, str]:
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return {int(i): str(getattr(tok, "content", tok)) for i, tok in decoder.items()}


def raw_from_slow_byte_level(tokenizer: Any) -> Raw:
    vocab: dict[str, int] = dict(tokenizer.get_vocab())
    added = _slow_added_tokens(tokenizer)
    ids = list(vocab.values())
    by_id = dict(zip(ids, map_byte_level(vocab), strict=True))
    for i, text in added.items():
        by_id[i] = text.encode("utf-8")
    return Raw(BYTE_LEVEL, values_by_id(by_id, len(tokenizer)), set(added))  # type: ignore[arg-type]
