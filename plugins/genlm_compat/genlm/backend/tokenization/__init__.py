"""``Token``, ``decode_vocab`` and the vocabulary helpers of genlm-backend's
``genlm.backend.tokenization`` (defined in :mod:`genlm.backend.tokenization.vocab`)."""

from genlm.backend.tokenization.vocab import Token, bytes_to_strs, decode_vocab, get_byte_vocab

__all__ = ["Token", "bytes_to_strs", "decode_vocab", "get_byte_vocab"]
