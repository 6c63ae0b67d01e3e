"""genlm-backend's API on genlm-core (genlm-compat). See docs/migration.md."""

from genlm.backend._guard import warn_if_real
from genlm.backend._surface import public_dir  # noqa: E402

warn_if_real("genlm-backend", "genlm.backend")

from genlm.backend.llm import AsyncLM, AsyncTransformer, MockAsyncLM, load_model_by_name  # noqa: E402
from genlm.backend.tokenization import Token, decode_vocab  # noqa: E402
from genlm.backend.trie import (  # noqa: E402
    AsyncTokenCharacterTrie,
    ParallelTokenCharacterTrie,
    TokenCharacterTrie,
)

__all__ = [
    "AsyncLM",
    "AsyncMlxLM",
    "AsyncTokenCharacterTrie",
    "AsyncTransformer",
    "AsyncVirtualLM",
    "MockAsyncLM",
    "ParallelTokenCharacterTrie",
    "Token",
    "TokenCharacterTrie",
    "decode_vocab",
    "load_model_by_name",
]


def __getattr__(name: str) -> object:
    """``AsyncVirtualLM`` / ``AsyncMlxLM``: built on first use (importing starts no engine)."""
    if name in ("AsyncVirtualLM", "AsyncMlxLM"):
        from genlm.backend import llm

        return getattr(llm, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__dir__ = public_dir(__name__)  # the API only, as the reference lists it
