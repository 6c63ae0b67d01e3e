"""What genlm-vllm keeps for code written against older releases, until genlm-core 0.3.

* ``genlm_vllm.backend`` (a module path: this module answers for it, warning) and its
  names: ``VLLMBackend``, the backend class over :class:`~genlm_vllm.engine.VLLMEngine`
  (now ``genlm_core.load("vllm", ...)``, or ``BaseLogprobBackend(VLLMEngine(llm, config),
  config)`` around an ``LLM`` started by hand with :func:`genlm_vllm.launch.engine_kwargs`),
  and the names that live in :mod:`genlm_vllm.launch` (``INSTALL_HINT``,
  ``VLLMNotInstalledError``, ``engine_kwargs``, ``check_dtype``) and
  :mod:`genlm_vllm.lifecycle` (``EngineDiedError``), each read with a warning naming its module.
* ``genlm_vllm.transport``'s names of the core's row transport (``RowBuffer``,
  ``write_rows``, ...): they live in :mod:`genlm_core.engine.row_transport`.
* ``DecodeSessions.closed`` (now ``sessions_closed``) and ``DecodeSessions.step`` (now
  ``take_turn``, and ``end_burst`` for a step without rows).

Light: nothing here is imported until a name is read (vLLM and torch come with them);
genlm-core's helpers (:mod:`genlm_core._deprecated`) answer for the names.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Mapping
from typing import Any

from genlm_core.engine import moved_names, old_backend, renamed_property

__all__ = ["ADVICE", "MOVED", "NAMES", "REMOVAL", "sessions_closed", "sessions_step"]

#: the genlm-core version that removes what is here
REMOVAL = "0.3"

#: deprecated module path -> the module answering for it (read by genlm-core's import hook)
MOVED = {"genlm_vllm.backend": "genlm_vllm._deprecated"}
#: what to do instead, said when the old path is imported
ADVICE = {
    "genlm_vllm.backend": "load with genlm_core.load('vllm', ...); the engine is genlm_vllm.engine.VLLMEngine, "
    "the other names live in genlm_vllm.launch and genlm_vllm.lifecycle"
}

#: module -> its old names (genlm-core's old_name reads them)
NAMES = {
    "genlm_vllm.backend": {
        **moved_names(
            ("INSTALL_HINT", "VLLMNotInstalledError", "check_dtype", "engine_kwargs"), "genlm_vllm.launch"
        ),
        **moved_names(("EngineDiedError",), "genlm_vllm.lifecycle"),
    },
    "genlm_vllm.transport": moved_names(
        (
            "HEADER",
            "SHM_DIR",
            "RowBuffer",
            "copy_row",
            "forget",
            "shm_available",
            "stack_rows",
            "sweep_stale_buffers",
            "write_rows",
        ),
        "genlm_core.engine.row_transport",
    ),  # fmt: skip
}

__getattr__ = old_backend("vllm", "genlm_vllm.engine:VLLMEngine", "VLLMBackend", "genlm_vllm.backend")

#: ``DecodeSessions.closed``: the count is ``sessions_closed`` (``VLLMEngine.closed`` is a bool)
sessions_closed = renamed_property(
    "DecodeSessions.closed",
    "sessions_closed",
    "read sessions_closed (the number of sessions closed unfinished)",
)


def sessions_step(self: Any, rows: Mapping[int, Any], released: Collection[int]) -> Any:
    """``DecodeSessions.step``: :meth:`~genlm_vllm.sessions.DecodeSessions.take_turn` (rows),
    :meth:`~genlm_vllm.sessions.DecodeSessions.end_burst` (no rows: returns None)."""
    warnings.warn(
        f"DecodeSessions.step is deprecated and will be removed in genlm-core {REMOVAL}: call "
        "take_turn(rows, released), and end_burst(released) when the burst ends",
        DeprecationWarning,
        stacklevel=2,
    )
    if not rows:
        self.end_burst(released)
        return None
    return self.take_turn(rows, released)
