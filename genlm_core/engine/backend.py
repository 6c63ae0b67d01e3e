"""`BaseLogprobBackend`: the LogprobBackend surface, written once, holding an engine.

A backend holds an :class:`~genlm_core.engine.contract.Engine` (the part a plugin
writes: ``forward`` over distinct contexts, an optional sampler, its own limits,
dtype, device, stats and ``close``) and decides everything else once, for every
engine:

* the vocabulary (the engine's, or decoded from its tokenizer), the default EOS ids
  and the context limit (the smaller of the checkpoint's and the engine's), from the
  :class:`~genlm_core.engine.checkpoint.Checkpoint` the core read;
* dtype refusals: before the engine loads (:meth:`Engine.supported_dtypes`) and after
  (an engine computing in another dtype than the one resolved is refused);
* input validation, the AutoBatcher (async path), the output cache (the registered
  cache ``output_cache_impl`` names), cutting padded vocabulary rows and normalising in
  float32, refusing rows that are no distribution (a NaN, no finite score:
  :mod:`~genlm_core.engine.row_checks`), the sync and batch entry points;
* sampling: the checks and the clamp to the context limit, then the engine's sampler
  (capability ``"sample"``, batched) or draws from the rows;
* bursts (capability ``"burst"``: the core's decode step; ``"decode"``: the engine's
  own): an SMC decode loop run here, the program drawing (:mod:`genlm_core.engine.burst`);
* one engine lock (:attr:`engine_lock`) that every engine call holds, cache controls
  (KV reuse for an engine keeping a :class:`~genlm_core.engine.kv_reuse.KVReuse`),
  counters, ``info``, health and shutdown.

``genlm_core.load`` builds one with :meth:`BaseLogprobBackend.from_checkpoint`;
``from_config`` and ``from_name`` read the checkpoint and do the same.

Kept in one module: it is one class, the surface every backend shares; its entry
points, sampling, cache controls and shutdown all act on the same engine, engine lock,
batchers and output cache, and the ownership rules (every returned row is its
caller's) hold only because those methods are written together.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from genlm_core.config import BackendConfig
from genlm_core.engine import memory
from genlm_core.engine.batching import AutoBatcher
from genlm_core.engine.caches import output_cache_for
from genlm_core.engine.checkpoint import Checkpoint, engine_context_limit, read_checkpoint
from genlm_core.engine.contexts import Context, run_distinct
from genlm_core.engine.contract import (
    BURST_CAPABILITIES,
    Engine,
    SampleRequest,
    check_engine,
    refuse_unsupported_dtype,
)
from genlm_core.engine.dtypes import UnsupportedDtypeError
from genlm_core.engine.heap import settle_after_load
from genlm_core.engine.lora import LoraAdapters
from genlm_core.engine.memory import accelerator, compact, moved_from_cpu, private_copies, private_copy
from genlm_core.engine.row_checks import EngineOutputError, row_error, unreadable_rows
from genlm_core.engine.sampling import draw_tokens, draw_tokens_sync, sampling_temperature
from genlm_core.engine.validation import RecentContexts, validate_context

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from genlm_core.engine.burst import BurstReport, EngineControl
    from genlm_core.protocols import PrefixKVCache

__all__ = ["BaseLogprobBackend", "backend_class", "registered_name"]


def registered_name(engine_class: type) -> str | None:
    """The name under which a plugin registered ``engine_class`` (None: not registered)."""
    from genlm_core.registry import get_registry

    target = f"{engine_class.__module__}:{engine_class.__qualname__}"
    for reg in get_registry().all("backend"):
        if reg.target == target:
            return reg.name
    return None


class BaseLogprobBackend:
    """Shared implementation of the LogprobBackend protocol around an :class:`Engine`."""

    config_class: ClassVar[type[BackendConfig]] = BackendConfig
    #: registered name, for messages
    backend_name: ClassVar[str] = "backend"
    #: the engine :meth:`from_checkpoint` loads
    engine_class: ClassVar[type[Engine]] = Engine

    def __init__(
        self,
        engine: Engine,
        config: BackendConfig | None = None,
        checkpoint: Checkpoint | None = None,
        *,
        name: str | None = None,
    ) -> None:
        """Hold ``engine`` (loaded from ``checkpoint``; None: what the engine itself loaded,
        :attr:`Engine.model_config`, for an engine built by hand)."""
        check_engine(engine)
        if name is None and type(self).backend_name == "backend":
            name = registered_name(type(engine))
        if name is not None:
            self.backend_name = name  # type: ignore[misc]
        if config is None:
            config_class = (
                self.config_class if self.config_class is not BackendConfig else engine.config_class
            )
            config = config_class()
        served = engine.serves_model
        if served is not None and config.model is not None and str(config.model) != served:
            raise ValueError(
                f"{self.backend_name}: model={config.model!r}, but the engine serves {served!r}: leave "
                "model out (the engine decides it) or point the backend at an engine serving that model"
            )
        if served is not None and config.model is None:
            config = config.model_copy(update={"model": served})
        self.config = config
        self.engine = engine
        checkpoint = checkpoint if checkpoint is not None else Checkpoint("none", self.config.model)
        self.checkpoint = checkpoint.completed(engine.model_config, engine.generation_config)
        self.tokenizer = engine.tokenizer
        byte_vocab, str_vocab = engine.byte_vocab, engine.str_vocab
        if byte_vocab is None:
            from genlm_core.engine.vocab import decode_vocab

            byte_vocab, str_vocab = decode_vocab(engine.tokenizer)
        if str_vocab is None:
            str_vocab = [bytes(b).decode("utf-8", errors="replace") for b in byte_vocab]
        self.byte_vocab = byte_vocab
        self.str_vocab = str_vocab
        self.vocab_size = len(byte_vocab)
        engine.vocab_size = self.vocab_size  # the one width of a row, for the engine too
        tokenizer_eos = engine.eos_token_ids
        if tokenizer_eos is None:
            tokenizer_eos = getattr(engine.tokenizer, "eos_token_id", None)
        self.eos_token_ids: list[int] = self.checkpoint.eos_token_ids(tokenizer_eos, self.vocab_size)
        self._max_context_length = engine_context_limit(
            self.checkpoint.max_context_length, engine.max_context_length, engine.max_positions
        )
        requested = self.config.requested_dtype()
        wanted = self.checkpoint.dtype or (None if requested == "auto" else requested)
        if wanted is not None and engine.dtype != wanted:
            raise UnsupportedDtypeError(
                self.backend_name, wanted, str(engine.device), f"the engine computes in {engine.dtype}"
            )
        cfg = self.config
        if "kv" in engine.supports:  # the engine resumes from cached prefixes: the core wires its cache
            from genlm_core.engine.kv_reuse import KVReuse

            engine.kv = KVReuse.for_engine(engine, cfg)
        #: the LoRA adapters loaded, by name, and the active one (capability "lora")
        self.adapters = LoraAdapters()
        #: held by every call into the engine: batches, samples, cache resets, adapters, close
        self.engine_lock = threading.RLock()
        self.output_cache = output_cache_for(cfg)
        self.batcher: AutoBatcher[tuple[int, ...], Any] = AutoBatcher(
            self._batch_fn,
            batch_size=cfg.batch_size,
            timeout=cfg.timeout,
            policy=cfg.batch_policy,
            run_in_thread=cfg.forward_thread if cfg.forward_thread is not None else engine.forward_in_thread,
            name=f"{self.backend_name}-logprobs",
            lock=self.engine_lock,
        )
        #: the engine's sampler, batched (None: samples are drawn from the rows)
        self.sampler: AutoBatcher[SampleRequest, list[int]] | None = (
            AutoBatcher(
                self.engine.sample,
                batch_size=cfg.batch_size,
                timeout=cfg.timeout,
                name=f"{self.backend_name}-sample",
                lock=self.engine_lock,
            )
            if "sample" in engine.supports
            else None
        )
        self._recent = RecentContexts()  # validation checks a particle's new id only
        #: where a row the output cache holds in host memory goes back to (None: the rows
        #: are on the CPU already): see :meth:`own_row`
        self._rows_accelerator = accelerator(
            engine.rows_device if engine.rows_device is not None else engine.device
        )
        self._closed = False

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_checkpoint(
        cls,
        checkpoint: Checkpoint,
        config: BackendConfig,
        *,
        engine_class: type[Engine] | None = None,
        name: str | None = None,
    ) -> "BaseLogprobBackend":
        """Load the engine for ``checkpoint`` (what ``genlm_core.load`` read) and hold it.

        A dtype the engine cannot compute in on its device is refused before it loads."""
        engine_class = engine_class or cls.engine_class
        name = name or cls.backend_name
        if config.model is None and checkpoint.model is not None:  # model=None: the default it resolved to
            config = config.model_copy(update={"model": checkpoint.model})
        refuse_unsupported_dtype(engine_class, checkpoint, config, name)
        engine = engine_class.load(checkpoint, config)
        try:
            backend = cls(engine, config, checkpoint, name=name)
        except BaseException:
            engine.close()
            raise
        lora_path = getattr(config, "lora_path", None)
        if lora_path is not None:  # an adapter loaded and activated at start
            lora_name = getattr(config, "lora_name", "default")
            backend.load_lora(lora_path, lora_name)
            backend.set_lora(lora_name)
        settle_after_load()  # the first load's full collection, here rather than mid-program
        return backend

    @classmethod
    def from_config(cls, config: BackendConfig) -> "BaseLogprobBackend":
        """Read ``config``'s checkpoint (:func:`~genlm_core.engine.checkpoint.read_checkpoint`)
        and load: what ``genlm_core.load`` does after resolving the backend."""
        from genlm_core.registry import UnknownImplementationError, get_registry

        try:
            formats = get_registry().get("backend", cls.backend_name).model_formats
        except UnknownImplementationError:
            formats = None
        return cls.from_checkpoint(read_checkpoint(config, formats, cls.backend_name), config)

    @classmethod
    def from_name(cls, model: str | None = None, **options: Any) -> "BaseLogprobBackend":
        """genlm-backend's constructor: ``Backend.from_name("gpt2", batch_size=8)``."""
        config = cls.config_class.build(cls.backend_name, model=model, **options)
        return cls.from_config(config)

    # ------------------------------------------------------------------ what the engine says
    def __getattr__(self, name: str) -> Any:
        """Deprecated: the engine's own public attributes (``llm.weights_type``,
        ``llm.in_process``...) read through the backend; read ``llm.engine.<name>``."""
        engine = self.__dict__.get("engine")
        if engine is None or name.startswith("_"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        try:
            value = getattr(engine, name)
        except AttributeError:
            raise AttributeError(
                f"{type(self).__name__!r} object and its engine {type(engine).__name__!r} have no "
                f"attribute {name!r}"
            ) from None
        import warnings

        warnings.warn(
            f"reading the engine's {name!r} through the backend (llm.{name}) is deprecated and "
            f"will be removed in genlm-core 0.3: read llm.engine.{name}",
            DeprecationWarning,
            stacklevel=2,
        )
        return value

    @property
    def max_context_length(self) -> int | None:
        """Longest context accepted: the smaller of the checkpoint's limit and the engine's
        own (None: no known limit)."""
        return self._max_context_length

    @property
    def device(self) -> Any:
        return self.engine.device

    @property
    def dtype(self) -> str:
        """The dtype the engine computes in (``"float32"``, ``"float16"`` or ``"bfloat16"``),
        read from the engine; with ``dtype="auto"`` the checkpoint's (see
        :mod:`genlm_core.engine.dtypes`). Results are float32 whatever it is."""
        return self.engine.dtype

    # ------------------------------------------------------------------ shared machinery
    def validate(self, token_ids: Any) -> Context:
        """The context as a tuple of ints, or a clear ``ValueError``."""
        if self._closed:
            raise RuntimeError(f"{self.backend_name}: the backend is closed")
        return validate_context(token_ids, self.vocab_size, self.max_context_length, recent=self._recent)

    def _logits(self, out: Any) -> "torch.Tensor":
        """An engine's logits as one ``(rows, vocab)`` float32 batch (padded vocabulary cut)."""
        import torch

        if not isinstance(out, torch.Tensor):
            out = torch.stack([torch.as_tensor(r) for r in out])
        if out.ndim == 1:
            out = out.unsqueeze(0)
        if out.shape[-1] < self.vocab_size:
            raise EngineOutputError(
                f"{self.backend_name}: the model returned {out.shape[-1]} scores per row, "
                f"fewer than the {self.vocab_size} tokens of its tokenizer"
            )
        return out[:, : self.vocab_size].to(torch.float32)

    def _finalize(self, out: Any) -> "torch.Tensor":
        """The core's normalisation of an engine's logits: the float32 ``log_softmax`` of
        :meth:`_logits`' batch (no copy before it where ``out`` is that batch already)."""
        import torch

        return torch.log_softmax(self._logits(out), dim=-1)

    def _rows(
        self,
        contexts: list[tuple[int, ...]],
        uncached: bool = False,
        for_cache: list["torch.Tensor"] | None = None,
    ) -> list["torch.Tensor | EngineOutputError"]:
        """The normalised row of every context, each a compact tensor of its own (not a
        view into a batch: a caller holding one row would keep the whole batch alive).

        Logits are normalised here (float32 ``log_softmax`` of the first ``vocab_size``
        of each row); an engine returning final rows (``returns = "logprobs"``) keeps its own.
        A row no caller may read (a NaN, no finite score: :mod:`~genlm_core.engine.row_checks`)
        is an :class:`EngineOutputError` in its place. ``for_cache``: filled, where the rows
        were normalised as one fresh batch, with rows nobody else holds for the output
        cache to adopt (:meth:`OutputCache.adopt_many
        <genlm_core.engine.caches.OutputCache.adopt_many>`): that batch's rows, or on a GPU a
        copy of each made in the callers' batched copy."""
        engine = self.engine
        out = engine.forward_uncached(contexts) if uncached else engine.forward(contexts)
        return self._normalised(out, contexts, for_cache)

    def _rows_or_raise(self, contexts: list[tuple[int, ...]], uncached: bool = False) -> list["torch.Tensor"]:
        """:meth:`_rows`, raising the first row's error (a caller that needs every row)."""
        rows = self._rows(contexts, uncached)
        for row in rows:
            if isinstance(row, EngineOutputError):
                raise row
        return rows  # type: ignore[return-value]

    def _normalised(
        self,
        out: Any,
        contexts: Sequence[tuple[int, ...]],
        for_cache: list["torch.Tensor"] | None = None,
    ) -> list["torch.Tensor | EngineOutputError"]:
        """The engine's scores as normalised float32 rows, each compact (see :meth:`_rows`)."""
        import torch

        copied = False  # the rows are private copies already (no compact() below)
        if self.engine.returns == "logits" and not isinstance(out, torch.Tensor):
            # rows one by one (an engine handing back each row as it comes): each row is
            # normalised into a tensor of its own, no batch and no copy after it. What is
            # checked is what a caller reads: each row cut to the vocabulary (a padded
            # column's NaN is no caller's; a finite one does not make a masked row readable)
            scores = [torch.as_tensor(r)[..., : self.vocab_size] for r in out]
            rows = self._normalised_rows(scores)
        elif self.engine.returns == "logits":
            scores = self._logits(out)
            normalised = self._finalize(scores)  # a fresh batch: nobody else holds it
            rows = list(normalised.unbind(0))
            n = len(rows)
            # each caller's row a tensor of its own, copied before _row_errors reads the
            # batch on the host: on a GPU the copies (one batched copy) are queued behind
            # the step and the host's work runs beside it, not after it
            on_gpu = normalised.device.type in memory.BATCHED_COPY_DEVICES and n > 1
            # a cache that moves rows to the CPU takes the batch's rows as they are (it copies
            # them to the host in one transfer): no device copies for it
            to_cpu = bool(getattr(self.output_cache, "to_cpu", False))
            if for_cache is not None and on_gpu and not to_cpu:
                # on a GPU the output cache gets a copy of each row too, in the same batched
                # copy: blocks of a batch's rows, long-lived and of every size, held the
                # caching allocator's large segments (bench_serve's server on an H100: 2,636
                # MB of GPU memory with blocks, 2,252 with rows), where rows pack its small pool
                copies = private_copies(rows + rows)
                rows, copied = copies[:n], True
                for_cache.extend(copies[n:])
            elif for_cache is not None:
                for_cache.extend(rows)  # the cache adopts the batch's rows; the callers get copies
                rows, copied = private_copies(rows), True
            elif on_gpu:
                rows, copied = private_copies(rows), True
        else:
            rows = list(out.unbind(0)) if hasattr(out, "unbind") else list(out)
            for row in rows:
                if tuple(row.shape) != (self.vocab_size,):
                    raise EngineOutputError(
                        f"{self.backend_name}: the engine returned a row of shape {tuple(row.shape)}, "
                        f"not ({self.vocab_size},)"
                    )
            scores = out if isinstance(out, torch.Tensor) else rows
        if len(rows) != len(contexts):
            raise EngineOutputError(
                f"{self.backend_name}: the engine returned {len(rows)} rows for {len(contexts)} "
                "contexts; forward() returns one row per context, in the order given"
            )
        errors = self._row_errors(scores, contexts, "forward")
        if copied:
            return [errors.get(i, r) for i, r in enumerate(rows)]
        return [errors[i] if i in errors else compact(r) for i, r in enumerate(rows)]

    def _normalised_rows(self, out: Sequence["torch.Tensor"]) -> list["torch.Tensor"]:
        """Each of an engine's rows of logits normalised alone: the float32 ``log_softmax``
        of its first ``vocab_size`` scores (the kernel normalises a row alike alone or in a
        batch), each a tensor of its own."""
        import torch

        rows = []
        for row in out:
            if row.shape[-1] < self.vocab_size:
                raise EngineOutputError(
                    f"{self.backend_name}: the model returned {row.shape[-1]} scores per row, "
                    f"fewer than the {self.vocab_size} tokens of its tokenizer"
                )
            rows.append(torch.log_softmax(row[..., : self.vocab_size].to(torch.float32), dim=-1))
        return rows

    def _row_errors(
        self, scores: Any, contexts: Sequence[tuple[int, ...]], call: str
    ) -> dict[int, EngineOutputError]:
        """Row index -> its error, for every row of the engine's ``scores`` no caller may
        read (one reduction over the batch; ``{}`` for a healthy one)."""
        return {
            i: row_error(self.backend_name, self.engine, i, contexts[i], scores[i], call)
            for i in unreadable_rows(scores)
        }

    def _burst_logprobs(
        self, rows: Mapping[int, tuple[int, ...]], released: Collection[int]
    ) -> "torch.Tensor":
        """A burst step's ``(rows, vocab)`` log-probabilities, under the engine lock: the
        engine's own decode step (capability ``"decode"``), else the core's, which computes
        the rows' distinct contexts as a step loop's call does (same contexts, same order,
        batches of ``batch_size``: :func:`~genlm_core.engine.contexts.run_distinct`), so
        both give the same numbers."""
        import torch

        with self.engine_lock:
            if self._closed:
                raise RuntimeError(f"{self.backend_name}: the backend is closed")
            if "decode" in self.engine.supports:
                return self._normalised_batch(self.engine.decode_step(rows, released), list(rows.values()))
            return torch.stack(run_distinct(list(rows.values()), self.config.batch_size, self._chunk_rows))

    def _chunk_rows(self, chunks: list[list[tuple[int, ...]]]) -> list["torch.Tensor"]:
        """The rows of distinct contexts, one engine call per chunk (the core's decode step)."""
        return [row for chunk in chunks for row in self._rows_or_raise(chunk)]

    def _normalised_batch(self, out: Any, contexts: Sequence[tuple[int, ...]]) -> "torch.Tensor":
        """An engine's decode-step scores of ``contexts`` as one ``(n, vocab)`` float32 tensor
        of normalised rows (no copy where the engine returned exactly that); a row no caller
        may read raises its :class:`EngineOutputError`."""
        import torch

        if self.engine.returns == "logits":
            scores = self._logits(out)
            out = self._finalize(scores)
        else:
            if not isinstance(out, torch.Tensor):
                out = torch.stack(list(out))
            scores = out
        n = len(contexts)
        if tuple(out.shape) != (n, self.vocab_size):
            raise EngineOutputError(
                f"{self.backend_name}: the engine's decode step returned scores of shape "
                f"{tuple(out.shape)}, not ({n}, {self.vocab_size})"
            )
        for error in self._row_errors(scores, contexts, "decode_step").values():
            raise error
        return out.to(torch.float32)

    def _end_burst(self, handles: Collection[int]) -> None:
        """The burst ended: the engine's own decode step frees its rows' state."""
        if "decode" in self.engine.supports and not self._closed:
            with self.engine_lock:
                self.engine.end_burst(handles)

    def _batch_fn(self, contexts: list[tuple[int, ...]]) -> list["torch.Tensor | EngineOutputError"]:
        # each caller gets a compact row of its own; the output cache adopts rows nobody else
        # holds (the normalised batch's, one block, no copy; on a GPU a copy of each made in
        # the callers' batched copy) where it can, else keeps a private copy of each; a row
        # no caller may read is its caller's error, never cached
        cache = self.output_cache
        adopt = getattr(cache, "adopt_many", None)  # the Cache protocol asks for put only
        for_cache: list[Any] | None = [] if adopt is not None else None
        results = self._rows(contexts, for_cache=for_cache)
        if cache is not None:
            good = [i for i, row in enumerate(results) if not isinstance(row, EngineOutputError)]
            if for_cache:
                adopt([(contexts[i], for_cache[i]) for i in good])  # type: ignore[misc]
                return results
            put_many = getattr(cache, "put_many", None)
            if put_many is not None:
                put_many([(contexts[i], results[i]) for i in good])
            else:
                for i in good:
                    cache.put(contexts[i], results[i])
        return results

    def _empty_rows(self) -> "torch.Tensor":
        """The answer to an empty batch: ``(0, vocab)`` float32 rows."""
        import torch

        if self._closed:
            raise RuntimeError(f"{self.backend_name}: the backend is closed")
        device = self.engine.rows_device if self.engine.rows_device is not None else self.device
        return torch.empty((0, self.vocab_size), dtype=torch.float32, device=device)

    def own_row(self, row: Any) -> Any:
        """A row the backend holds (an output cache's hit) as its caller's own: a private
        copy, on the device the backend's computed rows are on. A cache that keeps rows
        in host memory (``cache_to_cpu``) holds them on the CPU: they go back to the
        device, as genlm-backend's ``move_to_cpu`` cache handed them back, so that a hit
        and a computed row never come back on two devices."""
        if self._rows_accelerator is None:  # (a CPU backend: no call more on its hits)
            return private_copy(row)
        moved = moved_from_cpu(row, self._rows_accelerator)
        return private_copy(row) if moved is None else moved

    def _placed(self, rows: list[Any]) -> list[Any]:
        """``rows`` on the backend's rows device, for a stack (which copies them): a row a
        cache holds on the CPU moved where the rows are not, the others as they are."""
        device = self._rows_accelerator
        if device is None:
            return rows
        return [row if (moved := moved_from_cpu(row, device)) is None else moved for row in rows]

    async def _shared_row(self, ctx: tuple[int, ...]) -> "torch.Tensor":
        """The row of a validated context; may be the cached object: never hand it out."""
        if self.output_cache is not None:
            hit = self.output_cache.get(ctx)
            if hit is not None:
                return hit
        return await self.batcher.submit(ctx, key=ctx)

    def _shared_row_sync(self, ctx: tuple[int, ...]) -> "torch.Tensor":
        if self.output_cache is not None:
            hit = self.output_cache.get(ctx)
            if hit is not None:
                return hit
        return self.batcher.run_sync([ctx])[0]

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
                return self.own_row(hit)
        return await self.batcher.submit(ctx, key=ctx)

    def next_token_logprobs_sync(self, token_ids: Sequence[int]) -> "torch.Tensor":
        ctx = self.validate(token_ids)
        if self.output_cache is not None:
            hit = self.output_cache.get(ctx)
            if hit is not None:
                return self.own_row(hit)
        return self.batcher.run_sync([ctx])[0]

    async def batch_next_token_logprobs(self, token_ids_list: Sequence[Sequence[int]]) -> "torch.Tensor":
        """One row per context, stacked (an empty list gives a ``(0, vocab)`` tensor)."""
        import torch

        contexts = [self.validate(t) for t in token_ids_list]  # fail before any work
        if not contexts:
            return self._empty_rows()
        unique = list(dict.fromkeys(contexts))
        rows = dict(zip(unique, await asyncio.gather(*(self._shared_row(c) for c in unique))))
        return torch.stack(self._placed([rows[c] for c in contexts]))

    def batch_next_token_logprobs_sync(self, token_ids_list: Sequence[Sequence[int]]) -> "torch.Tensor":
        """One row per context, stacked (an empty list gives a ``(0, vocab)`` tensor)."""
        import torch

        contexts = [self.validate(t) for t in token_ids_list]
        if not contexts:
            return self._empty_rows()
        hits: dict[tuple[int, ...], Any] = {}
        if self.output_cache is not None:
            for ctx in dict.fromkeys(contexts):
                hit = self.output_cache.get(ctx)
                if hit is not None:
                    hits[ctx] = hit
        computed = iter(
            run_distinct([c for c in contexts if c not in hits], self.config.batch_size, self._batched_rows)
        )
        return torch.stack(self._placed([hits[c] if c in hits else next(computed) for c in contexts]))

    def _batched_rows(self, chunks: list[list[tuple[int, ...]]]) -> list["torch.Tensor"]:
        """The rows of distinct contexts through the batcher, one batch per chunk (the sync path)."""
        return [row for chunk in chunks for row in self.batcher.run_sync(chunk)]

    def next_token_logprobs_uncached(self, token_ids: Sequence[int]) -> "torch.Tensor":
        """One full forward pass, bypassing the output cache and engine caches."""
        ctx = self.validate(token_ids)
        with self.engine_lock:
            return self._rows_or_raise([ctx], uncached=True)[0]

    # ------------------------------------------------------------------ sampling
    def sample_request(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> SampleRequest:
        """A checked sampling request: the prompt validated, the arguments checked, the EOS
        ids resolved (None: :attr:`eos_token_ids`) and ``max_tokens`` clamped to the room the
        context limit leaves (the last token drawn is scored at a context of
        ``max_context_length`` tokens)."""
        ctx = self.validate(prompt_token_ids)
        max_tokens, temperature, eos = self._check_sample_args(max_tokens, temperature, eos_token_ids)
        limit = self.max_context_length
        if limit is not None:
            max_tokens = max(0, min(max_tokens, limit + 1 - len(ctx)))
        return SampleRequest(
            ctx, max_tokens, frozenset(eos), temperature, None if seed is None else int(seed)
        )

    async def sample(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[int]:
        """Sample up to ``max_tokens`` tokens; stops before any token in ``eos_token_ids``.

        ``seed`` makes the draw reproducible. ``temperature`` must be a finite real number
        >= 0 (else ``ValueError``; ``TypeError`` for no number); ``0`` is greedy (the
        argmax), and so is any temperature below
        :data:`~genlm_core.engine.sampling.MIN_TEMPERATURE` (1e-30): dividing float32 scores
        by one overflows, and greedy is the distribution's limit there. A temperature above
        float32's largest value (:data:`~genlm_core.engine.sampling.MAX_TEMPERATURE`) draws as
        that value does (uniformly over the tokens with a finite score). An engine's own
        sampler gets the temperature so resolved, and ``/v1/sample`` calls this method: the
        same draws in process and on a server.

        The EOS token itself is not included in the result. An engine with a sampler of its
        own draws (concurrent calls batched into one engine call); otherwise each token is
        drawn from the backend's own rows.
        """
        return await self.run_sample(
            self.sample_request(prompt_token_ids, max_tokens, eos_token_ids, temperature, seed)
        )

    async def run_sample(self, req: SampleRequest) -> list[int]:
        """The tokens of a checked request (:meth:`sample_request`): the engine's sampler,
        or draws from the backend's rows. What :meth:`sample` runs; a caller that holds a
        request (a server, an actor) passes it on whole."""
        if req.max_tokens == 0:
            return []
        if self.sampler is not None:
            return list(await self.sampler.submit(req))
        return await draw_tokens(req, lambda ctx: self._shared_row(self.validate(ctx)))  # read only

    def sample_sync(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[int]:
        """Synchronous :meth:`sample`: the same tokens for the same arguments."""
        return self.run_sample_sync(
            self.sample_request(prompt_token_ids, max_tokens, eos_token_ids, temperature, seed)
        )

    def run_sample_sync(self, req: SampleRequest) -> list[int]:
        """Synchronous :meth:`run_sample`."""
        if req.max_tokens == 0:
            return []
        if self.sampler is not None:
            return list(self.sampler.run_sync([req])[0])
        return draw_tokens_sync(req, lambda ctx: self._shared_row_sync(self.validate(ctx)))

    async def batch_sample(
        self,
        prompt_token_ids_list: Sequence[Sequence[int]],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[list[int]]:
        """Sample for each prompt concurrently (batched). Prompt ``i`` uses ``seed + i``.

        Every prompt and argument is checked before any sampling starts."""
        requests = [  # every prompt and argument checked before any sampling starts
            self.sample_request(p, max_tokens, eos_token_ids, temperature, None if seed is None else seed + i)
            for i, p in enumerate(prompt_token_ids_list)
        ]
        return list(await asyncio.gather(*(self.run_sample(r) for r in requests)))

    def _check_sample_args(
        self, max_tokens: int, temperature: float, eos_token_ids: Sequence[int] | None
    ) -> tuple[int, float, set[int]]:
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
            raise ValueError(f"max_tokens must be a non-negative int, got {max_tokens!r}")
        temperature = sampling_temperature(temperature)
        eos = set(self.eos_token_ids if eos_token_ids is None else (int(e) for e in eos_token_ids))
        return max_tokens, temperature, eos

    # ------------------------------------------------------------------ bursts
    @property
    def supports_burst(self) -> bool:
        """Whether :meth:`run_burst` runs here: the engine declares ``"burst"`` (the core's
        decode step) or ``"decode"`` (its own)."""
        return not BURST_CAPABILITIES.isdisjoint(self.engine.supports) and not self._closed

    def run_burst(self, control: "EngineControl", max_steps: int) -> "BurstReport":
        """Run an SMC decode loop in the backend, ``control`` drawing every step's tokens
        (genlm-backend's ``run_burst``; see :mod:`genlm_core.engine.burst`). Blocking: from
        async code use :meth:`burst`. Returns what it did (the drawn tokens per handle)."""
        from genlm_core.engine.burst import drive

        if not self.supports_burst:
            raise NotImplementedError(
                f"{self.backend_name}: this backend runs no bursts (supports_burst is False); "
                "run the program's steps through next_token_logprobs instead"
            )
        return drive(
            control,
            max_steps,
            validate=self.validate,
            next_logprobs=self._burst_logprobs,
            end_burst=self._end_burst,
            vocab_size=self.vocab_size,
            max_context_length=self.max_context_length,
        )

    async def burst(self, control: "EngineControl", max_steps: int) -> "BurstReport":
        """:meth:`run_burst` in a worker thread, so the event loop runs meanwhile (a control
        may hand its draws to coroutines on it)."""
        return await asyncio.to_thread(self.run_burst, control, max_steps)

    # ------------------------------------------------------------------ caches
    def clear_cache(self) -> None:
        """Drop the output cache and engine caches (KV)."""
        if self.output_cache is not None:
            self.output_cache.clear()
        with self.engine_lock:
            self.engine.clear_cache()

    @property
    def prefix_cache(self) -> "PrefixKVCache | None":
        """The engine's KV prefix cache (None: the engine keeps none, or reuse is off)."""
        kv = self.engine.kv
        return kv.cache if kv is not None else None

    @property
    def kv_reuse(self) -> bool:
        """Whether later contexts resume from the engine KV of cached prefixes."""
        kv = self.engine.kv
        return kv is not None and kv.enabled

    def cache_kv(self, prompt_token_ids: Sequence[int]) -> None:
        """Compute ``prompt_token_ids`` now (its next-token row goes to the output cache)
        and keep its KV state, so later contexts that extend it run the model on their new
        tokens only (while the KV stays within the budget). Nothing runs when the engine
        keeps no KV, or the prompt's KV is cached already."""
        ctx = self.validate(prompt_token_ids)
        cache = self.prefix_cache
        if cache is None or cache.deepest_kv(ctx)[0] == len(ctx):
            return
        self.batcher.run_sync([ctx])

    def clear_kv_cache(self) -> None:
        """Drop every cached KV state (the output cache's rows stay)."""
        if self.engine.kv is not None:
            with self.engine_lock:
                self.engine.kv.clear()

    # ------------------------------------------------------------------ LoRA (capability "lora")
    @property
    def supports_lora(self) -> bool:
        """Whether LoRA adapters load here (the engine declares ``"lora"``)."""
        return "lora" in self.engine.supports

    def _require_lora(self) -> None:
        if not self.supports_lora:
            raise NotImplementedError(
                f"{self.backend_name}: this backend loads no LoRA adapters (its engine "
                f"{type(self.engine).__name__} does not declare the 'lora' capability); use a backend "
                "that does (hf, vllm)"
            )

    @property
    def active_lora(self) -> str | None:
        """The active adapter's name (None: the base model)."""
        return self.adapters.active

    @property
    def loras(self) -> dict[str, str]:
        """Loaded adapters: name -> folder."""
        return dict(self.adapters.paths)

    def load_lora(self, path: Any, name: str = "default") -> None:
        """Load the LoRA adapter folder ``path`` under ``name``; the active adapter does not
        change (no result changes, no cache is dropped)."""
        self._require_lora()
        folder = self.adapters.check_new(path, name)
        with self.engine_lock:
            self.engine.load_adapter(name, folder)
            self.adapters.add(folder, name)

    def add_new_lora(self, lora_path: Any, lora_name: str = "default") -> None:
        """genlm-backend's name of :meth:`load_lora`."""
        self.load_lora(lora_path, lora_name)

    def set_lora(self, name: str = "default") -> None:
        """Compute with the loaded adapter ``name`` from now on; drops the cached rows (and
        the engine's KV, unless the engine keys it by adapter)."""
        self._require_lora()
        self.adapters.require(name)
        self._activate_adapter(name)

    def clear_lora(self) -> None:
        """Back to the base model; drops the cached rows as :meth:`set_lora` does."""
        self._require_lora()
        self._activate_adapter(None)

    def _activate_adapter(self, name: str | None) -> None:
        with self.engine_lock:
            self.engine.use_adapter(name)
            self.adapters.active = name
            if self.output_cache is not None:
                self.output_cache.clear()
            if not self.engine.adapter_keyed_kv:
                self.engine.clear_cache()

    def reset_async_queries(self) -> None:
        """genlm-backend's name: fail and drop waiting requests. Not needed after errors."""
        self.batcher.reset()

    # ------------------------------------------------------------------ state
    @property
    def healthy(self) -> bool:
        """Whether the backend can answer."""
        return not self._closed and self.engine.healthy

    def info(self) -> dict[str, Any]:
        """What runs where (the engine adds its process/parallel layout)."""
        return {
            "backend": self.backend_name,
            "model": self.config.model,
            "device": str(self.device),
            "vocab_size": self.vocab_size,
            "healthy": self.healthy,
            **self.engine.info(),
        }

    def stats(self) -> dict[str, Any]:
        """``batcher``, ``output_cache``, ``sample_batcher`` (an engine sampler),
        ``prefix_cache`` (KV reuse) and ``engine`` (its KV-reuse counters and its own)."""
        out: dict[str, Any] = {"batcher": self.batcher.stats.as_dict()}
        if self.output_cache is not None:
            out["output_cache"] = self.output_cache.stats()
        if self.sampler is not None:
            out["sample_batcher"] = self.sampler.stats.as_dict()
        kv = self.engine.kv
        if kv is not None and kv.cache is not None:
            out["prefix_cache"] = kv.cache.stats()
        engine = {**(kv.stats() if kv is not None else {}), **self.engine.stats()}
        if self.supports_lora:
            engine["active_lora"] = self.active_lora
        if engine:
            out["engine"] = engine
        out.update(self.engine.stats_sections())
        return out

    @property
    def forward_calls(self) -> int:
        """Engine calls counted by its KV reuse (or its own counters)."""
        return int(self.stats().get("engine", {}).get("forward_calls", 0))

    @property
    def tokens_computed(self) -> int:
        return int(self.stats().get("engine", {}).get("tokens_computed", 0))

    @property
    def tokens_reused(self) -> int:
        return int(self.stats().get("engine", {}).get("tokens_reused", 0))

    def close(self) -> None:
        """Stop the batchers (waiting callers get an error) and release the engine."""
        if self._closed:
            return
        self._closed = True
        self.batcher.close()
        if self.sampler is not None:
            self.sampler.close()
        with self.engine_lock:
            self.engine.close()

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


def backend_class(
    name: str, engine_class: type[Engine], *, deprecated: str | None = None
) -> type[BaseLogprobBackend]:
    """A :class:`BaseLogprobBackend` class whose ``from_name``/``from_config`` load
    ``engine_class`` under the name ``name``. With ``deprecated`` (the old name, e.g.
    ``"genlm_hf.HFBackend"``) making or loading one warns that it goes in genlm-core 0.3
    (``genlm_core.load(name, ...)`` and ``BaseLogprobBackend(engine, config)`` replace it)."""

    def warn() -> None:
        if deprecated is not None:
            import warnings

            warnings.warn(
                f"{deprecated} is deprecated and will be removed in genlm-core 0.3: use "
                f"genlm_core.load({name!r}, model=...), or BaseLogprobBackend({engine_class.__name__}(...), "
                "config) around an engine you built",
                DeprecationWarning,
                stacklevel=3,
            )

    class Backend(BaseLogprobBackend):
        config_class = engine_class.config_class
        backend_name = name

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            warn()
            super().__init__(*args, **kwargs)

    Backend.engine_class = engine_class
    Backend.__name__ = Backend.__qualname__ = (deprecated or f"{engine_class.__name__}Backend").rsplit(".")[
        -1
    ]
    Backend.__doc__ = f"The {name!r} backend: a BaseLogprobBackend holding a {engine_class.__name__}."
    return Backend
