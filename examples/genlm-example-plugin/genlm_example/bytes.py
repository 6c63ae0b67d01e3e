"""A byte-level model for byte-level backends, registered as the byte model ``example-bytes``.

When every token of a backend is one byte (ids 0-255, the bigram's) plus EOS, the next
byte's distribution is the next token's: no beam over tokenizations is needed. Built by
``await genlm_core.load_byte_model(llm, "example-bytes", prompt="...")``.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from genlm_core import GenlmConfig


class ByteTokenParams(GenlmConfig):
    prompt: str = Field("", description="text the state starts after (empty: the start of a text)")


class ByteTokenState:
    """A context of byte tokens; ``await (state << byte)`` reads one more byte."""

    def __init__(self, llm: Any, context: tuple[int, ...]) -> None:
        self.llm, self.context = llm, context

    @classmethod
    async def initial(cls, llm: Any, params: ByteTokenParams) -> "ByteTokenState":
        vocab = [bytes(t) for t in llm.byte_vocab]
        if len(vocab) < 257 or vocab[:256] != [bytes([i]) for i in range(256)] or not llm.eos_token_ids:
            raise ValueError(
                "example-bytes needs a backend whose tokens 0-255 are the single bytes, with an EOS "
                "token (such as example-bigram); use the byte model 'beam' for any other backend"
            )
        start = tuple(params.prompt.encode("utf-8")) or (llm.eos_token_ids[0],)
        return cls(llm, start)

    async def __lshift__(self, byte: int) -> "ByteTokenState":
        if not 0 <= byte < 256:
            raise ValueError(f"a byte is an int in 0..255, got {byte!r}")
        return ByteTokenState(self.llm, self.context + (byte,))

    async def logp_next(self) -> Any:
        """Log-probabilities of the next token: bytes 0-255, then EOS (the backend's row)."""
        return await self.llm.next_token_logprobs(self.context)

    async def cleanup(self) -> None:
        return None
