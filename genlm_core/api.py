"""Top-level entry points: load(), load_byte_model(), list_backends(), load_trie(), explain_auto()."""

from __future__ import annotations

import inspect
import os
from typing import Any

from genlm_core.config import BackendConfig, ConfigError
from genlm_core.registry import Registration, UnavailableImplementationError, get_registry

__all__ = [
    "load",
    "load_byte_model",
    "list_backends",
    "list_implementations",
    "resolve",
    "explain_auto",
    "load_trie",
    "backend_config",
]


def resolve(name: str | None = "auto", kind: str = "backend", model: Any = None) -> Registration:
    """The registration ``name`` resolves to (``"auto"``/``None``: best for this machine
    and ``model``: a ``.gguf`` file picks a backend that reads GGUF)."""
    reg = get_registry()
    if name in (None, "auto"):
        return reg.choose_auto(kind, model)[0]
    return reg.get(kind, name)


def explain_auto(kind: str = "backend", model: Any = None) -> dict[str, Any]:
    """What ``load("auto")`` would pick here, and every candidate it considered."""
    choice, device, considered = get_registry().choose_auto(kind, model)
    return {"choice": choice.name, "device": device, "considered": considered}


def backend_config(name: str, **options: Any) -> BackendConfig:
    """Validate ``options`` against backend ``name``'s config (clear errors on unknown keys)."""
    reg = resolve(name)
    cfg_cls = reg.load_config_class() or BackendConfig
    return cfg_cls.build(reg.name, **options)


def load(name: str | None = "auto", /, model: str | os.PathLike[str] | None = None, **options: Any) -> Any:
    """Create a LogprobBackend.

    ``load("hf", model="gpt2")`` picks a backend by name or alias; ``load(model=...)``
    (or ``"auto"``) picks the best available one for this machine: vLLM on CUDA, MLX
    on Apple silicon, transformers otherwise (plugins may declare priorities).
    ``model`` may be a ``pathlib.Path``. Options are validated by the backend's
    pydantic config; then, before any engine is imported, the checkpoint is read once
    (:func:`genlm_core.engine.checkpoint.read_checkpoint`: the model folder or file
    checked, ``model=None`` resolved to the embedded default, config, generation config,
    context limit, EOS ids, the dtype it declares) and the engine is placed once
    (:func:`genlm_core.engine.placement.place`: device and dtype). The plugin's engine
    class is then imported, asked which dtypes it computes in on that device, and loaded
    (``Engine.load(checkpoint, config, services)``).
    """
    reg = resolve(name, model=model)
    status, reason = reg.status()
    if status != "available":
        raise UnavailableImplementationError(f"Backend {reg.name!r} cannot run here: {reason}")
    cfg_cls = reg.load_config_class() or BackendConfig
    if model is not None:
        options["model"] = model
    config = cfg_cls.build(reg.name, **options)
    if not isinstance(config, BackendConfig):
        raise ConfigError(f"{reg.name}: its config {cfg_cls.__name__} is not a genlm_core BackendConfig")
    from genlm_core.engine.backend import BaseLogprobBackend
    from genlm_core.engine.checkpoint import read_checkpoint
    from genlm_core.engine.contract import Engine
    from genlm_core.engine.placement import place

    checkpoint = read_checkpoint(config, reg.model_formats, reg.name)
    placement = place(config, checkpoint, reg.supported_devices(), reg.name)
    target = reg.load_target()
    if not (isinstance(target, type) and issubclass(target, Engine)):
        hint = getattr(target, "engine_class", None)  # a backend class made around an engine
        known = isinstance(hint, type) and issubclass(hint, Engine) and hint is not Engine
        fix = f" ({target.__name__}'s is {hint.__module__}:{hint.__qualname__})" if known else ""
        raise ConfigError(
            f"{reg.target} (backend {reg.name!r}) is not a genlm_core.engine.Engine: a plugin registers "
            f"its Engine class{fix}; the core builds the backend around it"
        )
    return BaseLogprobBackend.from_checkpoint(
        checkpoint, config, engine_class=target, name=reg.name, placement=placement
    )


async def load_byte_model(llm: Any, name: str = "beam", /, **options: Any) -> Any:
    """A byte-level language model over the LogprobBackend ``llm``: the registered byte
    model ``name`` (kind ``byte_model``; the core's ``"beam"`` is
    :class:`genlm_core.bytes.ByteBeamState`), its options validated by its config class
    (``"beam"``: :class:`~genlm_core.bytes.BeamParams`), built with
    ``await cls.initial(llm, config)``."""
    reg = get_registry().get("byte_model", name)
    status, reason = reg.status()
    if status != "available":
        raise UnavailableImplementationError(f"Byte model {reg.name!r} cannot run here: {reason}")
    cls = reg.load_target()
    cfg_cls = reg.load_config_class()
    if cfg_cls is None:
        raise ConfigError(f"byte model {reg.name!r} ({reg.target}) registers no config class")
    return await cls.initial(llm, cfg_cls.build(reg.name, **options))


def list_implementations(kind: str | None = None) -> list[dict[str, Any]]:
    """Every registered implementation (all kinds by default), plus broken plugins."""
    reg = get_registry()
    rows = [r.as_dict() for r in reg.all(kind)]
    rows += [b.as_dict() for b in reg.broken]
    return rows


def list_backends() -> list[dict[str, Any]]:
    """Registered LogprobBackends with distribution, version, devices and status
    (available / unavailable and why / broken and its error). Imports no engine."""
    return list_implementations("backend")


def load_trie(vocab: Any, name: str | None = "auto", *, device: str | None = "auto", **options: Any) -> Any:
    """Build a token-byte trie over ``vocab``: the one trie factory (``make_trie`` calls it).

    ``name="auto"`` picks through the registry (``genlm_register_tries``): on the first
    device that some available implementation supports - this machine's devices best
    first for ``device="auto"``, else the device given (``"cpu"``, ``"cuda"``,
    ``"cuda:1"``) - the highest priority wins: the torch trie on CUDA, the NumPy/numba
    trie on the CPU. A ``name`` picks that implementation; ``device`` then goes to it
    unless it is ``"auto"``. Other options (``eos_tokens``, ``atomic_tokens``, ...) go
    to the constructor, which names unknown ones.
    """
    device = "auto" if device is None else device
    if name in (None, "auto"):
        kind = None if device == "auto" else str(device).split(":")[0]
        reg, chosen, _ = get_registry().choose_auto("trie", devices=None if kind is None else [kind])
        target_device = chosen if device == "auto" else device
    else:
        reg = get_registry().get("trie", name)
        target_device = None if device == "auto" else device
    cls = reg.load_target()
    if target_device is not None and "device" in inspect.signature(cls).parameters:
        options["device"] = target_device
    return cls(vocab, **options)
