"""genlm-core installed alone (scripts/test_artifacts.py, set "core"): no engine, no
backend; the registry, tries and vocabularies work, and ``genlm doctor`` says how to
get a backend."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np

import genlm_core
from genlm_core.registry.distributions import NO_BACKEND_HINT


def genlm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "genlm_core.tools.cli", *args], capture_output=True, text=True, timeout=300
    )


def test_nothing_but_the_core_is_installed() -> None:
    for engine in ("torch", "transformers", "vllm", "mlx", "llama_cpp", "genlm_hf", "genlm_mock"):
        assert importlib.util.find_spec(engine) is None, engine
    assert genlm_core.list_backends() == []
    assert genlm_core.__version__ == "0.1.0"


def test_doctor_says_no_backend_and_how_to_get_one() -> None:
    out = genlm("doctor")
    assert out.returncode == 0, out.stderr
    assert NO_BACKEND_HINT in out.stdout
    assert "pip install genlm-hf" in out.stdout
    version = genlm("--version")
    assert version.stdout.splitlines() == ["genlm-core 0.1.0"], version.stdout


def test_trie_sums_with_numba() -> None:
    """numba is a dependency: the CPU trie uses its kernels; masses equal a brute-force
    sum over the tokens under each prefix (exact in float64 for these small values)."""
    from genlm_core.trie import make_trie

    vocab = [b"a", b"ab", b"abc", b"b", b"ba"]
    trie = make_trie(vocab, device="cpu")
    assert importlib.util.find_spec("numba") is not None
    ws = np.array([0.1, 0.2, 0.3, 0.15, 0.25])
    masses = trie.weight_sum(ws)
    for prefix in (b"a", b"ab", b"b"):
        node = trie.root
        for byte in prefix:
            node = trie.children[node][byte]
        want = sum(w for tok, w in zip(vocab, ws) if tok.startswith(prefix))
        assert abs(masses[node] - want) < 1e-12
