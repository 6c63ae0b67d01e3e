"""Catch the missing ``if __name__ == "__main__":`` guard before vLLM spawns processes.

vLLM's multiprocessing workers (``tensor_parallel_size`` or ``pipeline_parallel_size``
above 1, or ``VLLM_ENABLE_V1_MULTIPROCESSING=1``) start with the ``spawn`` method on CPU
(always) and on CUDA once CUDA is initialised: each one re-imports the program's main
script. A script that loads the backend from its top
level, outside the guard, then starts vLLM again inside every worker, which Python's
multiprocessing refuses while the worker bootstraps; the parent sees only "WorkerProc
initialization failed" and the cause is buried in the workers' log. We look for that
case before starting the engine and say what to change.
"""

from __future__ import annotations

import ast
import os
import sys
from types import FrameType

__all__ = ["MissingMainGuardError", "check_main_guard", "unguarded_main_line"]


class MissingMainGuardError(RuntimeError):
    """The main script would start vLLM again in every spawned worker."""


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either order)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    consts = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(consts) == 1


def _main_module_frame(path: str) -> FrameType | None:
    frame: FrameType | None = sys._getframe()
    while frame is not None:
        code = frame.f_code
        if code.co_name == "<module>" and os.path.abspath(code.co_filename) == path:
            return frame
        frame = frame.f_back
    return None


def unguarded_main_line() -> tuple[str, int] | None:
    """``(script, line)`` when this call comes from the main script's top-level code outside
    an ``if __name__ == "__main__":`` block (a spawned worker would run that line again);
    None otherwise (interactive sessions, ``python -c``, pytest, guarded scripts)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path or not path.endswith(".py") or not os.path.isfile(path):
        return None
    path = os.path.abspath(path)
    frame = _main_module_frame(path)
    if frame is None:
        return None
    line = frame.f_lineno
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.If) and _is_main_test(node.test):
            if node.lineno <= line <= (node.end_lineno or node.lineno):
                return None
    return path, line


def check_main_guard(what: str) -> None:
    """Raise :class:`MissingMainGuardError` when vLLM is about to spawn workers (``what``
    says why) from a main script's unguarded top level."""
    if os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") == "fork":
        return  # forked workers do not re-import the script
    found = unguarded_main_line()
    if found is None:
        return
    path, line = found
    raise MissingMainGuardError(
        f"{what}: vLLM starts its workers with multiprocessing's 'spawn' method, and each worker "
        f"re-imports {os.path.basename(path)}, whose line {line} would then start vLLM again inside "
        f"the worker (it fails with 'WorkerProc initialization failed'). Put the code that loads the "
        f'model under `if __name__ == "__main__":` in {path} (see docs/scale-out.md), or keep '
        "tensor_parallel_size=1, pipeline_parallel_size=1 and VLLM_ENABLE_V1_MULTIPROCESSING=0."
    )
