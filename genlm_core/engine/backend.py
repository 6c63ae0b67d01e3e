"""`BaseLogprobBackend`: the LogprobBackend surface, written once for every engine.

An engine plugin subclasses it and implements one method::

    def _forward(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        # rows of logits or logprobs, one per context, >= len(byte_vocab) wide

Everything else is shared: input validation, the AutoBatcher (async path), the
output cache, trimming padded vocabulary rows and normalising in float32, the
sync and batch entry points, seeded sampling with EOS, cache controls, counters,
and shutdown. Engines with a better sampler or their own caches override
``sample``, ``_clear_engine_cache`` or ``_forward_uncached``; engines that can
normalise rows straight from their own buffers override ``_forward_rows``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from genlm_core.config import BackendConfig
from genlm_core.engine.batching import AutoBatcher
from genlm_core.engine.caches import OutputCache
from genlm_core.engine.memory import compact
from genlm_core.engine.validation import validate_context

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from genlm_core.token import Token

__all__ = ["BaseLogprobBackend"]


class BaseLogprobBackend:
    """Shared implementation of the LogprobBackend protocol."""

    config_class: ClassVar[type[BackendConfig]] = BackendConfig
    #: registered name, for messages
    backend_name: ClassVar[str] = "backend"

    def __init__(
        self,
        tokenizer: Any,
        config: BackendConfig | None = None,
        *,
        byte_vocab: "list[Token] | None" = None,
        str_vocab: list[str] | None = None,
        eos_token_ids: Sequence[int] | None = None,
    ) -> None:
        self.config = config if config is not None else self.config_class()
        self.tokenizer = tokenizer
        if byte_vocab is None:
            from genlm_core.engine.vocab import decode_vocab

            byte_vocab, str_vocab = decode_vocab(tokenizer)
        if str_vocab is None:
            str_vocab = [bytes(b).decode("utf-8", errors="replace") for b in byte_vocab]
        self.byte_vocab = byte_vocab
        self.str_vocab = str_vocab
        self.vocab_size = len(byte_vocab)
        if eos_token_ids is None:  # the checkpoint policy (genlm_core.engine.checkpoint), read from its files
            from genlm_core.engine.checkpoint import checkpoint_eos_ids

            eos_token_ids = checkpoint_eos_ids(self.config.model, tokenizer, len(byte_vocab))
        self.eos_token_ids: list[int] = [int(e) for e in eos_token_ids]
        cfg = self.config
        self.output_cache: OutputCache | None = (
            OutputCache(cfg.cache_size, cfg.cache_bytes, cfg.cache_to_cpu) if cfg.cache_size > 0 else None
        )
        self.batcher: AutoBatcher[tuple[int, ...], Any] = AutoBatcher(
            self._batch_fn,
            batch_size=cfg.batch_size,
            timeout=cfg.timeout,
            policy=cfg.batch_policy,
            run_in_thread=cfg.forward_thread if cfg.forward_thread is not None else self._forward_in_thread(),
            name=f"{self.backend_name}-logprobs",
        )
        self._closed = False

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, config: BackendConfig) -> "BaseLogprobBackend":
        raise NotImplementedError(f"{cls.__name__} must implement from_config")

    @classmethod
    def from_name(cls, model: str | None = None, **options: Any) -> "BaseLogprobBackend":
        """genlm-backend's constructor: ``Backend.from_name("gpt2", batch_size=8)``."""
        config = cls.config_class.build(cls.backend_name, model=model, **options)
        return cls.from_config(config)

    # ------------------------------------------------------------------ engine hooks
    def _forward(self, contexts: list[tuple[int, ...]]) -> "torch.Tensor | Sequence[torch.Tensor]":
        """Logits (or logprobs) of the next token for each context. Engines implement it.

        The contexts are validated and distinct: the AutoBatcher merges identical whole
        contexts (``key=ctx``) and the sync batch path de-duplicates before calling, so
        an engine never de-duplicates again. Rows come back in the order given.
        """
        raise NotImplementedError

    def _forward_uncached(self, contexts: list[tuple[int, ...]]) -> "torch.Tensor | Sequence[torch.Tensor]":
        """A full forward pass that uses no engine cache (engines with KV reuse override)."""
        return self._forward(contexts)

    def _clear_engine_cache(self) -> None:
        """Drop engine-side caches (KV). Engines with such caches override."""

    def _forward_in_thread(self) -> bool:
        """Where async batches run when ``forward_thread`` is None (called during ``__init__``).

        A worker thread keeps the event loop (the particles' own work) running during a
        forward pass, which pays when the pass waits on an accelerator. An engine that
        computes on the CPU with every core already (torch's intra-op threads) gains
        nothing from it and pays the thread hop: such engines return False.
        """
        return True

    @property
    def max_context_length(self) -> int | None:
        """Longest context the model accepts (None: no known limit)."""
        return None

    @property
    def device(self) -> Any:
        return "cpu"

    @property
    def dtype(self) -> str:
        """The dtype the engine computes in: ``"float32"``, ``"float16"`` or ``"bfloat16"``.

        Read from the engine (a weight's dtype), not echoed from the config: with
        ``dtype="auto"`` it is the checkpoint's dtype (see :mod:`genlm_core.engine.dtypes`).
        Results are float32 whatever it is. Engines override; the base computes in float32.
        """
        return "float32"

    # ------------------------------------------------------------------ shared machinery
    def validate(self, token_ids: Any) -> tuple[int, ...]:
        """The context as a tuple of ints, or a clear ``ValueError``."""
        if self._closed:
            raise RuntimeError(f"{self.backend_name}: the backend is closed")
        return validate_context(token_ids, self.vocab_size, self.max_context_length)

    def _finalize(self, out: Any) -> "torch.Tensor":
        import torch

        if not isinstance(out, torch.Tensor):
            out = torch.stack([torch.as_tensor(r) for r in out])
        if out.ndim == 1:
            out = out.unsqueeze(0)
        if out.shape[-1] < self.vocab_size:
            raise RuntimeError(
                f"{self.backend_name}: the model returned {out.shape[-1]} scores per row, "
                f"fewer than the {self.vocab_size} tokens of its tokenizer"
            )
        out = out[:, : self.vocab_size].to(torch.float32)
        return torch.log_softmax(out, dim=-1)

    def _forward_rows(self, contexts: list[tuple[int, ...]]) -> list["torch.Tensor"]:
        """The normalised row of every context, each a compact tensor of its own (not a
        view into a batch: a caller holding one row would keep the whole batch alive).

        The default normalises ``_forward``'s batch (:meth:`_finalize`) and copies the
        rows out. An engine that can normalise each row straight from its own output
        buffer overrides this to save the batch-sized copies; it keeps the same results
        (float32 ``log_softmax`` of the first ``vocab_size`` logits of each row).
        """
        return [compact(r) for r in self._finalize(self._forward(contexts)).unbind(0)]

    def _batch_fn(self, contexts: list[tuple[int, ...]]) -> list["torch.Tensor"]:
        # each caller gets a compact row of its own; the output cache keeps its own private copy
        results = self._forward_rows(contexts)
        if self.output_cache is not None:
            for ctx, row in zip(contexts, results):
                self.output_cache.put(ctx, row)
        return results

    def _empty_rows(self) -> "torch.Tensor":
        """The answer to an empty batch: ``(0, vocab)`` float32 rows."""
        import torch

        if self._closed:
            raise RuntimeError(f"{self.backend_name}: the backend is closed")
        return torch.empty((0, self.vocab_size), dtype=torch.float32, device=self._rows_device())

    def _rows_device(self) -> Any:
        """Device of the rows this backend returns (engines whose rows live elsewhere override)."""
        return self.device

    async def _shared_row(self, ctx: tuple[int, ...]) -> "torch.Tensor":
        """The row of a validated context; may be the cached object: never hand it out."""
        if self.output_cache is not None:
            hit = self.output_cache.get(ctx)
            if hit is not None:
                return hit
        return await self.batcher.submit(ctx, key=ctx)

    # ------------------------------------------------------------------ public surface
    # Contract: every tensor returned below belongs to its caller, who may modify it
    # in place (SMC code masks rows): a cache hit is cloned, a computed row is the
    # caller's own (the batcher copies it for every further caller of the same key),
    # a batch is a fresh stack.
    async def next_token_logprobs(self, token_ids: Sequence[int]) -> "torch.Tensor":
        """Normalised next-token log-probabilities (float32, length ``len(byte_vocab)``).

        The tensor is the caller's own: modifying it changes no later result.
        """
        ctx = self.validate(token_ids)
        if self.output_cache is not None:
            hit = self.output_cache.get(ctx)
            if hit is not None:
                return hit.clone()
        return await self.batcher.submit(ctx, key=ctx)

    def next_token_logprobs_sync(self, token_ids: Sequence[int]) -> "torch.Tensor":
        ctx = self.validate(token_ids)
        if self.output_cache is not None:
            hit = self.output_cache.get(ctx)
            if hit is not None:
                return hit.clone()
        return self.batcher.run_sync([ctx])[0]

    async def batch_next_token_logprobs(self, token_ids_list: Sequence[Sequence[int]]) -> "torch.Tensor":
        """One row per context, stacked (an empty list gives a ``(0, vocab)`` tensor)."""
        import torch

        contexts = [self.validate(t) for t in token_ids_list]  # fail before any work
        if not contexts:
            return self._empty_rows()
        unique = list(dict.fromkeys(contexts))
        rows = dict(zip(unique, await asyncio.gather(*(self._shared_row(c) for c in unique))))
        return torch.stack([rows[c] for c in contexts])

    def batch_next_token_logprobs_sync(self, token_ids_list: Sequence[Sequence[int]]) -> "torch.Tensor":
        """One row per context, stacked (an empty list gives a ``(0, vocab)`` tensor)."""
        import torch

        contexts = [self.validate(t) for t in token_ids_list]
        if not contexts:
            return self._empty_rows()
        results: dict[tuple[int, ...], Any] = {}
        todo: dict[tuple[int, ...], None] = {}
        for ctx in contexts:
            if ctx in results or ctx in todo:
                continue
            hit = self.output_cache.get(ctx) if self.output_cache is not None else None
            if hit is not None:
                results[ctx] = hit
            else:
                todo[ctx] = None
        unique_todo = list(todo)
        bs = self.config.batch_size
        for i in range(0, len(unique_todo), bs):
            chunk = unique_todo[i : i + bs]
            for ctx, row in zip(chunk, self.batcher.run_sync(chunk)):
                results[ctx] = row
        return torch.stack([results[c] for c in contexts])

    def next_token_logprobs_uncached(self, token_ids: Sequence[int]) -> "torch.Tensor":
        """One full forward pass, bypassing the output cache and engine caches."""
        ctx = self.validate(token_ids)
        with self.batcher.model_lock:
            return self._finalize(self._forward_uncached([ctx]))[0]

    async def sample(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[int]:
        """Sample up to ``max_tokens`` tokens; stops before any token in ``eos_token_ids``.

        ``seed`` makes the draw reproducible. ``temperature=0`` is greedy. The EOS
        token itself is not included in the result.
        """
        import torch

        ctx = list(self.validate(prompt_token_ids))
        max_tokens, temperature, eos = self._check_sample_args(max_tokens, temperature, eos_token_ids)
        gen = torch.Generator()
        if seed is not None:
            gen.manual_seed(int(seed))
        else:
            gen.seed()
        out: list[int] = []
        for _ in range(max_tokens):
            # a context of max_context_length tokens is still scored (validate accepts it)
            if self.max_context_length is not None and len(ctx) > self.max_context_length:
                break
            logprobs = await self._shared_row(self.validate(ctx))  # read only
            tok = _draw(logprobs, temperature, gen)
            if tok in eos:
                break
            out.append(tok)
            ctx.append(tok)
        return out

    async def batch_sample(
        self,
        prompt_token_ids_list: Sequence[Sequence[int]],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[list[int]]:
        """Sample for each prompt concurrently (batched). Prompt ``i`` uses ``seed + i``.

        Every prompt and argument is checked before any sampling starts. Engines with a
        sampler of their own override :meth:`sample` only: its concurrent calls batch.
        """
        for p in prompt_token_ids_list:
            self.validate(p)
        self._check_sample_args(max_tokens, temperature, eos_token_ids)
        return list(
            await asyncio.gather(
                *(
                    self.sample(p, max_tokens, eos_token_ids, temperature, None if seed is None else seed + i)
                    for i, p in enumerate(prompt_token_ids_list)
                )
            )
        )

    def _check_sample_args(
        self, max_tokens: int, temperature: float, eos_token_ids: Sequence[int] | None
    ) -> tuple[int, float, set[int]]:
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
            raise ValueError(f"max_tokens must be a non-negative int, got {max_tokens!r}")
        if not temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {temperature!r}")
        eos = set(self.eos_token_ids if eos_token_ids is None else (int(e) for e in eos_token_ids))
        return max_tokens, float(temperature), eos

    def clear_cache(self) -> None:
        """Drop the output cache and engine caches (KV)."""
        if self.output_cache is not None:
            self.output_cache.clear()
        self._clear_engine_cache()

    def reset_async_queries(self) -> None:
        """genlm-backend's name: fail and drop waiting requests. Not needed after errors."""
        self.batcher.reset()

    @property
    def healthy(self) -> bool:
        """Whether the backend can answer (engines with processes of their own refine it)."""
        return not self._closed

    def info(self) -> dict[str, Any]:
        """What runs where (engines add their process/parallel layout)."""
        return {
            "backend": self.backend_name,
            "model": self.config.model,
            "device": str(self.device),
            "vocab_size": self.vocab_size,
            "healthy": self.healthy,
        }

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"batcher": self.batcher.stats.as_dict()}
        if self.output_cache is not None:
            out["output_cache"] = self.output_cache.stats()
        return out

    def close(self) -> None:
        """Stop the batcher (waiting callers get an error) and release the engine."""
        if self._closed:
            return
        self._closed = True
        self.batcher.close()
        self._close_engine()

    def _close_engine(self) -> None:
        """Release engine resources. Engines override."""

    def __enter__(self) -> "BaseLogprobBackend":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> "BaseLogprobBackend":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.backend_name} model={self.config.model!r} "
            f"dtype={self.dtype} vocab={self.vocab_size}>"
        )


def _draw(logprobs: "torch.Tensor", temperature: float, gen: "torch.Generator") -> int:
    import torch

    lp = logprobs.detach().to("cpu", torch.float32)
    if temperature == 0:
        return int(torch.argmax(lp).item())
    probs = torch.softmax(lp / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=gen).item())
