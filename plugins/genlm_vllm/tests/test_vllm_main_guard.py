"""A script that starts vLLM workers from its unguarded top level gets an error that names
the missing ``if __name__ == "__main__":`` guard, before any worker is spawned."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from genlm_vllm.main_guard import MissingMainGuardError, check_main_guard

#: a guard against a hang only: importing vLLM takes ~10-60 s on a loaded 2-core machine
HANG_S = 900

PROBE = """
from genlm_vllm.main_guard import unguarded_main_line
def helper():
    return unguarded_main_line()
{body}
"""


def _run(tmp_path: Path, source: str, **env: str) -> subprocess.CompletedProcess:
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(source))
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=HANG_S,
        env={**os.environ, **env},
        cwd=tmp_path,
    )


@pytest.mark.parametrize(
    ("body", "unguarded"),
    [
        ("print(unguarded_main_line())", True),
        ("print(helper())", True),  # through a function called from the top level
        ('if __name__ == "__main__":\n    print(unguarded_main_line())', False),
        ('if "__main__" == __name__:\n    print(helper())', False),
        ("def main():\n    print(helper())\nif __name__ == '__main__':\n    main()", False),
    ],
)
def test_unguarded_top_level_is_found(tmp_path: Path, body: str, unguarded: bool) -> None:
    out = _run(tmp_path, PROBE.format(body=body))
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    if unguarded:
        path, _, lineno = line.strip("()").partition(", ")
        assert path.strip("'") == str(tmp_path / "program.py")
        printed = textwrap.dedent(PROBE.format(body=body)).splitlines()[int(lineno) - 1]
        assert "print(" in printed  # the line that would run again in a worker
    else:
        assert line == "None"


def test_not_a_script_is_never_refused() -> None:
    check_main_guard("pytest")  # pytest's own __main__ is guarded; nothing to refuse


def test_tensor_parallel_from_an_unguarded_script_names_the_guard(tmp_path: Path, tiny_path: str) -> None:
    """``load("vllm", tensor_parallel_size=2)`` at a script's top level: the error names the
    guard and the fix (before, vLLM failed with 'WorkerProc initialization failed')."""
    out = _run(
        tmp_path,
        f"""
        import genlm_core
        llm = genlm_core.load("vllm", model={tiny_path!r}, dtype="float32", enforce_eager=True,
                              max_model_len=128, engine_opts={{"tensor_parallel_size": 2}})
        print("started")
        """,
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
    )
    assert out.returncode != 0 and "started" not in out.stdout
    assert MissingMainGuardError.__name__ in out.stderr
    assert 'if __name__ == "__main__":' in out.stderr and "program.py" in out.stderr
    assert "due to an exception in a background process" not in out.stderr  # no worker was started
