"""genlm-backend's language models (``genlm.backend.llm``) as genlm-core backends.

Each class *is* a genlm-core LogprobBackend (batching, output and KV caches are the
core's); only the constructors follow genlm-backend's signatures. Options a core
config accepts (``cache_size``, ``kv_cache_bytes``, ...) pass through as keywords.
"""

from __future__ import annotations

import functools
import importlib
import os
from typing import Any

from genlm.backend._surface import placeholder, public_dir
from genlm.backend.cache import TokenTrie
from genlm.backend.llm.calls import UNKNOWN_ADAPTER, AsyncLM, ReferenceCalls
from genlm_hf.config import HFConfig
from genlm_hf.engine import HFEngine
from genlm_hf.loading import load_model_and_tokenizer
from genlm_mock.engine import MockEngine

from genlm_core.engine import Checkpoint, checkpoint, place, read_checkpoint
from genlm_core.engine.backend import BaseLogprobBackend, backend_class
from genlm_core.engine.placement import refuse_unsupported
from genlm_core.registry import get_registry, hardware

__all__ = ["AsyncLM", "AsyncMlxLM", "AsyncRemoteLM", "AsyncSGLTransformer", "AsyncTransformer", "AsyncVirtualLM", "MockAsyncLM",
           "load_model_by_name"]  # fmt: skip


class AsyncTransformer(ReferenceCalls, backend_class("hf", HFEngine)):  # type: ignore[misc]
    """genlm-hf's backend: ``AsyncTransformer(hf_model, hf_tokenizer, batch_size=, timeout=)``.
    ``None`` keeps genlm-core's defaults (see docs/migration.md). A context may fill the
    model's whole window (``n_positions`` tokens: scoring the next token needs no
    position of its own), as in genlm-backend."""

    def __init__(
        self, hf_model: Any, hf_tokenizer: Any, batch_size: int | None = None, timeout: float | None = None,
        **options: Any,
    ) -> None:  # fmt: skip
        config = options.pop("config", None)
        if config is None:
            given = {"batch_size": batch_size, "timeout": timeout}
            config = HFConfig.build("hf", **{k: v for k, v in given.items() if v is not None}, **options)
        super().__init__(HFEngine(hf_model, hf_tokenizer, config), config, Checkpoint.of_files(config.model))
        self._window = checkpoint.positions(checkpoint.read_config(config.model) or hf_model.config.to_dict())

    @property
    def max_context_length(self) -> int | None:
        return self._window if self._window is not None else super().max_context_length

    def cache_kv(self, prompt_tokens: Any, lora_name: str | None = None) -> None:
        self._turns.use_sync(self, lora_name)
        super().cache_kv(prompt_tokens)

    def walk_cache(self, token_ids: Any, lora_name: str | None = None) -> tuple[TokenTrie, int, Any, int]:
        """genlm-backend's cache walk over genlm-core's caches: ``(node, matched, past, base)``:
        ``node.logprobs`` is the cached next-token row of the longest cached prefix
        (``matched`` tokens; genlm-core caches whole contexts, not every prefix of
        them), ``past`` the KV state genlm-hf keeps for the longest proper prefix
        (``base`` tokens) or None."""
        self._turns.use_sync(self, lora_name)
        ids = tuple(token_ids)
        node, matched = TokenTrie(), 0
        cache = self.output_cache
        for k in range(len(ids), 0, -1) if cache is not None else ():
            row = cache.get(ids[:k]) if ids[:k] in cache else None  # `in` counts no miss
            if row is not None:
                node, matched = TokenTrie(self.own_row(row)), k  # a copy, where rows come back
                break
        prefixes = self.prefix_cache
        base, past = prefixes.deepest_kv(ids, max_depth=len(ids) - 1) if prefixes and ids else (0, None)
        return node, matched, past, base

    def remove_lora(self, lora_name: str) -> None:
        """Unload adapter ``lora_name``; the base model runs if it was the active one."""
        if lora_name not in self.loras:
            raise ValueError(UNKNOWN_ADAPTER.format(lora_name))
        if self.active_lora == lora_name:
            BaseLogprobBackend.clear_lora(self)
        with self.engine_lock:
            self.engine.model.delete_adapter(lora_name)
            del self.adapters.paths[lora_name]

    @classmethod
    def from_name(  # type: ignore[override]
        cls, model_id: str, bitsandbytes_opts: dict | None = None, hf_opts: dict | None = None, **kwargs: Any
    ) -> "AsyncTransformer":
        """Load ``model_id`` (hub id or folder). ``hf_opts`` go to ``from_pretrained``;
        ``device_map`` and ``trust_remote_code`` in them become genlm-hf options (each given
        once), and ``torch_dtype``/``dtype`` its ``dtype`` (:class:`~genlm_hf.config.HFConfig`
        reads it, in any spelling the core's ``dtype`` takes). The checkpoint is read and
        placed as ``genlm_core.load("hf", ...)`` does."""
        opts = dict(hf_opts or {})
        for key in ("device_map", "trust_remote_code"):
            if key in opts:
                kwargs[key] = opts.pop(key)
        config = HFConfig.build(
            "hf", model=model_id, bitsandbytes_opts=bitsandbytes_opts or None, hf_opts=opts, **kwargs
        )
        source = read_checkpoint(config, ("hf-folder", "hub-id"), "hf")
        placement = place(config, source, get_registry().get("backend", "hf").supported_devices(), "hf")
        refuse_unsupported(HFEngine, placement, config, "hf")
        model, tokenizer, _ = load_model_and_tokenizer(source, config, placement)
        return cls(model, tokenizer, config=config)


