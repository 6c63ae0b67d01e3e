"""The client's tokenizer: identity from the server, encode/decode delegated to it.

Decision (documented in the README): the client does not rebuild the server's
tokenizer. Rebuilding needs the tokenizer's library (transformers / tokenizers,
sentencepiece, llama.cpp's vocab, the mock's own) and would be a second
implementation that can drift from the one the rows were computed with. Instead the
server sends what programs read from a tokenizer - EOS/BOS ids and tokens, special
ids, its length, its class and name - and ``encode``/``decode`` are one small JSON
call to the server's own tokenizer (programs tokenise prompts, not every step; the
per-step data, the rows, never go through here). The byte vocabulary (``byte_vocab``,
``str_vocab``) is sent once, as a binary frame.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["RemoteTokenizer"]


class RemoteTokenizer:
    """A thin tokenizer whose ``encode``/``decode`` run on the server."""

    def __init__(self, connection: Any, info: dict[str, Any], str_vocab: list[str]) -> None:
        self._conn = connection
        self._str_vocab = str_vocab
        self.server_class = info.get("class", "")
        self.name_or_path = info.get("name_or_path", "")
        self.eos_token_id = info.get("eos_token_id")
        self.eos_token = info.get("eos_token")
        self.bos_token_id = info.get("bos_token_id")
        self.bos_token = info.get("bos_token")
        self.pad_token_id = info.get("pad_token_id")
        self.all_special_ids = list(info.get("all_special_ids") or [])
        self._len = info.get("len") if isinstance(info.get("len"), int) else len(str_vocab)

    def __len__(self) -> int:
        return self._len

    @property
    def vocab_size(self) -> int:
        return len(self._str_vocab)

    def encode(self, text: str, add_special_tokens: bool | None = None, **_: Any) -> list[int]:
        """Token ids of ``text`` by the server's tokenizer (its own default for
        ``add_special_tokens`` when not given)."""
        if not isinstance(text, str):
            raise ValueError(f"encode takes a str, got {type(text).__name__}")
        payload: dict[str, Any] = {"text": text}
        if add_special_tokens is not None:
            payload["add_special_tokens"] = bool(add_special_tokens)
        return list(self._conn.post_json("/v1/tokenize", payload)["ids"])

    def __call__(self, text: str, add_special_tokens: bool | None = None, **_: Any) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text, add_special_tokens)}

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False, **_: Any) -> str:
        return str(
            self._conn.post_json(
                "/v1/detokenize",
                {"ids": [int(i) for i in ids], "skip_special_tokens": bool(skip_special_tokens)},
            )["text"]
        )

    def convert_ids_to_tokens(self, ids: int | Sequence[int]) -> str | list[str]:
        """The string form of the byte vocabulary (``str_vocab``) for ``ids``."""
        if isinstance(ids, int):
            return self._str_vocab[ids]
        return [self._str_vocab[i] for i in ids]

    def __repr__(self) -> str:
        return f"<RemoteTokenizer of the server's {self.server_class} {self.name_or_path!r}>"
