"""genlm-backend's call signatures on a genlm-core backend (a mixin of every
``genlm.backend.llm`` class).

* ``lora_name=`` on every call selects an adapter for that call, as in genlm-backend.
  genlm-core backends have one active adapter, so calls naming different adapters
  take turns: the calls naming the active one run (and batch) together; a call naming
  another waits until they are done, then switches (:class:`AdapterTurns`).
  ``set_lora(path, name)`` and ``clear_lora()`` raise as in genlm-backend 0.3.1.
* Bad contexts raise genlm-core's messages as classes genlm-backend raised too
  (:mod:`genlm.backend.errors`).
* ``sample`` raises :class:`~genlm.backend.errors.ContextWindowError` where the
  context outgrows the model's window; ``batch_sample`` gives every prompt the same
  seeded stream.

:class:`AsyncLM` is genlm-backend's abstract base of a model of one's
own; genlm-core's backends are registered as its subclasses.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from genlm.backend._surface import public_dir  # noqa: E402
from genlm.backend.errors import ContextWindowError, reference_error

from genlm_core.engine.backend import BaseLogprobBackend
from genlm_core.engine.contract import SampleRequest
from genlm_core.engine.sampling import draw_tokens, sampling_temperature

__all__ = ["AdapterTurns", "AsyncLM", "ReferenceCalls"]

UNKNOWN_ADAPTER = "unknown LoRA adapter: {!r}; register it with add_new_lora()"


class AdapterTurns:
    """Which adapter a backend's calls use, one adapter at a time (see the module)."""

    def __init__(self) -> None:
        self.users = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._cond: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        loop = asyncio.get_running_loop()
        if self._cond is None or self._loop is not loop:
            self._loop, self._cond, self.users = loop, asyncio.Condition(), 0
        return self._cond

    @contextlib.asynccontextmanager
    async def use(self, llm: "ReferenceCalls", name: str | None) -> AsyncIterator[None]:
        cond = self._condition()
        async with cond:
            await cond.wait_for(lambda: self.users == 0 or llm.active_adapter == name)
            llm._switch_adapter(name)
            self.users += 1
        try:
            yield
        finally:
            async with cond:
                self.users -= 1
                cond.notify_all()

    def use_sync(self, llm: "ReferenceCalls", name: str | None) -> None:
        if self.users and llm.active_adapter != name:
            raise RuntimeError(
                f"lora_name={name!r}: asynchronous calls are running on adapter {llm.active_adapter!r}; "
                "a synchronous call cannot switch adapters under them (await them first)"
            )
        llm._switch_adapter(name)


class ReferenceCalls:
    """The genlm-backend surface over a genlm-core backend (see the module docstring)."""

    # ------------------------------------------------------------------ adapters
    @property
    def _turns(self) -> AdapterTurns:
        turns = self.__dict__.get("_adapter_turns")
        if turns is None:
            turns = self.__dict__["_adapter_turns"] = AdapterTurns()
        return turns

    @property
    def active_adapter(self) -> str | None:
        return getattr(self, "active_lora", None)

    def _switch_adapter(self, name: str | None) -> None:
        if name == self.active_adapter:
            return
        engine = super()
        if name is None:
            engine.clear_lora()  # type: ignore[misc]
            return
        if name not in (getattr(self, "loras", None) or {}):
            raise ValueError(UNKNOWN_ADAPTER.format(name))
        engine.set_lora(name)  # type: ignore[misc]

    def set_lora(self, lora_path: Any = None, lora_name: Any = None) -> None:
        """Removed in genlm-backend 0.3.1: name the adapter per call."""
        raise RuntimeError(
            "set_lora() was removed: there is no active-adapter global anymore. "
            "Pass lora_name= per call (next_token_logprobs/sample/...)."
        )

    def clear_lora(self) -> None:
        """Removed in genlm-backend 0.3.1: ``lora_name=None`` is the base model."""
        raise RuntimeError("clear_lora() was removed: omit lora_name (None = base model).")

    def add_new_lora(self, lora_path: Any, lora_name: str = "lora_1") -> None:
        """Load the adapter folder ``lora_path`` as ``lora_name`` (replacing one of that name)."""
        if lora_name in (getattr(self, "loras", None) or {}):
            self.remove_lora(lora_name)
        self.load_lora(lora_path, lora_name)  # type: ignore[attr-defined]

    def remove_lora(self, lora_name: str) -> None:
        """Unload adapter ``lora_name`` (the base model runs if it was the active one)."""
        raise NotImplementedError(f"{type(self).__name__} cannot unload LoRA adapters")

    # ------------------------------------------------------------------ checks
    def validate(self, token_ids: Any) -> tuple[int, ...]:
        try:
            return super().validate(token_ids)  # type: ignore[misc]
        except ValueError as exc:
            raise reference_error(exc, token_ids) from None

    # ------------------------------------------------------------------ calls
    async def next_token_logprobs(self, token_ids: Any, lora_name: str | None = None) -> Any:
        async with self._turns.use(self, lora_name):
            return await super().next_token_logprobs(token_ids)  # type: ignore[misc]

    def next_token_logprobs_sync(self, token_ids: Any, lora_name: str | None = None) -> Any:
        self._turns.use_sync(self, lora_name)
        return super().next_token_logprobs_sync(token_ids)  # type: ignore[misc]

    async def batch_next_token_logprobs(self, token_ids_list: Any, lora_name: str | None = None) -> Any:
        async with self._turns.use(self, lora_name):
            return await super().batch_next_token_logprobs(token_ids_list)  # type: ignore[misc]

    def batch_next_token_logprobs_sync(self, token_ids_list: Any, lora_name: str | None = None) -> Any:
        self._turns.use_sync(self, lora_name)
        return super().batch_next_token_logprobs_sync(token_ids_list)  # type: ignore[misc]

    def next_token_logprobs_uncached(self, token_ids: Any, lora_name: str | None = None) -> Any:
        self._turns.use_sync(self, lora_name)
        return super().next_token_logprobs_uncached(token_ids)  # type: ignore[misc]

    async def sample(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
        lora_name: str | None = None,
    ) -> list[int]:
        """genlm-core's sampler; where the context reaches the end of the model's window
        before ``max_tokens`` tokens it raises :class:`ContextWindowError` (genlm-backend
        failed with an ``IndexError`` there) instead of returning fewer tokens."""
        async with self._turns.use(self, lora_name):
            out = await super().sample(prompt_token_ids, max_tokens, eos_token_ids, temperature, seed)  # type: ignore[misc]
        limit, n = self.max_context_length, len(prompt_token_ids)  # type: ignore[attr-defined]
        if limit is not None and len(out) < max_tokens and n + len(out) > limit:
            raise ContextWindowError(
                f"sample: the context reached the model's window ({limit} tokens) after {len(out)} of "
                f"max_tokens={max_tokens} tokens (prompt of {n}); shorten the prompt to at most "
                f"{limit - max_tokens + 1} tokens or ask for at most {limit - n + 1} (the tokens drawn "
                "are in this error's .tokens)",
                out,
            )
        return out

    async def batch_sample(
        self,
        prompt_token_ids_list: Sequence[Sequence[int]],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
        lora_name: str | None = None,
    ) -> list[list[int]]:
        """``sample`` of every prompt concurrently (batched), each with the same ``seed``
        (so equal prompts give equal samples, as in genlm-backend); every prompt is
        checked first."""
        for p in prompt_token_ids_list:
            self.validate(p)
        runs = (
            self.sample(p, max_tokens, eos_token_ids, temperature, seed, lora_name)
            for p in prompt_token_ids_list
        )
        return list(await asyncio.gather(*runs))

    # ------------------------------------------------------------------ options
    @property
    def batch_size(self) -> int:
        return self.config.batch_size  # type: ignore[attr-defined]

    @property
    def timeout(self) -> float:
        return self.config.timeout  # type: ignore[attr-defined]


