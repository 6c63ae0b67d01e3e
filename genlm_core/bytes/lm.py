"""`StatefulTokenizedLM`: an immutable token context over a LogprobBackend."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["StatefulTokenizedLM", "default_initial_context"]


def default_initial_context(model: Any) -> tuple[int, ...]:
    """``(bos,)`` if the tokenizer has a BOS token, else ``(eos,)``: backends need
    a non-empty context."""
    tok = getattr(model, "tokenizer", None)
    bos = getattr(tok, "bos_token_id", None)
    if isinstance(bos, int):
        return (bos,)
    eos = list(getattr(model, "eos_token_ids", None) or [])
    if not eos:
        e = getattr(tok, "eos_token_id", None)
        eos = [e] if isinstance(e, int) else []
    if eos:
        return (int(eos[0]),)
    raise ValueError(
        "the tokenizer has neither a BOS nor an EOS token: pass initial_context=(token ids) in BeamParams"
    )


class StatefulTokenizedLM:
    """A token context (an immutable tuple) and the model that scores it.

    ``lm << token`` returns a new state; when ``max_context_length`` is set the
    context keeps its last ``max_context_length`` tokens, and the limit is passed
    on to every extended state (the context is never truncated in place).
    """

    __slots__ = ("model", "context", "max_context_length")

    def __init__(self, model: Any, context: Sequence[int], max_context_length: int | None = None) -> None:
        if max_context_length is not None and max_context_length < 1:
            raise ValueError(f"max_context_length must be >= 1, got {max_context_length}")
        ctx = tuple(int(t) for t in context)
        if max_context_length is not None and len(ctx) > max_context_length:
            ctx = ctx[-max_context_length:]
        self.model = model
        self.context: tuple[int, ...] = ctx
        self.max_context_length = max_context_length

    @classmethod
    def initial(
        cls,
        model: Any,
        initial_context: Sequence[int] | None = None,
        max_context_length: int | None = None,
    ) -> "StatefulTokenizedLM":
        if initial_context is None:
            initial_context = default_initial_context(model)
        if max_context_length is None:
            max_context_length = getattr(model, "max_context_length", None)
            if not isinstance(max_context_length, int):
                max_context_length = None
        return cls(model, initial_context, max_context_length=max_context_length)

    def __lshift__(self, token: int) -> "StatefulTokenizedLM":
        ctx = (*self.context, int(token))
        m = self.max_context_length
        if m is not None and len(ctx) > m:
            ctx = ctx[-m:]
        return type(self)(self.model, ctx, max_context_length=m)  # a subclass stays itself

    async def logp_next(self) -> "torch.Tensor":
        """Next-token log-probabilities (batched with concurrent callers)."""
        return await self.model.next_token_logprobs(self.context)

    def __len__(self) -> int:
        return len(self.context)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, StatefulTokenizedLM)
            and other.model is self.model
            and other.context == self.context
        )

    def __hash__(self) -> int:
        return hash((id(self.model), self.context))

    def __repr__(self) -> str:
        vocab = getattr(self.model, "byte_vocab", None)
        if vocab is None:
            return f"StatefulTokenizedLM({list(self.context)})"
        parts = [repr(bytes(vocab[t]))[2:-1] for t in self.context[-8:]]
        more = "...|" if len(self.context) > 8 else ""
        return more + "|".join(parts)
