"""genlm.bytes.byte_lm.trie_state (names resolved on use: see genlm.backend._surface)."""

from genlm.backend._surface import module_getattr

__getattr__, __all__ = module_getattr(__name__)
