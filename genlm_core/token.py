"""`Token`: the bytes of one vocabulary entry, identified by its token id."""

from __future__ import annotations

from typing import Any, Self


class _BytesOf:
    """``Token.as_bytes(x)`` (plain bytes of a Token or bytes-like ``x``) that also
    works on an instance: ``tok.as_bytes()``."""

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return _plain_bytes
        return lambda: bytes(obj)


def _plain_bytes(x: Any) -> bytes:
    if isinstance(x, (bytes, bytearray, memoryview)):
        return bytes(x)
    raise TypeError(f"Token.as_bytes expects a Token or bytes, got {type(x).__name__}")


class Token(bytes):
    """The exact bytes of a token, carrying its ``token_id``.

    A ``Token`` behaves like ``bytes`` for slicing, concatenation and ``startswith``,
    but equality, hashing and ordering go by ``token_id``: two tokens with the same
    bytes (duplicates in a vocabulary) stay distinct in sets, dicts and tries.
    Compare with plain bytes through :meth:`as_bytes`.
    """

    # bytes subclasses cannot have non-empty __slots__: token_id lives in the instance dict.
    token_id: int

    def __new__(cls, token_id: int, value: bytes | None = None, *, byte_string: bytes | None = None) -> Self:
        if byte_string is not None:
            if value is not None:
                raise TypeError("Token: give the bytes once (value or byte_string=), not both")
            value = byte_string
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"Token byte_string must be bytes-like, got {type(value).__name__}")
        if isinstance(token_id, bool) or not hasattr(token_id, "__index__"):
            # int("1") or int(1.5) would hide a caller's bug behind a wrong id
            raise TypeError(f"Token token_id must be an int, got {type(token_id).__name__} {token_id!r}")
        self = super().__new__(cls, value)
        self.token_id = token_id.__index__()
        return self

    #: ``Token.as_bytes(x)``: plain ``bytes`` of a Token or bytes; ``tok.as_bytes()`` too.
    as_bytes = _BytesOf()

    @property
    def byte_string(self) -> bytes:
        """The token's bytes as a plain ``bytes`` object (genlm-backend's name)."""
        return bytes(self)

    @staticmethod
    def is_plain_bytes(x: Any) -> bool:
        """True for ``bytes`` that are not a ``Token`` (no token id attached)."""
        return isinstance(x, bytes) and not isinstance(x, Token)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Token):
            return self.token_id == other.token_id
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        if isinstance(other, Token):
            return self.token_id != other.token_id
        return NotImplemented

    def __hash__(self) -> int:
        # the id's own hash (no tuple per call: clients hash Tokens in their inner loops);
        # equal to hash(token_id) as in genlm-backend, and __eq__ still tells them apart
        return hash(self.token_id)

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
        return f"{type(self).__name__}({self.token_id}, {bytes(self)!r})"

    def __reduce__(self):
        return (type(self), (self.token_id, bytes(self)))

    def __copy__(self) -> Self:
        return self

    def __deepcopy__(self, memo: Any) -> Self:
        return self
