"""scripts/pytest_isolated.py: a suite whose process dies (a segfault in native code)
is reported as that suite's failure, with the host's CPU and the engines' build
information, instead of ending the test run with no result."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "pytest_isolated.py"


def run(tmp_path: Path, body: str) -> tuple[int, ET.Element, str]:
    (tmp_path / "test_suite.py").write_text(body)
    junit = tmp_path / "junit.xml"
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--junit", str(junit), "--suite", "demo", "--", "-q", "-p", "no:cacheprovider",
         str(tmp_path / "test_suite.py")],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    return out.returncode, ET.parse(junit).getroot(), out.stdout + out.stderr


def test_a_segfault_becomes_the_suites_failure_with_the_host_and_engine_info(tmp_path: Path) -> None:
    rc, root, output = run(
        tmp_path,
        "import ctypes\n\ndef test_fine():\n    pass\n\ndef test_native_crash():\n    ctypes.string_at(0)\n",
    )
    assert rc != 0
    (failure,) = list(root.iter("failure"))
    assert "killed by SIGSEGV" in failure.get("message", "")
    text = failure.text or ""
    assert "test_native_crash" in text  # faulthandler's traceback, from the output tail
    flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0].strip(" :\t")
    assert flags in text
    assert "llama.cpp: CPU :" in text  # llama.cpp's own system info
    assert "killed by SIGSEGV" in output


def test_a_suite_that_ends_normally_keeps_pytests_own_report(tmp_path: Path) -> None:
    rc, root, _ = run(tmp_path, "def test_one():\n    pass\n\ndef test_two():\n    assert 1 + 1 == 3\n")
    assert rc == 1
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert set(cases) == {"test_one", "test_two"}
    assert cases["test_two"].find("failure") is not None and cases["test_one"].find("failure") is None
