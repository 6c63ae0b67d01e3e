"""tiktoken vocabularies: a rank table is already the exact bytes of each id.

A ``tiktoken.Encoding`` (or a look-alike with ``_mergeable_ranks``, e.g. Qwen's
``QwenTokenizer``), found directly or inside a wrapper, and mistral-common's
``Tekkenizer`` (tiktoken ranks after its special tokens). Special tokens are their
UTF-8 text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from genlm_core.engine.vocab.decoded import TIKTOKEN, Raw, values_by_id


def tiktoken_of(tokenizer: Any) -> Any | None:
    """The tiktoken ``Encoding`` (or look-alike with ``_mergeable_ranks``) that is, or
    is wrapped by, ``tokenizer`` (wrappers keep it in ``tokenizer``/``model``/``_tokenizer``)."""
    for obj in (tokenizer, *(getattr(tokenizer, a, None) for a in ("tokenizer", "model", "_tokenizer"))):
        if isinstance(getattr(obj, "_mergeable_ranks", None), Mapping):
            return obj
    return None


def is_mistral_tekken(tokenizer: Any) -> bool:
    """mistral-common's ``Tekkenizer`` (tiktoken ranks after ``num_special_tokens``)."""
    return all(hasattr(tokenizer, a) for a in ("id_to_byte_piece", "num_special_tokens", "n_words"))


def raw_from_tekken(tokenizer: Any) -> Raw:
    from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

    keep = SpecialTokenPolicy.KEEP  # special tokens as their text
    values: list[bytes | None] = [
        bytes(tokenizer.id_to_byte_piece(i, keep)) for i in range(tokenizer.n_words)
    ]
    return Raw(TIKTOKEN, values, set(range(tokenizer.num_special_tokens)))


def raw_from_ranks(ranks: Mapping[bytes, int], special: Mapping[str, int] | None, n_vocab: int | None) -> Raw:
    by_id = {int(i): bytes(b) for b, i in ranks.items()}
    special_ids: set[int] = set()
    for text, i in (special or {}).items():
        by_id[int(i)] = text.encode("utf-8")
        special_ids.add(int(i))
    return Raw(TIKTOKEN, values_by_id(by_id, int(n_vocab or 0)), special_ids)
