"""The KV pool's self-check at load, made visible.

Each load runs :func:`genlm_hf.pool_probe.pool_self_check` (a 3-token context through the
pool against the model's own forward). When it fails the engine runs every call whole,
without KV reuse: rows stay exact but a long prompt costs its whole length every call.
That must never pass unnoticed:

* the engine logs a WARNING with the reason (logger ``genlm_hf``) and says it in
  ``stats()["engine"]["kv_pool_check"]``;
* ``kv_pool="required"`` makes it a load error instead (the test suites load so: a pool
  broken on the test machine fails CI, it does not fall back);
* every load's result is recorded (:func:`record_pool_check`, the last
  :data:`KEEP` loads in ``<genlm cache>/hf_pool_checks.json``) and ``genlm doctor`` prints
  them (:func:`doctor_section`, read without importing torch).
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from pathlib import Path
from typing import Any

__all__ = ["KEEP", "PoolCheckFailed", "doctor_section", "record_pool_check", "self_check_failed"]

logger = logging.getLogger("genlm_hf")

#: loads whose self-check results are kept for ``genlm doctor``
KEEP = 20


class PoolCheckFailed(RuntimeError):
    """The pool's self-check failed and ``kv_pool="required"`` refuses to fall back."""


def _record_path() -> Path:
    from genlm_core.models.store import cache_dir

    return Path(cache_dir()) / "hf_pool_checks.json"


def read_pool_checks() -> list[dict[str, Any]]:
    """The recorded loads, oldest first ([] when none, or the file is unreadable)."""
    try:
        data = json.loads(_record_path().read_text())
    except (OSError, ValueError):
        return []
    return [r for r in data if isinstance(r, dict)] if isinstance(data, list) else []


def record_pool_check(model: Any, result: str) -> None:
    """Record one load's self-check ``result`` ("passed" or "failed: ..."); never fails
    the load (an unwritable cache folder records nothing)."""
    try:
        import torch
        import transformers

        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "model": str(getattr(model.config, "_name_or_path", "") or type(model).__name__),
            "architecture": type(model).__name__,
            "device": str(model.device),
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "result": result,
        }
        path = _record_path()
        records = [r for r in read_pool_checks() if {**r, "time": None} != {**entry, "time": None}]
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{id(entry)}.tmp")
        tmp.write_text(json.dumps((records + [entry])[-KEEP:], indent=1))
        tmp.replace(path)
    except Exception:  # noqa: BLE001 - a record is advice, never a reason to fail a load
        logger.debug("could not record the KV pool's self-check", exc_info=True)


def self_check_failed(reason: str, required: bool) -> None:
    """Say that the self-check failed: a load error under ``kv_pool="required"``, else a
    logged WARNING and a UserWarning naming the reason and what it costs."""
    message = (
        f"hf: the KV pool's self-check failed ({reason}): every call runs whole, without KV reuse "
        "(rows exact, a long prompt computed again every call). Please report it with the output of "
        "`genlm doctor`"
    )
    if required:
        raise PoolCheckFailed(message + "; kv_pool='required' refuses to fall back (kv_pool='auto' does)")
    logger.warning(message)
    warnings.warn(message, UserWarning, stacklevel=4)


def doctor_section() -> dict[str, Any]:
    """genlm-hf's section of ``genlm doctor``: the recorded loads' self-checks, failures first."""
    records = read_pool_checks()
    failed = [r for r in records if not str(r.get("result", "")).startswith(("passed", "not run"))]
    lines = []
    if not records:
        lines.append("KV pool self-check: no load recorded yet (each genlm_core.load('hf', ...) runs it)")
    for r in failed + [r for r in records if r not in failed][-3:]:
        lines.append(
            f"KV pool self-check {r.get('result')}: {r.get('model')} ({r.get('architecture')}, {r.get('device')}, "
            f"{r.get('dtype')}; torch {r.get('torch')}, transformers {r.get('transformers')}) at {r.get('time')}"
        )
    return {
        "title": "genlm-hf KV pool",
        "lines": lines,
        "data": {"recorded": records, "failed": len(failed)},
    }
