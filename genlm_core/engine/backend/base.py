"""`BaseLogprobBackend`: one class holding an engine, composed of the parts of this package.

This module holds the engine: it reads what the engine says once (the vocabulary, the
default EOS ids, the context limit: the smaller of the checkpoint's and the engine's),
makes the one engine lock every engine call holds, the batchers, the output cache and the
core's KV calls, hands each part what it works with, and answers for the backend's state
(``info``, ``stats``, health) and shutdown. Every other call is one line handing it to its
part (:mod:`genlm_core.engine.backend`).

Kept in one module: it is the one class whose public surface (the LogprobBackend protocol,
genlm-backend's names) callers and subclasses use; what it does past holding the engine
lives in the parts' modules, and here each such call is one line handing over to its part.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from genlm_core import _deprecated
from genlm_core.config import BackendConfig
from genlm_core.engine.backend.burst_calls import Bursts
from genlm_core.engine.backend.cache_controls import CacheControls
from genlm_core.engine.backend.context_checks import ContextChecks, limit_reason
from genlm_core.engine.backend.lifecycle import Lifecycle
from genlm_core.engine.backend.logprob_calls import CachingBatch, LogprobCalls
from genlm_core.engine.backend.lora_controls import LoraControls
from genlm_core.engine.backend.rows import Rows
from genlm_core.engine.backend.sample_calls import SampleCalls
from genlm_core.engine.batching import AutoBatcher
from genlm_core.engine.caches import output_cache_for
from genlm_core.engine.checkpoint import Checkpoint, engine_context_limit, read_checkpoint
from genlm_core.engine.contexts import Context
from genlm_core.engine.contract import Engine, SampleRequest, check_engine
from genlm_core.engine.heap import settle_after_load
from genlm_core.engine.kv_calls import KVCalls
from genlm_core.engine.lora import LoraAdapters
from genlm_core.engine.placement import Placement, place, refuse_unsupported
from genlm_core.engine.services import EngineServices

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from genlm_core.engine.burst import BurstReport, EngineControl
    from genlm_core.protocols import PrefixKVCache
    from genlm_core.registry import Registration

__all__ = ["BaseLogprobBackend", "backend_class", "registered_name"]

F = TypeVar("F", bound=Callable[..., Any])


def registration(engine_class: type) -> Registration | None:
    """The registration a plugin made of ``engine_class`` (None: not registered)."""
    from genlm_core.registry import get_registry

    target = f"{engine_class.__module__}:{engine_class.__qualname__}"
    return next((reg for reg in get_registry().all("backend") if reg.target == target), None)


def registered_name(engine_class: type) -> str | None:
    """The name under which a plugin registered ``engine_class`` (None: not registered)."""
    reg = registration(engine_class)
    return reg.name if reg is not None else None


def _doc(part: Any) -> Callable[[F], F]:
    """The part's docstring on the backend's call handing over to it (``help()``, the API
    reference): the part says what the call does, once."""

    def give(method: F) -> F:
        method.__doc__ = part.__doc__
        return method

    return give


class BaseLogprobBackend:
    """Shared implementation of the LogprobBackend protocol around an :class:`Engine`.

    Its parts (:mod:`genlm_core.engine.backend`), each built with what it works with:
    :attr:`context_checks`, :attr:`rows`, :attr:`logprob_calls`, :attr:`sample_calls`,
    :attr:`bursts`, :attr:`cache_controls` and :attr:`lora_controls`; they share the one
    engine lock, the batcher, the output cache and the core's KV calls made here."""

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
        services: EngineServices | None = None,
        name: str | None = None,
    ) -> None:
        """Hold ``engine``, loaded from ``checkpoint`` with ``services`` (what
        :meth:`from_checkpoint` made). An engine built by hand: ``checkpoint`` and
        ``services`` None (what the engine itself loaded, :attr:`Engine.model_config`; not placed)."""
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
        self.config = cfg = config
        self.engine = engine
        #: what the engine was loaded with: its placement (an engine built by hand: not placed)
        self.services = services if services is not None else EngineServices(config, name=self.backend_name)
        #: the core's side of KV reuse, for an engine that resumes from kept KV (capability "resume")
        self.kv_calls = KVCalls(engine, config, self.backend_name) if "resume" in engine.supports else None
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
        tokenizer_eos = engine.eos_token_ids
        if tokenizer_eos is None:
            tokenizer_eos = getattr(engine.tokenizer, "eos_token_id", None)
        self.eos_token_ids: list[int] = self.checkpoint.eos_token_ids(tokenizer_eos, self.vocab_size)
        positions = engine.max_positions
        if positions is None and getattr(engine, "max_context_length", None) is not None:
            positions = _deprecated.engine_positions(engine)  # an engine of genlm-core 0.1's contract
        self._max_context_length = engine_context_limit(self.checkpoint.max_context_length, None, positions)
        #: the LoRA adapters loaded, by name, and the active one (capability "lora")
        self.adapters = LoraAdapters()
        #: held by every call into the engine: batches, samples, cache resets, adapters, close
        self.engine_lock = threading.RLock()
        self.output_cache = output_cache_for(cfg)
        #: whether the backend is closed: every part refuses work once it is
        self.lifecycle = Lifecycle(self.backend_name)
        #: the engine's scores as normalised float32 rows
        self.rows = Rows(
            engine,
            self.vocab_size,
            self.backend_name,
            self.kv_calls,
            bool(getattr(self.output_cache, "to_cpu", False)),
        )
        self.batcher: AutoBatcher[tuple[int, ...], Any] = AutoBatcher(
            CachingBatch(self.rows, self.output_cache),
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
                engine.sample,
                batch_size=cfg.batch_size,
                timeout=cfg.timeout,
                name=f"{self.backend_name}-sample",
                lock=self.engine_lock,
            )
            if "sample" in engine.supports
            else None
        )
        # every part checks contexts through the backend's validate and reads its limit per
        # call: a subclass refining either (genlm-compat: genlm-backend's errors, the model's
        # whole window) holds for every call
        validate, limit = self.validate, lambda: self.max_context_length
        self.context_checks = ContextChecks(
            self.lifecycle, self.vocab_size, limit, limit_reason(engine, self.checkpoint)
        )
        self.logprob_calls = LogprobCalls(
            self.rows,
            self.batcher,
            self.output_cache,
            self.engine_lock,
            self.lifecycle,
            validate=validate,
            vocab_size=self.vocab_size,
            batch_size=cfg.batch_size,
            rows_device=engine.rows_device if engine.rows_device is not None else self.device,
        )
        self.sample_calls = SampleCalls(
            self.logprob_calls,
            self.sampler,
            validate=validate,
            context_limit=limit,
            eos_token_ids=self.eos_token_ids,
            vocab_size=self.vocab_size,
        )
        self.bursts = Bursts(
            engine,
            self.rows,
            self.engine_lock,
            self.lifecycle,
            validate=validate,
            context_limit=limit,
            kv_calls=self.kv_calls,
            vocab_size=self.vocab_size,
            batch_size=cfg.batch_size,
            name=self.backend_name,
        )
        self.cache_controls = CacheControls(
            engine, self.engine_lock, self.output_cache, self.kv_calls, self.batcher, validate
        )
        self.lora_controls = LoraControls(
            engine, self.engine_lock, self.adapters, self.cache_controls, self.backend_name
        )

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint: Checkpoint,
        config: BackendConfig,
        *,
        engine_class: type[Engine] | None = None,
        name: str | None = None,
        placement: Placement | None = None,
    ) -> "BaseLogprobBackend":
        """Load the engine for ``checkpoint`` (what ``genlm_core.load`` read) and hold it.

        ``placement`` is where and in what it computes (None: :func:`~genlm_core.engine.placement.place`
        decides it here, from the engine's registration); a dtype the engine cannot compute
        in there is refused before it loads. The engine loads with the services the core
        hands it (:class:`~genlm_core.engine.services.EngineServices`)."""
        engine_class = engine_class or cls.engine_class
        name = name or cls.backend_name
        if config.model is None and checkpoint.model is not None:  # model=None: the default it resolved to
            config = config.model_copy(update={"model": checkpoint.model})
        if placement is None:
            reg = registration(engine_class)
            placement = place(config, checkpoint, reg.supported_devices() if reg is not None else None, name)
        refuse_unsupported(engine_class, placement, config, name)
        services = EngineServices(config, placement, name)
        if _deprecated.loads_without_services(engine_class):  # an engine of genlm-core 0.1's contract
            engine = _deprecated.engine_loader(engine_class)(checkpoint, config, services)
        else:
            engine = engine_class.load(checkpoint, config, services)
        try:
            backend = cls(engine, config, checkpoint, services=services, name=name)
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

    def __getattr__(self, name: str) -> Any:
        """Deprecated: the engine's own public attributes (``llm.weights_type``,
        ``llm.in_process``...) read through the backend; read ``llm.engine.<name>``."""
        return _deprecated.engine_attribute(self, name)

    @property
    def max_context_length(self) -> int | None:
        """Longest context accepted: the smaller of the checkpoint's limit and the engine's
        own (None: no known limit)."""
        return self._max_context_length

    @property
    def device(self) -> Any:
        """Where the engine computes: its placement (an engine the core did not place, built
        by hand or serving elsewhere, says it)."""
        placed = self.services.device
        return placed if placed is not None else self.engine.device

    @property
    def dtype(self) -> str:
        """The dtype the engine computes in (``"float32"``, ``"float16"`` or ``"bfloat16"``):
        its placement (:mod:`genlm_core.engine.placement`; with ``dtype="auto"`` the
        checkpoint's); an engine the core did not place says it. Results are float32 whatever
        it is."""
        placed = self.services.dtype
        return placed if placed is not None else self.engine.dtype

    @property
    def healthy(self) -> bool:
        """Whether the backend can answer."""
        return not self.lifecycle.closed and self.engine.healthy

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
        kv = self.kv_calls
        if kv is not None and kv.reuse.cache is not None:
            out["prefix_cache"] = kv.reuse.cache.stats()
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

    # ------------------------------------------------------------------ the parts' calls
    # each hands the call to its part, whose docstring says what it does

    @_doc(ContextChecks.validate)
    def validate(self, token_ids: Any) -> Context:
        return self.context_checks.validate(token_ids)

    @_doc(LogprobCalls.own_row)
    def own_row(self, row: Any) -> Any:
        return self.logprob_calls.own_row(row)

    @_doc(LogprobCalls.next_token_logprobs)
    async def next_token_logprobs(self, token_ids: Sequence[int]) -> torch.Tensor:
        return await self.logprob_calls.next_token_logprobs(token_ids)

    @_doc(LogprobCalls.next_token_logprobs_sync)
    def next_token_logprobs_sync(self, token_ids: Sequence[int]) -> torch.Tensor:
        return self.logprob_calls.next_token_logprobs_sync(token_ids)

    @_doc(LogprobCalls.batch_next_token_logprobs)
    async def batch_next_token_logprobs(self, token_ids_list: Sequence[Sequence[int]]) -> torch.Tensor:
        return await self.logprob_calls.batch_next_token_logprobs(token_ids_list)

    @_doc(LogprobCalls.batch_next_token_logprobs_sync)
    def batch_next_token_logprobs_sync(self, token_ids_list: Sequence[Sequence[int]]) -> torch.Tensor:
        return self.logprob_calls.batch_next_token_logprobs_sync(token_ids_list)

    @_doc(LogprobCalls.next_token_logprobs_uncached)
    def next_token_logprobs_uncached(self, token_ids: Sequence[int]) -> torch.Tensor:
        return self.logprob_calls.next_token_logprobs_uncached(token_ids)

    @_doc(LogprobCalls.reset_async_queries)
    def reset_async_queries(self) -> None:
        self.logprob_calls.reset_async_queries()

    @_doc(SampleCalls.sample_request)
    def sample_request(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> SampleRequest:
        return self.sample_calls.sample_request(
            prompt_token_ids, max_tokens, eos_token_ids, temperature, seed
        )

    @_doc(SampleCalls.sample)
    async def sample(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[int]:
        return await self.sample_calls.sample(prompt_token_ids, max_tokens, eos_token_ids, temperature, seed)

    @_doc(SampleCalls.run_sample)
    async def run_sample(self, req: SampleRequest) -> list[int]:
        return await self.sample_calls.run_sample(req)

    @_doc(SampleCalls.sample_sync)
    def sample_sync(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[int]:
        return self.sample_calls.sample_sync(prompt_token_ids, max_tokens, eos_token_ids, temperature, seed)

    @_doc(SampleCalls.run_sample_sync)
    def run_sample_sync(self, req: SampleRequest) -> list[int]:
        return self.sample_calls.run_sample_sync(req)

    @_doc(SampleCalls.batch_sample)
    async def batch_sample(
        self,
        prompt_token_ids_list: Sequence[Sequence[int]],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[list[int]]:
        return await self.sample_calls.batch_sample(
            prompt_token_ids_list, max_tokens, eos_token_ids, temperature, seed
        )

    @property
    @_doc(Bursts.supports_burst)
    def supports_burst(self) -> bool:
        return self.bursts.supports_burst

    @_doc(Bursts.run_burst)
    def run_burst(self, control: EngineControl, max_steps: int) -> BurstReport:
        return self.bursts.run_burst(control, max_steps)

    @_doc(Bursts.burst)
    async def burst(self, control: EngineControl, max_steps: int) -> BurstReport:
        return await self.bursts.burst(control, max_steps)

    @_doc(CacheControls.clear_cache)
    def clear_cache(self) -> None:
        self.cache_controls.clear_cache()

    @property
    @_doc(CacheControls.prefix_cache)
    def prefix_cache(self) -> PrefixKVCache | None:
        return self.cache_controls.prefix_cache

    @property
    @_doc(CacheControls.kv_reuse)
    def kv_reuse(self) -> bool:
        return self.cache_controls.kv_reuse

    @_doc(CacheControls.cache_kv)
    def cache_kv(self, prompt_token_ids: Sequence[int]) -> None:
        self.cache_controls.cache_kv(prompt_token_ids)

    @_doc(CacheControls.clear_kv_cache)
    def clear_kv_cache(self) -> None:
        self.cache_controls.clear_kv_cache()

    @property
    @_doc(LoraControls.supports_lora)
    def supports_lora(self) -> bool:
        return self.lora_controls.supports_lora

    @property
    @_doc(LoraControls.active_lora)
    def active_lora(self) -> str | None:
        return self.lora_controls.active_lora

    @property
    @_doc(LoraControls.loras)
    def loras(self) -> dict[str, str]:
        return self.lora_controls.loras

    @_doc(LoraControls.load_lora)
    def load_lora(self, path: Any, name: str = "default") -> None:
        self.lora_controls.load_lora(path, name)

    @_doc(LoraControls.add_new_lora)
    def add_new_lora(self, lora_path: Any, lora_name: str = "default") -> None:
        self.lora_controls.add_new_lora(lora_path, lora_name)

    @_doc(LoraControls.set_lora)
    def set_lora(self, name: str = "default") -> None:
        self.lora_controls.set_lora(name)

    @_doc(LoraControls.clear_lora)
    def clear_lora(self) -> None:
        self.lora_controls.clear_lora()

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        """Stop the batchers (waiting callers get an error) and release the engine."""
        if not self.lifecycle.close():
            return
        self.batcher.close()
        if self.sampler is not None:
            self.sampler.close()
        with self.engine_lock:
            if self.kv_calls is not None:  # the engine frees all its memory next: drop what is kept
                self.kv_calls.forget()
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

    advice = (
        f"use genlm_core.load({name!r}, model=...), or BaseLogprobBackend({engine_class.__name__}(...), "
        "config) around an engine you built"
    )

    class Backend(BaseLogprobBackend):
        config_class = engine_class.config_class
        backend_name = name

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if deprecated is not None:
                _deprecated.warn(deprecated, advice)  # (the stack level: this call's caller)
            super().__init__(*args, **kwargs)

    Backend.engine_class = engine_class
    Backend.__name__ = Backend.__qualname__ = (deprecated or f"{engine_class.__name__}Backend").rsplit(".")[
        -1
    ]
    Backend.__doc__ = f"The {name!r} backend: a BaseLogprobBackend holding a {engine_class.__name__}."
    return Backend