class AsyncLM(abc.ABC):
    """genlm-backend's ``AsyncLM(tokenizer)``: a subclass writes ``next_token_logprobs`` and
    ``next_token_logprobs_sync``; the batch calls and the samplers are made of them (the
    draws genlm-core's are: the same tokens as genlm-backend's for a seed). Every genlm-core
    backend is an ``AsyncLM`` too (``isinstance`` holds), batching and caching its own calls."""

    def __init__(self, tokenizer: Any) -> None:
        from genlm.backend.tokenization.vocab import decode_vocab

        self.tokenizer = tokenizer
        self.byte_vocab, self.str_vocab = decode_vocab(tokenizer)

    @abc.abstractmethod
    async def next_token_logprobs(self, token_ids: Any, lora_name: str | None = None) -> Any:
        """The normalised next-token log-probabilities of ``token_ids``."""

    @abc.abstractmethod
    def next_token_logprobs_sync(self, token_ids: Any, lora_name: str | None = None) -> Any:
        """Synchronous :meth:`next_token_logprobs`."""

    async def batch_next_token_logprobs(self, token_ids_list: Any, lora_name: str | None = None) -> Any:
        import torch

        calls = (self.next_token_logprobs(t, lora_name=lora_name) for t in token_ids_list)
        return torch.stack(list(await asyncio.gather(*calls)))

    def batch_next_token_logprobs_sync(self, token_ids_list: Any, lora_name: str | None = None) -> Any:
        import torch

        return torch.stack([self.next_token_logprobs_sync(t, lora_name=lora_name) for t in token_ids_list])

    def add_new_lora(self, lora_path: Any, lora_name: str) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot load LoRA adapters (write add_new_lora)")

    def remove_lora(self, lora_name: str) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot unload LoRA adapters (write remove_lora)")

    set_lora = ReferenceCalls.set_lora
    clear_lora = ReferenceCalls.clear_lora

    def clear_cache(self) -> None:  # noqa: B027 - genlm-backend's is a no-op to override too
        """Nothing is cached here (a subclass that caches clears it)."""

    async def sample(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        eos_token_ids: Sequence[int],
        temperature: float = 1.0,
        seed: int | None = None,
        lora_name: str | None = None,
    ) -> list[int]:
        """Up to ``max_tokens`` tokens drawn from this model's rows, stopping before an EOS."""
        eos = frozenset(int(e) for e in eos_token_ids)
        req = SampleRequest(tuple(prompt_token_ids), max_tokens, eos, sampling_temperature(temperature), seed)
        return await draw_tokens(req, lambda ctx: self.next_token_logprobs(list(ctx), lora_name=lora_name))

    async def batch_sample(
        self,
        prompt_token_ids_list: Sequence[Sequence[int]],
        max_tokens: int,
        eos_token_ids: Sequence[int],
        temperature: float = 1.0,
        seed: int | None = None,
        lora_name: str | None = None,
    ) -> list[list[int]]:
        """:meth:`sample` of every prompt concurrently, each with the same ``seed``."""
        runs = (
            self.sample(p, max_tokens, eos_token_ids, temperature, seed, lora_name)
            for p in prompt_token_ids_list
        )
        return list(await asyncio.gather(*runs))


AsyncLM.register(BaseLogprobBackend)

__dir__ = public_dir(__name__)  # the API only, as the reference lists it
