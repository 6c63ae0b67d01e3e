"""A tiny built-in byte-level tokenizer, so the mock needs no download at all.

Ids 0-255 are the single bytes; then common English words and pieces (with and
without a leading space); the last id is ``<|endoftext|>``. Encoding is greedy
longest match, so every byte string encodes and decodes exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

_WORDS = (
    "the of and to in is was for on that with as by at from it an be this are or his had "
    "not which but have were one they you she all her their has there been if more when "
    "will would who so no out up into do can said what some time about than them its "
    "only new other then also after two like over first any these may such people into "
    "year years could most made work city world day state part where well way back "
    "Montreal Paris France capital apple keeps doctor away hello Hello world World ing ed "
    "er es ly tion re th he in an on at en"
).split()

EOS_TEXT = "<|endoftext|>"


class ByteTokenizer:
    """Greedy longest-match tokenizer over bytes + a few hundred word pieces."""

    def __init__(self, words: Sequence[str] = _WORDS) -> None:
        pieces: list[bytes] = [bytes([i]) for i in range(256)]
        seen = set(pieces)
        for w in words:
            for form in (w, " " + w):
                b = form.encode("utf-8")
                if b not in seen:
                    seen.add(b)
                    pieces.append(b)
        self.pieces = pieces
        self.eos_token_id = len(pieces)
        self.eos_token = EOS_TEXT
        self.bos_token_id = self.eos_token_id
        self._index = {p: i for i, p in enumerate(pieces)}
        self._longest_piece = max(len(p) for p in pieces)
        self.name_or_path = "genlm-mock/byte-tokenizer"

    def __len__(self) -> int:
        return len(self.pieces) + 1

    @property
    def byte_vocab_bytes(self) -> list[bytes]:
        return [*self.pieces, EOS_TEXT.encode()]

    def encode(self, text: str | bytes, add_special_tokens: bool = False) -> list[int]:
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        out: list[int] = []
        i = 0
        while i < len(data):
            for n in range(min(self._longest_piece, len(data) - i), 0, -1):
                tid = self._index.get(data[i : i + n])
                if tid is not None:
                    out.append(tid)
                    i += n
                    break
        return out

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        vocab = self.byte_vocab_bytes
        parts = [vocab[i] for i in ids if not (skip_special_tokens and i == self.eos_token_id)]
        return b"".join(parts).decode("utf-8", errors="replace")

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        vocab = self.byte_vocab_bytes
        return [vocab[i].decode("utf-8", errors="replace") for i in ids]
