"""genlm.backend.llm.mlx (names resolved on use: see genlm.backend._surface)."""

from genlm.backend._surface import module_getattr, public_dir

__getattr__, __all__ = module_getattr(__name__)

__dir__ = public_dir(__name__)  # the API only, as the reference lists it
