"""``benchmarks/host_account.py`` (``bench_hf_step --host-account``): the host's part of a
step split by the backend's stages, measured by timers it wraps around them for a few
steps. It changes a live backend for those steps, so the checks: every attribute it
replaced is the backend's own again and the backend's rows still equal the uncached
model's (the derived bound); its stages nest as the calls do (per step a stage's time is
within its caller's, so their medians are ordered too); its copy probe copies.

Real engine: genlm-hf on the tiny Llama, the resident rows' static step on the CPU, its
batches run inline and in the batcher's worker thread (as on a GPU).
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import genlm_core
from genlm_core.engine.backend import rows as rows_mod
from genlm_core.engine.backend.context_checks import ContextChecks
from genlm_core.testing.models import tiny_llama
from genlm_core.testing.tolerance import assert_backend_close

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _host_account() -> Any:
    spec = importlib.util.spec_from_file_location("host_account", BENCH / "host_account.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("host_account", module)
    spec.loader.exec_module(module)
    return module


ROWS = 6


def _attributes(llm: Any) -> dict[str, Any]:
    """What the account replaces, as found (instance attributes by their presence)."""
    cache = llm.output_cache
    return {
        "backend": set(vars(llm)),
        "context_checks": set(vars(llm.context_checks)),
        "rows": set(vars(llm.rows)),
        "batch_fn": llm.batcher.batch_fn,
        "engine": set(vars(llm.engine)),
        "step": set(vars(llm.engine.step)),
        "cache": set(vars(cache)),
        "private_copies": rows_mod.private_copies,
    }


@pytest.fixture(params=[False, True], ids=["inline", "worker-thread"])
def llm(request: Any) -> Any:
    # a GPU engine's batches run in the batcher's worker thread: the account times and
    # counts them there too (a dispatch mode is per thread)
    backend = genlm_core.load(
        "hf", model=str(tiny_llama()), static_decode="on", batch_size=8, forward_thread=request.param
    )
    yield backend
    backend.close()


def test_the_account_measures_nested_stages_and_leaves_the_backend_as_it_was(llm: Any) -> None:
    ha = _host_account()
    gen = torch.Generator().manual_seed(3)
    ctxs = [tuple(torch.randint(5, llm.vocab_size - 5, (6,), generator=gen).tolist()) for _ in range(ROWS)]
    loop = asyncio.new_event_loop()
    state = {"ctxs": ctxs, "tok": 40}

    def step() -> list[Any]:
        state["tok"] += 1
        state["ctxs"] = [c + (state["tok"],) for c in state["ctxs"]]

        async def calls() -> list[Any]:
            return await asyncio.gather(*(llm.next_token_logprobs(c) for c in state["ctxs"]))

        return loop.run_until_complete(calls())

    try:
        step()  # the rows' KV kept, as the benchmark's warmup leaves it
        before = _attributes(llm)
        out = ha.account(llm, step, ROWS, steps=4)
        assert _attributes(llm) == before
        assert type(llm.context_checks).validate is ContextChecks.validate
        # a stage's time lies within its caller's, step by step, so their medians too
        assert out["host_model_step_ms"] <= out["host_forward_ms"] <= out["host_batch_ms"]
        assert out["host_batch_ms"] <= out["host_step_ms"]
        assert out["host_row_copies_ms"] <= out["host_normalise_ms"] <= out["host_batch_ms"]
        assert out["host_validate_ms"] > 0 and out["host_cache_ms"] > 0
        assert out["host_device_wait_ms"] == 0.0  # no device on the CPU
        # one batch a step: before it and after it make up the step less the batch
        assert out["host_before_batch_ms"] <= out["host_outside_batch_ms"]
        assert out["host_after_batch_ms"] <= out["host_outside_batch_ms"]
        assert out["host_outside_batch_ms"] == pytest.approx(
            out["host_per_row_us"] * ROWS / 1e3, rel=0.01, abs=1e-3
        )
        # each caller's row copied once a step at least: counted outside the decode step
        assert out["host_ops"] >= ROWS
        assert set(out["host_copy_probe_us"]) == {"private_copies", "clone_each", "foreach_mul"}
        # the backend computes as before: a further step's rows against the uncached model
        got = torch.stack(step())
        later = state["ctxs"]
        want = torch.stack([llm.next_token_logprobs_uncached(list(c)) for c in later])
        assert_backend_close(llm, got, want, "rows after the host account")
        assert llm.stats()["engine"]["static_steps"] > 0  # the steps ran as decode steps
    finally:
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.close()


def test_the_copy_probe_fails_on_a_copy_that_is_not_one() -> None:
    ha = _host_account()
    real = ha._copy_probe(torch.device("cpu"), 3, 50, runs=2)
    assert all(v > 0 for v in real.values())
    original = torch._foreach_mul
    try:
        torch._foreach_mul = lambda rows, s: list(rows)  # hands back the rows themselves
        with pytest.raises(AssertionError, match="foreach_mul"):
            ha._copy_probe(torch.device("cpu"), 3, 50, runs=2)
    finally:
        torch._foreach_mul = original
