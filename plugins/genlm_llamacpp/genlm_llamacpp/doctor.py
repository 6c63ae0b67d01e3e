"""genlm-llamacpp's section of ``genlm doctor``: what a model loaded here decides about
llama.cpp's extra CPU buffer types (AMX, REPACK; :mod:`genlm_llamacpp.cpu_buffers`), and why.

The decision reads the installed llama.cpp build's system info. Doctor imports no engine,
so it is read in a child process (``import llama_cpp``, a fraction of a second), bounded
by a timeout: a build that fails to load or crashes is reported, not fatal.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from typing import Any

from genlm_llamacpp.cpu_buffers import extra_buffers_choice

__all__ = ["buffers_section", "doctor_section", "llama_system_info"]

_READ_INFO = "import llama_cpp; print(llama_cpp.llama_print_system_info().decode(errors='replace').strip())"


def llama_system_info(timeout: float = 60.0) -> tuple[str | None, str]:
    """``(system info, "")`` of the installed llama.cpp build, or ``(None, why not)``."""
    try:
        found = importlib.util.find_spec("llama_cpp") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return None, "llama_cpp is not installed (pip install genlm-llamacpp)"
    try:
        out = subprocess.run(
            [sys.executable, "-c", _READ_INFO], capture_output=True, text=True, timeout=timeout
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"reading llama.cpp's system info failed: {exc}"
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        tail = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
        return None, f"llama_cpp did not load ({tail})"
    return lines[-1], ""


def buffers_section(system_info: str | None, why_not: str = "") -> dict[str, Any]:
    """The section for a build with ``system_info`` (None: unknown, ``why_not`` says why)."""
    title = "llama.cpp CPU buffers (genlm-llamacpp)"
    if system_info is None:
        return {
            "title": title,
            "lines": [f"extra buffer types (AMX, REPACK): not decided here: {why_not}"],
            "data": {"cpu_extra_buffers": None, "reason": why_not, "system_info": None},
        }
    use, reason = extra_buffers_choice(None, system_info)
    return {
        "title": title,
        "lines": [f"extra buffer types (AMX, REPACK): {'on' if use else 'off'} by default: {reason}"],
        "data": {"cpu_extra_buffers": use, "reason": reason, "system_info": system_info},
    }


def doctor_section(hardware: Any) -> dict[str, Any]:
    """The ``genlm_doctor`` hook's answer: title, printed lines, JSON data."""
    return buffers_section(*llama_system_info())
