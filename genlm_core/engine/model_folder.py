"""Local folders vs hub ids, checked before any engine loads: :mod:`genlm_core.model_files`
(below the config and the registry, which check ``model=`` too); this path re-exports it."""

from __future__ import annotations

from genlm_core.model_files import (
    FILE_SUFFIXES,
    REQUIREMENTS,
    as_model_argument,
    check_model_folder,
    checkpoint_file,
    looks_like_path,
)

__all__ = [
    "FILE_SUFFIXES",
    "REQUIREMENTS",
    "as_model_argument",
    "check_model_folder",
    "checkpoint_file",
    "looks_like_path",
]
