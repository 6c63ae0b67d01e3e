"""Where built models live, and building a model folder safely.

Folders live under :func:`models_dir` (``$GENLM_CACHE_DIR/models`` or
``~/.cache/genlm-core/models``). :func:`ensure_built` is idempotent and atomic: a folder
is written under a temporary name, completed with a marker file (:data:`MARKER`: which
builder wrote it, at which :data:`BUILDER_VERSION`) and then renamed into place, so a
crash never leaves a half-written model behind, and a file lock keeps concurrent
processes from building the same model twice. A folder written by an older builder
version is rebuilt.

Imports nothing heavy: transformers is imported only to silence its progress bars
while a quiet build runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = [
    "BUILDER_VERSION",
    "MARKER",
    "BuildProgress",
    "ModelUnavailableError",
    "cache_dir",
    "ensure_built",
    "legacy_rope_keys",
    "models_dir",
    "update_config_json",
]

MARKER = ".genlm-model.json"
#: Bump when a builder changes what it writes: existing folders are then rebuilt.
BUILDER_VERSION = {"smollm2": 3, "tiny-llama": 3, "tiny-gpt2": 2, "tiny-llama-spm": 3}


class ModelUnavailableError(RuntimeError):
    """An embedded model cannot be built because a local ingredient is missing."""


def cache_dir() -> Path:
    """The genlm-core cache folder: ``$GENLM_CACHE_DIR`` or ``~/.cache/genlm-core``."""
    env = os.environ.get("GENLM_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "genlm-core"


def models_dir() -> Path:
    """Where built model folders live: ``cache_dir() / "models"``."""
    return cache_dir() / "models"


class BuildProgress:
    def __init__(self, enabled: bool, name: str) -> None:
        self.enabled = enabled
        self.name = name
        self.start = time.perf_counter()

    def step(self, message: str) -> None:
        if self.enabled:
            elapsed = time.perf_counter() - self.start
            print(f"[genlm-core] {self.name}: {message} ({elapsed:.1f}s)", file=sys.stderr, flush=True)


def _is_complete(folder: Path, key: str) -> bool:
    try:
        info = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(info, dict) and info.get("builder") == key and info.get("version") == BUILDER_VERSION[key]
    )


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock (a no-op where ``fcntl`` is unavailable)."""
    try:
        import fcntl
    except ImportError:  # Windows: atomic rename alone still keeps folders whole
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _library_progress_bars(enabled: bool) -> Iterator[None]:
    """Silence transformers' own progress bars while building quietly."""
    if enabled:
        yield
        return
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _fix_permissions(folder: Path) -> None:
    """mkdtemp and some writers create owner-only entries: apply the usual umask."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(folder, 0o777 & ~umask)
    for entry in folder.rglob("*"):
        os.chmod(entry, (0o777 if entry.is_dir() else 0o666) & ~umask)


def ensure_built(
    name: str, key: str, build: Callable[[Path, BuildProgress], dict[str, Any]], progress: bool
) -> Path:
    """Return ``models_dir()/name``, building it with ``build(tmp, progress)`` if needed."""
    final = models_dir() / name
    if _is_complete(final, key):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(final.parent / f".{name}.lock"):
        if _is_complete(final, key):  # another process built it while we waited
            return final
        report = BuildProgress(progress, name)
        report.step(f"building into {final}")
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=final.parent))
        try:
            with _library_progress_bars(progress):
                info = build(tmp, report)
            _fix_permissions(tmp)
            info = {"builder": key, "version": BUILDER_VERSION[key], **info}
            (tmp / MARKER).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
            old = None
            if final.exists():  # stale or incomplete: move aside, then swap in
                old = final.parent / f".{name}.old-{os.getpid()}-{time.time_ns()}"
                os.rename(final, old)
            os.rename(tmp, final)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        report.step("done")
    return final


def update_config_json(folder: Path, **extra: Any) -> None:
    path = folder / "config.json"
    data = json.loads(path.read_text())
    data.update(extra)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def legacy_rope_keys(config: Any) -> dict[str, Any]:
    """Top-level ``rope_theta`` next to transformers 5's ``rope_parameters``.

    mlx-lm (0.32) reads only the top-level key and silently falls back to 10000
    otherwise (SmolLM2 uses 100000); transformers and vLLM accept both.
    """
    params = getattr(config, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    return {} if theta is None else {"rope_theta": float(theta)}
