"""`Token`: the bytes of one vocabulary entry, identified by its token id."""

from __future__ import annotations

from typing import Any, Self


class Token(bytes):
    """The exact bytes of a token, carrying its ``token_id``.

    A ``Token`` behaves like ``bytes`` for slicing, concatenation and ``startswith``,
    but equality, hashing and ordering go by ``token_id``: two tokens with the same
    bytes (duplicates in a vocabulary) stay distinct in sets, dicts and tries.
    Compare with plain bytes through :meth:`as_bytes`.
    """

    # bytes subclasses cannot have non-empty __slots__: token_id lives in the instance dict.
    token_id: int

    def __new__(cls, token_id: int, value: bytes) -> Self:
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"Token bytes must be bytes-like, got {type(value).__name__}")
        self = super().__new__(cls, value)
        self.token_id = int(token_id)
        return self

    def as_bytes(self) -> bytes:
        """The token's bytes as a plain ``bytes`` object."""
        return bytes(self)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Token):
            return self.token_id == other.token_id
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        if isinstance(other, Token):
            return self.token_id != other.token_id
        return NotImplemented

    def __hash__(self) -> int:
        return hash(("Token", self.token_id))

    def __lt__(self, other: Any) -> bool:
        if isinstance(other, Token):
            return self.token_id < other.token_id
        return NotImplemented

    def __le__(self, other: Any) -> bool:
        if isinstance(other, Token):
            return self.token_id <= other.token_id
        return NotImplemented

    def __gt__(self, other: Any) -> bool:
        if isinstance(other, Token):
            return self.token_id > other.token_id
        return NotImplemented

    def __ge__(self, other: Any) -> bool:
        if isinstance(other, Token):
            return self.token_id >= other.token_id
        return NotImplemented

    def __repr__(self) -> str:
        return f"Token({self.token_id}, {bytes(self)!r})"

    def __reduce__(self):
        return (Token, (self.token_id, bytes(self)))
