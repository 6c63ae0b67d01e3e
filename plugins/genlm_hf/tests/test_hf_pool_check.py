"""The KV pool's self-check at load is never silent.

A pool whose pass disagrees with the model's own forward (here: a real defect injected
in the pass, every logit of the pool's rows x1.5) must be seen: a load error under
``kv_pool="required"`` (the test suites load so), and under ``"auto"`` a logged WARNING,
a UserWarning, the reason in ``stats()`` and in ``genlm doctor``; the rows then come from
the model's own forward and stay exact. Every model the tests use passes it.
"""

from __future__ import annotations

import json
import logging
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_helpers import load_hf

from genlm_core.testing.tolerance import assert_tiny_close


@pytest.fixture
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache folder of the test's own (the self-check records go there)."""
    monkeypatch.setenv("GENLM_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture
def broken_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool's pass computes wrong rows (x1.5), as an attention it does not implement would."""
    import genlm_hf.pool_probe as pool_probe

    real = pool_probe.run_pass

    def wrong(*args: Any, **kwargs: Any) -> torch.Tensor:
        return real(*args, **kwargs) * 1.5

    monkeypatch.setattr(pool_probe, "run_pass", wrong)


@pytest.mark.parametrize("which", ["llama", "gpt2"])
def test_the_test_models_pass_the_self_check(which: str, own_cache: Path) -> None:
    from genlm_core.testing import models

    llm = load_hf(str(models.tiny_model(which)), kv_pool="required")
    try:
        assert llm.stats()["engine"]["kv_pool_check"] == "passed" and llm.engine.pool is not None
    finally:
        llm.close()
    [record] = json.loads((own_cache / "hf_pool_checks.json").read_text())
    assert record["result"] == "passed" and record["architecture"] in ("LlamaForCausalLM", "GPT2LMHeadModel")


def test_smollm2_passes_the_self_check(own_cache: Path) -> None:
    from genlm_core.testing import models

    llm = load_hf(str(models.smollm2()), kv_pool="required")
    try:
        assert llm.stats()["engine"]["kv_pool_check"] == "passed"
    finally:
        llm.close()


def test_a_broken_pool_fails_the_load_when_required(
    tiny_llama_path: str, own_cache: Path, broken_pool: None
) -> None:
    from genlm_hf.pool_check import PoolCheckFailed

    with pytest.raises(
        PoolCheckFailed, match=r"self-check failed \(a pass over the KV pool gave logits .* away"
    ):
        load_hf(tiny_llama_path, kv_pool="required")


def test_a_broken_pool_is_said_everywhere_under_auto(
    tiny_llama_path: str, own_cache: Path, broken_pool: None, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.WARNING, logger="genlm_hf"),
        pytest.warns(UserWarning, match="self-check failed"),
    ):
        llm = load_hf(tiny_llama_path, kv_pool="auto", cache_size=0)
    try:
        assert any("self-check failed" in r.getMessage() for r in caplog.records if r.name == "genlm_hf")
        stats = llm.stats()["engine"]
        assert stats["kv_pool_check"].startswith("failed: a pass over the KV pool gave logits")
        assert stats["kv_pool_off"] == stats["kv_pool_check"] and llm.engine.pool is None
        rng = random.Random(0)
        ctxs = [tuple(rng.randrange(3, llm.vocab_size) for _ in range(30)) for _ in range(3)]
        got = llm.batch_next_token_logprobs_sync(ctxs)  # the model's own forward: exact, slow
        assert_tiny_close(got, llm.rows.finalize(torch.stack(llm.engine.forward_uncached(ctxs))))
    finally:
        llm.close()
    # genlm doctor, in a process of its own (it imports no engine), reads the record
    out = subprocess.run(
        [sys.executable, "-m", "genlm_core.tools.cli", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "GENLM_CACHE_DIR": str(own_cache)},
    )
    section = json.loads(out.stdout)["sections"]["hf"]
    assert section["data"]["failed"] == 1
    assert any("self-check failed: a pass over the KV pool" in line for line in section["lines"])
