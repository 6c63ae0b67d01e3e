"""The benchmarks' verdicts: each ``benchmarks/bench_*.py`` judges the JSON it
writes (``headline(result)``), ``run_all.py`` only collects the rows, ``plots.py`` draws.

Oracle: the committed ``benchmarks/results/summary.json`` / ``summary.md``, written by a
run of every benchmark: their headline rows are rebuilt here from a copy of the
committed section JSONs. No benchmark runs: everything reads committed files.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
RESULTS = BENCH / "results"
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS")


@pytest.fixture(scope="module")
def run_all() -> Iterator[ModuleType]:
    """``benchmarks/run_all.py`` loaded from its path. It puts ``benchmarks/`` on sys.path
    (as when run as a script) and imports the benchmark modules for their verdicts; both
    are undone afterwards (``common`` is a name other code may use)."""
    names = {p.stem for p in BENCH.glob("*.py")}
    saved_path = list(sys.path)
    saved_modules = {n: sys.modules.pop(n) for n in names if n in sys.modules}
    spec = importlib.util.spec_from_file_location("run_all", BENCH / "run_all.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        yield module
    finally:
        sys.path[:] = saved_path
        for n in names:
            sys.modules.pop(n, None)
        sys.modules.update(saved_modules)


@pytest.fixture
def results(tmp_path: Path) -> Path:
    """A copy of the committed results: nothing here writes into the checkout."""
    return Path(shutil.copytree(RESULTS, tmp_path / "results"))


def _committed() -> dict[str, Any]:
    return json.loads((RESULTS / "summary.json").read_text())


def test_summary_rebuilt_from_committed_results_equals_committed_summary(
    run_all: ModuleType, results: Path
) -> None:
    committed = _committed()
    sections = list(run_all._sections(False))
    # the rows first, for a readable diff
    assert run_all.headline(sections, results) == committed["headline"]
    report = {k: v for k, v in committed.items() if k != "headline"}
    run_all.write_summary(report, sections, results)
    assert (results / "summary.json").read_text() == (RESULTS / "summary.json").read_text()
    assert (results / "summary.md").read_text() == (RESULTS / "summary.md").read_text()
    # every section with a committed result contributes rows
    prefixes = ("batcher", "decode_vocab", "trie ", "SIS genlm-hf", "SIS genlm-mlx", "SIS genlm-vllm")
    prefixes += ("vLLM", "byte beam", "llamacpp", "serve")
    for prefix in prefixes:
        assert any(r["metric"].startswith(prefix) for r in committed["headline"]), prefix


def test_only_sections_keep_the_table_order(run_all: ModuleType, results: Path) -> None:
    # asked for in another order: the rows still come in the section table's order
    rows = run_all.headline(["serve", "sis-vllm", "batcher"], results)
    want = [
        r for r in _committed()["headline"] if r["metric"].startswith(("batcher", "SIS genlm-vllm", "serve"))
    ]
    assert len(want) == 5 and rows == want


def test_no_results_no_rows(run_all: ModuleType, tmp_path: Path) -> None:
    assert run_all.headline(list(run_all._sections(False)), tmp_path) == []


def _set_batcher(d: dict) -> None:
    next(r for r in d["rows"] if r["thread"] and r["batch_size"] == 64)["us_per_request"] = 25.0


def _set_sis_anchor(d: dict) -> None:  # (a) / (b) = 2.5 < 3
    d["hf"]["figures"]["b"]["calls_per_s"] = d["hf"]["figures"]["a"]["calls_per_s"] / 2.5


def _set_serve_memory(d: dict) -> None:
    d["figures"]["b_over_a_memory"] = 0.61


@pytest.mark.parametrize(
    ("name", "change", "section", "metric", "before", "after"),
    [
        (
            "batcher_overhead",
            _set_batcher,
            "batcher",
            "batcher overhead, us/request (batch 64, worker thread)",
            "yes",
            "NO",
        ),
        (
            "vocab",
            lambda d: d.update(qwen_151k_median_s=1.0),
            "vocab",
            "decode_vocab Qwen 151k, s",
            "yes",
            "NO",
        ),
        ("sis", _set_sis_anchor, "sis", "SIS genlm-hf vs genlm-backend AsyncTransformer", "yes", "NO"),
        ("serve", _set_serve_memory, "serve", "serve: total RSS MB, (b) vs (a)", "yes", "NO"),
    ],
)
def test_a_verdict_follows_its_figures(
    run_all: ModuleType,
    results: Path,
    name: str,
    change: Callable[[dict], None],
    section: str,
    metric: str,
    before: str,
    after: str,
) -> None:
    """A figure moved past its target (by the targets' own wording) flips the verdict."""

    def met() -> str:
        return next(r["met"] for r in run_all.headline([section], results) if r["metric"] == metric)

    assert met() == before
    path = results / f"{name}.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    assert met() == after


def test_plot_writes_a_png_from_the_committed_results(
    run_all: ModuleType, results: Path, tmp_path: Path
) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.image

    plots = importlib.import_module("plots")  # benchmarks/plots.py (run_all put its folder on sys.path)
    png = tmp_path / "out" / "bench.png"
    plots.plot(png, results)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.image.imread(png).shape[:2] == (1045, 1430)  # 13 x 9.5 in at 110 dpi


def test_collecting_verdicts_loads_no_engine_and_pins_no_threads(run_all: ModuleType) -> None:
    """run_all imports every benchmark script for its verdict: that must stay cheap (no
    torch, numpy, numba, vllm, not even genlm_core or pytest) and leave the thread settings
    of the process, and so of the benchmarks it starts next, alone."""
    code = f"""
import os, sys
sys.path.insert(0, {str(BENCH)!r})
import run_all
for name in run_all._sections(False):
    run_all.verdict(name)
heavy = {{"torch", "numpy", "numba", "vllm", "transformers", "mlx", "llama_cpp", "genlm_core", "pytest"}}
print(sorted(heavy & set(sys.modules)), sorted(v for v in {THREAD_VARS!r} if v in os.environ))
"""
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=BENCH, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[] []"


def test_the_readme_lists_every_workload_and_run_all_runs_them_all(run_all: ModuleType) -> None:
    """benchmarks/workloads.py is the one list; the README's table names each section and
    script, and ``run_all.py --help`` prints each one's line."""
    from workloads import WORKLOADS

    readme = (BENCH / "README.md").read_text()
    assert [w.name for w in WORKLOADS] == list(run_all._sections(False))
    for w in WORKLOADS:
        assert f"`{w.name}`" in readme and f"`{w.script}`" in readme, w.name
    out = subprocess.run(
        [sys.executable, str(BENCH / "run_all.py"), "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert all(f"  {w.name} " in out.stdout for w in WORKLOADS)
