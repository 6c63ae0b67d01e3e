"""`Token`: the genlm-backend spellings a client uses (keyword constructor,
``byte_string``, static ``as_bytes`` / ``is_plain_bytes``) and class-preserving copies."""

from __future__ import annotations

import copy
import pickle

import pytest

from genlm_core.token import Token


class _SubToken(Token):
    pass


def test_keyword_constructor_and_byte_string() -> None:
    t = Token(token_id=7, byte_string=b"ab")
    assert t.token_id == 7 and t.byte_string == b"ab" and type(t.byte_string) is bytes
    assert t == Token(7, b"ab") and t != Token(8, b"ab")  # identity is the id
    with pytest.raises(TypeError, match="byte_string"):
        Token(token_id=1, byte_string="ab")
    with pytest.raises(TypeError, match="not both"):
        Token(1, b"a", byte_string=b"a")


def test_as_bytes_static_and_instance() -> None:
    t = Token(3, b"xy")
    assert Token.as_bytes(t) == b"xy" and type(Token.as_bytes(t)) is bytes
    assert Token.as_bytes(b"q") == b"q" and t.as_bytes() == b"xy"
    assert Token.is_plain_bytes(b"xy") and not Token.is_plain_bytes(t) and not Token.is_plain_bytes("xy")
    with pytest.raises(TypeError, match="as_bytes"):
        Token.as_bytes(3)


@pytest.mark.parametrize("cls", [Token, _SubToken])
def test_pickle_and_copy_keep_the_class(cls: type[Token]) -> None:
    t = cls(4, b"z")
    for u in (pickle.loads(pickle.dumps(t)), copy.copy(t), copy.deepcopy(t)):
        assert type(u) is cls and u.token_id == 4 and bytes(u) == b"z"
