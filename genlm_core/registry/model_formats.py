"""What kind of checkpoint a ``model`` argument names, so ``load("auto")`` picks a backend
that reads it.

A backend declares the formats it reads in its registration
(``register(..., model_formats=["hf-folder", "hub-id"])``); ``[]`` declares that it
loads no model from a checkpoint (a table; a mock, which a folder may lend a
tokenizer). A registration that declares nothing (``None``, third-party plugins written
before the declaration existed) stays a candidate for every model. The formats:

=============  =========================================================================
``hf-folder``  a local folder holding a transformers checkpoint (``config.json``); an
               existing folder with neither ``config.json`` nor a ``.gguf`` file counts
               as one too, so the folder checks say what it lacks
``hub-id``     a Hugging Face hub id (``"gpt2"``, ``"org/name"``) that is not a local path
``gguf``       a ``.gguf`` file, or a local folder holding one
other          a local file is named by its suffix: ``safetensors``, ``bin``, ...
=============  =========================================================================

Deciding reads the file system only (no engine import, no file is opened).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from genlm_core.model_files import FILE_SUFFIXES, looks_like_path

__all__ = ["FORMATS", "describe", "install_hint", "model_formats"]

#: format -> (what it is, in words; the first-party distribution that reads it on any machine)
FORMATS: dict[str, tuple[str, str]] = {
    "hf-folder": ("a Hugging Face model folder (config.json)", "genlm-hf"),
    "hub-id": ("a Hugging Face hub id", "genlm-hf"),
    "gguf": ("a GGUF file (.gguf)", "genlm-llamacpp"),
}


def model_formats(model: Any) -> frozenset[str] | None:
    """The formats ``model`` is in (a folder may hold several), or None when that says
    nothing: ``model=None`` (each backend's default model), a local folder that does not
    exist (the folder checks of the backend chosen report it), a value that is neither a
    path nor a string (the config rejects it)."""
    if model is None or not isinstance(model, (str, os.PathLike)):
        return None
    path = Path(os.path.expanduser(os.fspath(model)))
    suffix = path.suffix.lower()
    if suffix in FILE_SUFFIXES and not path.is_dir():  # a checkpoint file, even a missing one
        return frozenset({suffix.lstrip(".")})
    if not looks_like_path(model):
        return frozenset({"hub-id"})
    if path.is_dir():
        found = set()
        if (path / "config.json").is_file():
            found.add("hf-folder")
        if any(p.suffix.lower() == ".gguf" for p in path.iterdir() if p.is_file()):
            found.add("gguf")
        return frozenset(found or {"hf-folder"})
    if path.is_file():
        return frozenset({suffix.lstrip(".") or "file"})
    return None  # a missing folder tells nothing: the chosen backend's folder check reports it


def describe(fmt: str) -> str:
    """``fmt`` in words (``"a GGUF file (.gguf)"``)."""
    if fmt in FORMATS:
        return FORMATS[fmt][0]
    return "a file without a suffix" if fmt == "file" else f"a .{fmt} file"


def install_hint(fmt: str) -> str | None:
    """The command that installs a first-party backend reading ``fmt``, if there is one."""
    return f"pip install {FORMATS[fmt][1]}" if fmt in FORMATS else None
