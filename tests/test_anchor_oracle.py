"""genlm-core (through genlm-compat) against genlm-backend 0.3.1 / genlm-bytes 0.2.0.

The reference stack lives in its own venv (``$GENLM_ANCHOR_PYTHON``, default the one
benchmarks/bench_control.py builds from PyPI, built here on first use);
``tests/anchor_worker.py`` computes there, on the same model in float32: next-token
logprobs of three contexts, trie masses of a few byte prefixes, and a K=5 byte beam's
logZ and next-byte logprobs after a prefill, and its ``greedy`` bytes.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from model_paths import tiny_llama

from genlm_core.testing.tolerance import assert_tiny_close, row_atol, row_magnitude, tiny_shape

ROOT = Path(__file__).resolve().parents[1]
# the bound: same model, float32, different batching/kernels: each row within the bound
# derived from that arithmetic (genlm_core.testing.tolerance); a beam's logZ sums one
# logprob per token of the text at most, so len(TEXT) row bounds


def anchor_python() -> Path:
    """``$GENLM_ANCHOR_PYTHON``, else the venv of benchmarks/bench_control.py (built
    from PyPI on first use, as the benchmark does: CPU torch first, then the pins)."""
    if "GENLM_ANCHOR_PYTHON" in os.environ:
        return Path(os.environ["GENLM_ANCHOR_PYTHON"])
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_control
    from common import ensure_venv

    check = "import genlm.backend, genlm.bytes, torch; assert torch.__version__.startswith('2.13.0')"
    return ensure_venv(bench_control.ANCHOR_VENV, bench_control.TORCH, bench_control.ANCHOR_PINS, check)


def test_core_equals_genlm_backend_and_genlm_bytes() -> None:
    gb = pytest.importorskip("genlm.backend")
    gbytes = pytest.importorskip("genlm.bytes")
    import anchor_worker  # the same constants on both sides

    path = str(tiny_llama())
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.run(
        [str(anchor_python()), str(Path(__file__).with_name("anchor_worker.py")), path],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = json.loads(proc.stdout.strip().splitlines()[-1])

    llm = gb.load_model_by_name(path, backend="hf", llm_opts={"hf_opts": {"torch_dtype": "float"}})
    assert ref["contexts"][0] == llm.tokenizer.encode(anchor_worker.PROMPT)
    for ctx, want in zip(ref["contexts"], ref["logprobs"]):
        assert_tiny_close(llm.next_token_logprobs_sync(ctx), np.asarray(want), "genlm-backend's row")
    row_bound = max(row_atol(tiny_shape(), row_magnitude(torch.tensor(w))) for w in ref["logprobs"])
    ATOL = len(anchor_worker.TEXT) * row_bound
    trie = gb.TokenCharacterTrie(llm.byte_vocab)
    masses = trie.weight_sum(np.exp(np.asarray(ref["logprobs"][0], dtype=np.float64)))
    for pre, want in ref["masses"].items():
        node = trie.root
        for b in bytes.fromhex(pre):
            node = trie.children[node][b]
        assert masses[node] == pytest.approx(want, rel=1e-9, abs=1e-12)  # same float64 weights

    async def beam() -> tuple[float, np.ndarray]:
        state = await gbytes.ByteBeamState.initial(llm, gbytes.BeamParams(K=5))
        state = await state.prefill(anchor_worker.TEXT)
        dist = await state.logp_next()
        out = (state.logZ, np.asarray(dist.ps, dtype=np.float64)[:256])
        await state.cleanup()
        return out

    async def greedy() -> bytes:
        state = await gbytes.ByteBeamState.initial(llm, gbytes.BeamParams(K=5))
        out = await state.greedy(anchor_worker.TEXT, steps=anchor_worker.GREEDY_STEPS)
        await state.cleanup()
        return out

    logZ, next_bytes = asyncio.run(beam())
    assert logZ == pytest.approx(ref["logZ"], abs=ATOL)
    # greedy: the same bytes while each step's argmax is farther from the runner-up than
    # both sides' logprobs can differ (the text and the bytes so far, a row bound each)
    got, want = asyncio.run(greedy()), bytes.fromhex(ref["greedy"])
    n = len(anchor_worker.TEXT)
    robust = n
    for k, margin in enumerate(ref["greedy_margins"]):
        if margin <= 2 * (n + k + 1) * row_bound:
            break
        robust += 1
    assert robust > n, f"no greedy step of the reference is robust: {ref['greedy_margins']}"
    assert got[:robust] == want[:robust]
    finite = np.isfinite(ref["next_bytes"])
    np.testing.assert_array_equal(np.isfinite(next_bytes), finite)
    np.testing.assert_allclose(next_bytes[finite], np.asarray(ref["next_bytes"])[finite], atol=ATOL)
    llm.close()
