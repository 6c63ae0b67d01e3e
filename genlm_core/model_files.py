"""Telling a local model folder from a hub id, and checking the folder before any engine loads.

Every backend config (:class:`~genlm_core.config.BackendConfig`) takes ``model`` as a
hub id (``"gpt2"``, ``"org/name"``) or a local folder. Engines given a folder that does
not exist treat it as a hub id and fail with the hub's repo-id rules; given an empty
folder they fail inside the tokenizer. :func:`check_model_folder` runs first, in
``genlm_core.load`` and in every plugin's constructor, and says what is wrong in the
same words on every backend. It imports nothing but the standard library (and :mod:`genlm_core.errors`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from genlm_core.errors import ConfigError

__all__ = ["REQUIREMENTS", "as_model_argument", "check_model_folder", "checkpoint_file", "looks_like_path"]

#: What a model folder needs, by requirement name: any one of these file names.
REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "config": ("config.json",),
    "tokenizer": (
        "tokenizer.json",
        "tokenizer_config.json",
        "tokenizer.model",
        "vocab.json",
        "vocab.txt",
        "spiece.model",
        "sentencepiece.bpe.model",
        "tekken.json",
    ),
}

_LISTED = 8  # entries of a folder named in an error

#: suffixes of single-file checkpoints: a missing path ending in one names a file, not a folder
FILE_SUFFIXES = (".gguf", ".ggml", ".bin", ".safetensors", ".pt", ".pth", ".npz")


def as_model_argument(model: Any) -> Any:
    """``model`` as configs hold it: an ``os.PathLike`` becomes an absolute path string
    (a ``Path`` always names a local folder, even a relative one like ``Path("m")``),
    a string starting with ``~`` is expanded; anything else is returned unchanged."""
    if isinstance(model, os.PathLike):
        return os.path.abspath(os.path.expanduser(os.fspath(model)))
    if isinstance(model, str) and model.startswith("~"):
        return os.path.expanduser(model)
    return model


def looks_like_path(model: str | os.PathLike[str]) -> bool:
    """Whether ``model`` names a local folder (or file) rather than a hub id.

    A ``Path``, a string starting with ``/``, ``.`` or ``~``, a string with more than
    one ``/`` (hub ids are ``name`` or ``org/name``), a string using the platform's
    other separator, and anything that exists on disk are local; ``"gpt2"`` and
    ``"org/name"`` that do not exist here are hub ids.
    """
    if isinstance(model, os.PathLike):
        return True
    if model.startswith(("/", ".", "~")) or os.path.isabs(model) or model.count("/") > 1:
        return True
    if os.altsep is not None and os.sep in model:  # Windows: a backslash is never in a hub id
        return True
    return os.path.exists(os.path.expanduser(model))


def check_model_folder(
    model: str | os.PathLike[str] | None, needs: Iterable[str] = ("config", "tokenizer"), what: str = "model"
) -> None:
    """Raise :class:`~genlm_core.config.ConfigError` when ``model`` names a local folder
    that does not exist or lacks the files ``needs`` names (keys of :data:`REQUIREMENTS`).

    Hub ids and ``None`` pass (the engine resolves them); so does an existing file (a
    GGUF checkpoint given by its path): only its engine can judge it.
    """
    if model is None or not looks_like_path(model):
        return
    folder = Path(os.path.expanduser(os.fspath(model)))
    if not folder.exists():
        parent = folder.parent
        hint = "" if parent.is_dir() else f"; its parent {str(parent)!r} does not exist either"
        if folder.suffix.lower() in FILE_SUFFIXES:
            raise ConfigError(
                f"{what} file {str(model)!r} does not exist{hint} (give the path of an existing "
                f"{folder.suffix} file, a local model folder, or a hub id such as 'gpt2' or 'org/name')"
            )
        raise ConfigError(
            f"{what} folder {str(model)!r} does not exist{hint} "
            "(give an existing local folder, or a hub id such as 'gpt2' or 'org/name')"
        )
    if not folder.is_dir():
        return
    names = {p.name for p in folder.iterdir()}
    missing = [need for need in needs if not names.intersection(REQUIREMENTS[need])]
    if not missing:
        return
    wanted = []
    for need in missing:
        files = REQUIREMENTS[need]
        wanted.append(files[0] if len(files) == 1 else f"{need} files (one of {', '.join(files)})")
    if names:
        shown = sorted(names)[:_LISTED]
        more = f" and {len(names) - _LISTED} more" if len(names) > _LISTED else ""
        holds = f"it holds {', '.join(shown)}{more}"
    else:
        holds = "it is empty"
    inner = [str(sub) for sub in sorted(folder.iterdir()) if (sub / "config.json").is_file()]
    hint = f"; did you mean {inner[0]!r}?" if inner else ""
    raise ConfigError(f"{what} folder {str(model)!r} lacks {' and '.join(wanted)}: {holds}{hint}")


def checkpoint_file(model: str | os.PathLike[str] | None, name: str) -> Path | None:
    """The checkpoint's file ``name`` (``config.json``, ``generation_config.json``), or None.

    ``model`` is a local folder, a file in one (a GGUF: its folder's file, if any), or a
    hub id whose file is already in the local Hugging Face cache: nothing is downloaded.
    """
    if model is None:
        return None
    local = Path(os.path.expanduser(os.fspath(model)))
    if local.is_dir():
        path = local / name
        return path if path.is_file() else None
    if local.exists():
        path = local.parent / name
        return path if path.is_file() else None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(os.fspath(model), name)
    except Exception:  # noqa: BLE001 - not a valid repo id: nothing cached for it
        return None
    return Path(found) if isinstance(found, str) else None
