"""Hugging Face fast tokenizers: the family is read from the ``tokenizers`` backend.

The model type (``BPE``/``Unigram``/``WordPiece``/``WordLevel``) and the types in the
decoder and pre-tokenizer JSON decide the family (:func:`_backend_family`): byte-level
BPE, sentencepiece-style (with or without byte fallback), raw UTF-8 text, or
unrecoverable (WordPiece, WordLevel, decoders that rewrite the text), which raises
``ValueError``. Added tokens are their UTF-8 text.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from genlm_core.engine.vocab.decoded import BYTE_LEVEL, RAW, SENTENCEPIECE, Raw
from genlm_core.engine.vocab.token_strings import map_byte_level, map_sentencepiece

_UNRECOVERABLE_MODELS = ("WordPiece", "WordLevel")
_UNRECOVERABLE_DECODERS = ("WordPiece", "BPEDecoder", "CTC")


def backend_of(tokenizer: Any) -> Any | None:
    """The ``tokenizers.Tokenizer`` behind a fast HF tokenizer (or the object itself)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return backend
    if all(hasattr(tokenizer, a) for a in ("model", "decoder", "get_vocab", "to_str")):
        return tokenizer
    return None


def raw_from_backend(tokenizer: Any, backend: Any) -> Raw:
    family = _backend_family(backend)
    added = _added_tokens(tokenizer, backend)
    length = max(_hf_len(tokenizer, backend), max(added, default=-1) + 1)
    pieces = _model_pieces(backend, length)
    values = _map_pieces(pieces, family, _has_byte_fallback(backend, family))
    for i, text in added.items():
        values[i] = text.encode("utf-8")
    return Raw(family, values, set(added))


def _model_pieces(backend: Any, length: int) -> list[str | None]:
    """The model's vocabulary strings by id (None where it has no token).

    ``model.id_to_token`` over the id range is faster than inverting ``get_vocab()``;
    the latter is the fallback when model ids lie beyond ``length``.
    """
    pieces: list[str | None] = list(map(backend.model.id_to_token, range(length)))
    if len(pieces) - pieces.count(None) >= backend.get_vocab_size(with_added_tokens=False):
        return pieces
    vocab: dict[str, int] = backend.get_vocab(with_added_tokens=False)
    pieces = [None] * max(length, max(vocab.values(), default=-1) + 1)
    for piece, i in vocab.items():
        pieces[i] = piece
    return pieces


def _backend_family(backend: Any) -> str:
    model_type = type(backend.model).__name__
    if model_type in _UNRECOVERABLE_MODELS:
        raise ValueError(
            f"decode_vocab: a {model_type} tokenizer does not keep the exact bytes of its tokens "
            "(it drops whitespace and marks word pieces with a prefix such as '##'), so no exact "
            "byte vocabulary exists for it"
        )
    decoder = _component_types(backend.decoder)
    pre = _component_types(backend.pre_tokenizer)
    bad = decoder & set(_UNRECOVERABLE_DECODERS)
    if bad:
        raise ValueError(
            f"decode_vocab: the tokenizer's {min(bad)} decoder rewrites token text "
            "(suffixes/prefixes, dropped whitespace), so its exact bytes cannot be recovered"
        )
    if "ByteLevel" in decoder or "ByteLevel" in pre:  # the vocabulary is byte-level text
        return BYTE_LEVEL
    spm_markers = {"Metaspace", "ByteFallback", "Replace"}
    if decoder & spm_markers or "Metaspace" in pre or model_type == "Unigram":
        return SENTENCEPIECE
    return RAW


def _component_types(component: Any) -> set[str]:
    """All ``type`` names in a decoder/pre-tokenizer's JSON (nested sequences included)."""
    if component is None:
        return set()
    try:
        state = json.loads(component.__getstate__())
    except (AttributeError, TypeError, ValueError):  # unusual component: use its class name
        return {type(component).__name__}
    names: set[str] = set()
    _collect_types(state, names)
    return names


def _collect_types(node: Any, names: set[str]) -> None:
    if isinstance(node, dict):
        if isinstance(node.get("type"), str):
            names.add(node["type"])
        for value in node.values():
            _collect_types(value, names)
    elif isinstance(node, list):
        for value in node:
            _collect_types(value, names)


def _added_tokens(tokenizer: Any, backend: Any) -> dict[int, str]:
    decoder = getattr(tokenizer, "added_tokens_decoder", None)
    if not isinstance(decoder, Mapping):
        decoder = backend.get_added_tokens_decoder()
    return {int(i): str(getattr(tok, "content", tok)) for i, tok in decoder.items()}


def _has_byte_fallback(backend: Any, family: str) -> bool:
    """Whether ``<0xNN>`` pieces stand for single bytes (sentencepiece family only)."""
    if family != SENTENCEPIECE:
        return False
    return bool(getattr(backend.model, "byte_fallback", False)) or "ByteFallback" in _component_types(
        backend.decoder
    )


def _hf_len(tokenizer: Any, backend: Any) -> int:
    try:
        return len(tokenizer)
    except TypeError:
        return int(backend.get_vocab_size(with_added_tokens=True))


def _map_pieces(pieces: list[str | None], family: str, byte_fallback: bool) -> list[bytes | None]:
    if family == BYTE_LEVEL:
        return map_byte_level(pieces)
    if family == SENTENCEPIECE:
        return map_sentencepiece(pieces, byte_fallback)
    return [None if p is None else p.encode("utf-8") for p in pieces]
