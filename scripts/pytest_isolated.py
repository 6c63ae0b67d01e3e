"""Run one pytest selection in a process of its own and always leave a junit file.

A suite whose engine is native code compiled for this host (llama.cpp) can kill the
interpreter with a segfault. pytest then writes no junit file, and when it shares a
process with other suites their results are lost too. Run such a suite through this
script: when pytest dies by a signal or leaves no junit file, it writes one with a
single failing test case that says how the process ended and carries the tail of the
output (faulthandler's traceback names the test and the frame), the host's CPU (model
and flags) and the engines' own build information (llama.cpp's system info, torch's CPU
capability), then exits non-zero.

    python scripts/pytest_isolated.py --junit build/junit-native.xml --suite native_engine -- -m native_engine
"""

from __future__ import annotations

import argparse
import collections
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

TAIL_LINES = 120

# each engine's own account of the CPU features it was built for and uses, in a fresh
# interpreter (importing an engine here could crash this script too)
ENGINE_INFO = {
    "llama.cpp": "import llama_cpp; print(llama_cpp.llama_print_system_info().decode().strip())",
    "torch": "import torch; print(torch.__version__, torch.backends.cpu.get_cpu_capability())",
}


def cpu_description() -> str:
    """The CPU model and flags of this host (/proc/cpuinfo), or why they are unknown."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError as exc:
        return f"/proc/cpuinfo unreadable: {exc}"
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return f"model name: {fields.get('model name', '?')}\nflags: {fields.get('flags', '?')}"


def engine_info() -> str:
    lines = []
    for name, code in ENGINE_INFO.items():
        try:
            out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
            text = out.stdout.strip() or f"unavailable ({out.stderr.strip().splitlines()[-1:]})"
        except (OSError, subprocess.TimeoutExpired) as exc:
            text = f"unavailable ({exc})"
        lines.append(f"{name}: {text}")
    return "\n".join(lines)


def ending(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc} without a junit file"


def crash_junit(path: Path, suite: str, rc: int, tail: list[str]) -> None:
    """A junit file holding one failed test case: the suite's process and how it ended."""
    message = f"the {suite} suite's pytest process ended abnormally: {ending(rc)}"
    details = "\n".join(
        [
            message,
            "",
            "== host CPU",
            cpu_description(),
            "",
            "== engines",
            engine_info(),
            "",
            "== output tail",
            *tail,
        ]
    )
    suites = ET.Element("testsuites")
    ts = ET.SubElement(suites, "testsuite", name=suite, tests="1", failures="1", errors="0", skipped="0")
    case = ET.SubElement(ts, "testcase", classname=f"{suite}.process", name="pytest_process")
    failure = ET.SubElement(case, "failure", message=message)
    failure.text = details
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)
    print(details, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--junit", type=Path, required=True, help="the junit file this run leaves")
    ap.add_argument("--suite", default="isolated", help="the suite's name in a crash report")
    ap.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: pytest's arguments")
    args = ap.parse_args(argv)
    pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    args.junit.unlink(missing_ok=True)
    cmd = [sys.executable, "-X", "faulthandler", "-m", "pytest", f"--junitxml={args.junit}", *pytest_args]
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace"
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            tail.append(line.rstrip("\n"))
    rc = proc.returncode
    if rc < 0 or not args.junit.exists():
        crash_junit(args.junit, args.suite, rc, list(tail))
        return 1
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
