"""The round-trip check that refuses a wrong vocabulary.

Probe texts (ASCII, whitespace runs, accents, CJK, emoji, combining marks) are encoded
with the tokenizer itself, without special tokens, and the bytes of the tokens it
produces must concatenate back to the text (or to the forms of it the tokenizer's own
normalisation allows); otherwise ``ValueError``.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Iterable
from typing import Any

from genlm_core.engine.vocab.decoded import BYTE_LEVEL, SENTENCEPIECE, TIKTOKEN, DecodedVocab
from genlm_core.engine.vocab.fast_tokenizers import backend_of
from genlm_core.engine.vocab.slow_tokenizers import is_sp_processor
from genlm_core.engine.vocab.tiktoken_ranks import is_mistral_tekken, tiktoken_of

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


def verify_vocab(tokenizer: Any, vocab: DecodedVocab) -> None:
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
    if is_mistral_tekken(tokenizer):
        return lambda s: tokenizer.encode(s, bos=False, eos=False)
    encoding = tiktoken_of(tokenizer)
    if encoding is not None and hasattr(encoding, "encode"):
        return lambda s: encoding.encode(s, allowed_special=set(), disallowed_special=())
    if is_sp_processor(tokenizer):
        return lambda s: tokenizer.encode(s)
    if hasattr(tokenizer, "backend_tokenizer") or hasattr(tokenizer, "sp_model"):
        return lambda s: tokenizer.encode(s, add_special_tokens=False)
    if backend_of(tokenizer) is tokenizer:
        return lambda s: tokenizer.encode(s, add_special_tokens=False).ids
    if hasattr(tokenizer, "encode"):
        return lambda s: tokenizer.encode(s, add_special_tokens=False)
    return None


def _unk_id(tokenizer: Any) -> int | None:
    if is_sp_processor(tokenizer):
        return int(tokenizer.unk_id())
    unk = getattr(tokenizer, "unk_token_id", None)
    return unk if isinstance(unk, int) else None
