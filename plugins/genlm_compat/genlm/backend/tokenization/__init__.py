"""``Token``, ``decode_vocab`` and the vocabulary helpers of genlm-backend's
``genlm.backend.tokenization`` (defined in :mod:`genlm.backend.tokenization.vocab`)."""

from genlm.backend._surface import public_dir  # noqa: E402
from genlm.backend.tokenization.vocab import Token, bytes_to_strs, decode_vocab, get_byte_vocab  # noqa: F401

__all__ = ["Token", "decode_vocab"]  # bytes_to_strs, get_byte_vocab: in .vocab, as in the reference

__dir__ = public_dir(__name__)  # the API only, as the reference lists it