class MockAsyncLM(ReferenceCalls, backend_class("mock", MockEngine)):  # type: ignore[misc]
    """genlm-core's mock backend over a tokenizer's vocabulary (fixed pseudo-random
    distributions per context)."""

    def __init__(self, tokenizer: Any = None, config: Any = None, **options: Any) -> None:
        config = config or MockEngine.config_class.build("mock", **options)
        super().__init__(MockEngine(tokenizer, config), config)

    @classmethod
    def from_name(cls, model_name: str, **kwargs: Any) -> "MockAsyncLM":  # type: ignore[override]
        # options and the folder are checked before the tokenizer load can reach the network
        config = MockEngine.config_class.build("mock", model=_model_name(model_name), **kwargs)
        config.check_model()
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(config.model), config=config)


def _model_name(name: Any) -> Any:
    """``name`` if it can name a model (a hub id or a folder), else a clear TypeError."""
    if isinstance(name, (str, os.PathLike)):
        return name
    raise TypeError(
        f"a model name is a hub id or a local folder (str or path), got {type(name).__name__} {name!r}"
    )


def _engine(name: str, module: str, attr: str, backend: str, dist: str) -> type:
    """A backend class over a plugin's engine, or a stand-in that says what to install."""
    try:
        base = backend_class(backend, getattr(importlib.import_module(module), attr))
    except ImportError as exc:
        extra = dist.removeprefix("genlm-")
        hint = f'{__name__}.{name} needs {dist}: pip install "genlm-compat[{extra}]" ({exc})'
        return placeholder(__name__, name, "", ImportError, hint)

    def from_name(cls: type, model_name: str, **kwargs: Any) -> Any:
        return base.from_name.__func__(cls, model_name, **_options(kwargs))

    return type(name, (ReferenceCalls, base), {"__module__": __name__, "from_name": classmethod(from_name)})


def _options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """An engine class's ``from_name`` keywords as genlm-core options: None means the
    option's default, and genlm-backend's ``cache_opts`` (its ``OutputCache``'s keywords,
    which ``AsyncVirtualLM`` and ``AsyncMlxLM`` take: ``move_to_cpu``) is ``cache_to_cpu``."""
    options = {k: v for k, v in kwargs.items() if v is not None}
    opts = options.pop("cache_opts", None) or {}
    if not isinstance(opts, dict) or set(opts) - {"move_to_cpu"}:
        raise TypeError(
            f"cache_opts takes OutputCache's move_to_cpu only (its size: cache_size=), got {opts!r}"
        )
    if opts and options.setdefault("cache_to_cpu", bool(opts["move_to_cpu"])) != bool(opts["move_to_cpu"]):
        raise TypeError("cache_opts['move_to_cpu'] and cache_to_cpu disagree: pass one of them")
    return options


#: AsyncVirtualLM: vLLM (``from_name(model_name, engine_opts=None, **kwargs)``: genlm-vllm options);
#: AsyncMlxLM: MLX (``from_name(model_name, **kwargs)``: genlm-mlx options). Built on first use, so
#: importing genlm.backend starts neither engine. SGLang has no genlm-core backend.
_ENGINES = {"AsyncVirtualLM": ("genlm_vllm.engine", "VLLMEngine", "vllm", "genlm-vllm"),
            "AsyncMlxLM": ("genlm_mlx.engine", "MLXEngine", "mlx", "genlm-mlx"),
            # a model served by `genlm serve` (from_name(model_name, url=..., token=None))
            "AsyncRemoteLM": ("genlm_remote.engine", "RemoteEngine", "remote", "genlm-remote")}  # fmt: skip
_SGL = "genlm_core.load('vllm', ...) / AsyncVirtualLM (genlm-core has no SGLang backend)"


@functools.cache
def __getattr__(name: str) -> Any:
    if name in _ENGINES:
        return _engine(name, *_ENGINES[name])
    if name == "AsyncSGLTransformer":
        return placeholder(__name__, name, _SGL, ImportError)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_BACKENDS = {"vllm": "AsyncVirtualLM", "hf": "AsyncTransformer", "mock": "MockAsyncLM", "mlx": "AsyncMlxLM",
             "remote": "AsyncRemoteLM", "sgl": "AsyncSGLTransformer"}  # fmt: skip


def load_model_by_name(name: str, backend: str | None = None, llm_opts: dict | None = None) -> AsyncLM:
    """genlm-backend's loader: ``backend`` is "vllm", "hf", "mock", "mlx", "remote"
    (``llm_opts={"url": ...}``: a `genlm serve` server) (or "sgl", which raises); None picks vLLM when CUDA is available, else "hf". ``llm_opts`` go to ``from_name``."""
    if backend is None:  # the registry's hardware probe (GENLM_DEVICE overrides it)
        backend = "vllm" if hardware.best_device() == "cuda" else "hf"
    if backend not in _BACKENDS:
        raise ValueError(f"Invalid backend: {backend}")
    cls = globals().get(_BACKENDS[backend]) or __getattr__(_BACKENDS[backend])
    return cls.from_name(_model_name(name), **(llm_opts or {}))


__dir__ = public_dir(__name__)  # the API only, as the reference lists it
