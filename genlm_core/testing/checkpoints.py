"""Where a backend's checkpoint is (:func:`find_checkpoint`): what the conformance kit's
checkpoint policy reads, and what :mod:`genlm_core.testing.tolerance` reads a model's
shape from."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["CheckpointSource", "find_checkpoint"]


@dataclass(frozen=True)
class CheckpointSource:
    """The checkpoint a backend was loaded from: ``kind`` ``"folder"`` (a model folder or
    a hub id), ``"gguf"`` (a GGUF file) or ``"none"`` (it loads no model; ``path`` is the
    folder lending it a tokenizer, if any); ``why``: how that was found;
    ``requested_dtype``: the ``dtype`` option it was loaded with."""

    kind: Literal["folder", "gguf", "none"]
    path: str | None
    why: str
    requested_dtype: str | None = None


def find_checkpoint(backend: Any) -> CheckpointSource:
    """The checkpoint of ``backend``, from its registration and config.

    The backend's registration says what it reads (``model_formats``); its config names
    the model (``model``, with ``gguf_file`` where the backend has one). A client of
    ``genlm serve`` (``info()["server"]``) is judged by the served backend and model,
    which must be on this machine. ``model=None`` is the embedded default model
    (:func:`genlm_core.engine.checkpoint.default_model`): its folder, or its GGUF for a
    backend that reads GGUF files and not folders. Raises ``AssertionError`` saying what
    to declare when the backend's checkpoint cannot be told.
    """
    from pathlib import Path

    from genlm_core.engine import checkpoint
    from genlm_core.registry import UnknownImplementationError, get_registry

    config = getattr(backend, "config", None)
    served = backend.info().get("server")
    if isinstance(served, dict) and served.get("backend"):
        name, model, gguf_file = str(served["backend"]), served.get("model") or None, None
        requested, via = None, f"served by {served['backend']} at {backend.info().get('url', '?')}"
    else:
        name = str(getattr(backend, "backend_name", type(backend).__name__))
        model, gguf_file = getattr(config, "model", None), getattr(config, "gguf_file", None)
        requested, via = getattr(config, "dtype", None), f"{name}'s config"
    try:
        formats = get_registry().get("backend", name).model_formats
    except UnknownImplementationError:
        formats = None
    if formats is not None and not formats:  # a folder given may still lend it a tokenizer
        return CheckpointSource(
            "none", model, f"{name} declares it loads no model (model_formats=[]), {via}", requested
        )
    reads_gguf = formats is not None and "gguf" in formats
    if model is None:
        if formats is None:
            raise AssertionError(
                f"backend {name!r} was loaded with model=None and its registration does not declare "
                "model_formats: the kit cannot tell which checkpoint it read. Declare model_formats in "
                "register(...) ([] for a backend that reads no model), or override checkpoint_source()"
            )
        gguf = reads_gguf and "hf-folder" not in formats
        kind: Literal["folder", "gguf"] = "gguf" if gguf else "folder"
        return CheckpointSource(kind, checkpoint.default_model(gguf=gguf), f"model=None: the default model, {via}", requested)  # fmt: skip
    path = Path(model) / gguf_file if gguf_file else Path(model)
    if path.is_file() and path.suffix.lower() == ".gguf":
        return CheckpointSource("gguf", str(path), f"a GGUF file, {via}", requested)
    if path.is_dir() and not (path / "config.json").is_file() and reads_gguf:
        ggufs = sorted(p for p in path.iterdir() if p.suffix.lower() == ".gguf")
        if len(ggufs) != 1:
            raise AssertionError(f"{path} holds {len(ggufs)} GGUF files: override checkpoint_source()")
        return CheckpointSource("gguf", str(ggufs[0]), f"the GGUF file of its folder, {via}", requested)
    if path.is_dir() or not checkpoint.looks_like_path(str(model)):
        return CheckpointSource("folder", str(model), f"a model folder or hub id, {via}", requested)
    raise AssertionError(f"{name}: its model {model!r} is not on this machine: override checkpoint_source()")
