"""The decode step (genlm_hf.step): calls whose every row runs one new token, in a fixed
shape per bucket over the KV pool (captured as a CUDA graph on CUDA; run as is on the CPU).

Each program below is run through the public API (``batch_next_token_logprobs_sync``, the
batcher splitting a step into calls of ``batch_size``) on a backend with the step on and
on one with it off (the eager pass over the same pool), and every row of every step is
compared with both that and the uncached model (one full pass per context), at the bound
derived from the arithmetic (:mod:`genlm_core.testing.tolerance`). The programs have the
shapes that matter: SIS (every particle one token a step), SMC (resampling: two
particles on one context fork its pages), more particles than ``batch_size`` (several
calls a step), a new prompt joining mid-run, a context several tokens past a kept one, a
context re-asked, a prompt long enough to be read as a shared span; the rows cross the
16- and 32-column buckets.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from genlm_hf import step as step_module
from genlm_hf.step import MAX_BUCKETS, MIN_WIDTH, bucket_size
from hf_helpers import column_bytes, load_hf

from genlm_core.testing.tolerance import assert_rows_close, model_shape

Context = tuple[int, ...]


def _program(
    vocab: int, n: int, steps: int, seed: int, resample: int = 0, join: int = -1, jump: int = -1
) -> list[list[Context]]:
    """The particles' contexts, step by step: ``n`` prompts of 3 to 12 tokens, one random
    token a step; every ``resample`` steps the particles are redrawn from themselves
    (duplicates fork), at step ``join`` a particle with a new prompt joins, at step
    ``jump`` particle 0 takes three tokens at once and particle 1 re-asks its context."""
    g = torch.Generator().manual_seed(seed)

    def toks(k: int) -> Context:
        return tuple(torch.randint(3, vocab, (k,), generator=g).tolist())

    parts = [toks(3 + (i * 5) % 10) for i in range(n)]
    out = [list(parts)]
    for step in range(1, steps):
        if resample and step % resample == 0:
            pick = torch.randint(0, len(parts), (len(parts),), generator=g).tolist()
            parts = [parts[k] for k in pick]
        parts = [p + toks(1) for p in parts]
        if step == join:
            parts.append(toks(5))
        if step == jump and len(parts) > 1:
            parts[0] = parts[0] + toks(2)
            parts[1] = out[-1][1]  # the context it had a step ago
        out.append(list(parts))
    return out


def _drive(llm: Any, program: list[list[Context]]) -> list[torch.Tensor]:
    llm.clear_cache()
    outs = []
    for contexts in program:
        distinct = list(dict.fromkeys(contexts))
        outs.append(llm.batch_next_token_logprobs_sync(distinct))
    return outs


def _check(on: Any, off: Any, program: list[list[Context]], dtype: str = "float32") -> dict[str, Any]:
    shape = model_shape(on)
    before = dict(on.stats()["engine"])
    got = _drive(on, program)
    after = on.stats()["engine"]
    # this program's counts (the backends serve several tests); gauges as they are now
    gauges = {
        "static_buckets",
        "kv_pool_pages",
        "kv_pool_pages_in_use",
        "kv_pool_bytes",
        "kv_pool_bytes_in_use",
    }
    stats = {
        k: v - before.get(k, 0) if isinstance(v, int) and k not in gauges else v for k, v in after.items()
    }
    stats["calls"] = stats["forward_calls"]
    want = _drive(off, program)
    for step, (contexts, a, b) in enumerate(zip(program, got, want)):
        distinct = list(dict.fromkeys(contexts))
        ref = on.rows.finalize(torch.stack(on.engine.forward_uncached(distinct)))
        assert_rows_close(a, b, shape, dtype=dtype, what=f"step {step}: decode step vs eager pass")
        assert_rows_close(a, ref, shape, dtype=dtype, what=f"step {step}: decode step vs uncached")
    return stats


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def pair(request: pytest.FixtureRequest) -> Any:
    from genlm_core.testing import models

    path = str(models.tiny_model(request.param))
    # no output cache: every step's rows come from the engine
    on = load_hf(path, batch_size=4, static_decode="on", cache_size=0)
    off = load_hf(path, batch_size=4, static_decode="off", cache_size=0)
    yield on, off
    on.close()
    off.close()


@pytest.mark.parametrize("n", [1, 4, 9])
def test_sis_steps(pair, n: int) -> None:
    on, off = pair
    program = _program(on.vocab_size, n, 26, seed=n)
    stats = _check(on, off, program)
    # one decode step a call after the first step's calls (prompts: eager passes)
    first = -(-n // 4)
    assert stats["static_steps"] == stats["calls"] - first and stats["static_declined"] == 0
    assert stats["pool_passes"] == stats["calls"]
    # every particle's step computed one token and read its past from the pool
    assert stats["tokens_computed"] == sum(len(p) for p in program[0]) + n * (len(program) - 1)
    assert "static_steps" not in off.stats()["engine"]  # off: the eager pass only


@pytest.mark.parametrize("n", [4, 9])
def test_smc_resampled_particles_fork_pages(pair, n: int) -> None:
    on, off = pair
    program = _program(on.vocab_size, n, 24, seed=10 + n, resample=3, join=7, jump=11)
    stats = _check(on, off, program)
    assert stats["static_steps"] > 0
    assert stats["kv_pool_copied_columns"] > 0  # duplicates wrote their own last page


def test_a_shared_prompt_is_one_span(pair) -> None:
    """Particles of one 70-token prompt, each with a first token of its own: the prompt is
    computed and held once, and every step reads its 64 columns of full pages once for all
    of them (a span), each particle's own columns per row."""
    on, off = pair
    g = torch.Generator().manual_seed(21)
    prompt = tuple(torch.randint(3, on.vocab_size, (70,), generator=g).tolist())
    parts = [prompt + (int(t),) for t in torch.randint(3, on.vocab_size, (4,), generator=g)]
    program = [parts]
    for _ in range(6):
        parts = [p + (int(torch.randint(3, on.vocab_size, (1,), generator=g)),) for p in parts]
        program.append(list(parts))
    stats = _check(on, off, program)
    # the first call computes the prompt they share once (genlm_core.engine.call_plan), then every
    # call is one step: the prompt's 64 columns of full pages read once for the 4 rows
    assert stats["tokens_computed"] == 70 + 4 * 7 and stats["static_steps"] == 7
    assert stats["span_rows"] == 4 * 7 and stats["span_columns"] == 64 * 7
    private = sum(len(p) - 64 for step in program for p in step)
    assert stats["private_columns"] == 70 + private  # + the prompt's own pass


def test_bfloat16(tiny_llama_path: str) -> None:
    on = load_hf(tiny_llama_path, batch_size=4, static_decode="on", dtype="bfloat16", cache_size=0)
    off = load_hf(tiny_llama_path, batch_size=4, static_decode="off", dtype="bfloat16", cache_size=0)
    try:
        stats = _check(on, off, _program(on.vocab_size, 6, 16, seed=4, resample=4), "bfloat16")
        assert stats["static_steps"] > 0
    finally:
        on.close()
        off.close()


@pytest.mark.parametrize("seed", range(4))
def test_random_programs_under_a_tight_pool(tiny_llama_path: str, seed: int) -> None:
    """Random programs (particles, resampling, joins, jumps, re-asks, calls of 3) with a
    pool of a few pages: kept contexts are released while others fork from them, calls
    run in halves; every row still equals the eager pass's and the uncached model's, and
    the pool never passes its bound."""
    g = torch.Generator().manual_seed(100 + seed)
    bound = 12 * 16 * column_bytes(tiny_llama_path)  # 12 pages of 16 columns
    on = load_hf(tiny_llama_path, batch_size=3, static_decode="on", cache_size=0, kv_cache_bytes=bound)
    off = load_hf(tiny_llama_path, batch_size=3, static_decode="off", cache_size=0, kv_cache_bytes=bound)
    try:
        n = int(torch.randint(2, 9, (1,), generator=g))
        program = _program(
            on.vocab_size,
            n,
            22,
            seed=seed,
            resample=int(torch.randint(2, 5, (1,), generator=g)),
            join=int(torch.randint(3, 12, (1,), generator=g)),
            jump=int(torch.randint(3, 15, (1,), generator=g)),
        )
        stats = _check(on, off, program)
        assert stats["static_steps"] > 0
        assert on.engine.pool.nbytes <= bound and on.stats()["prefix_cache"]["kv_evictions"] > 0
    finally:
        on.close()
        off.close()


def test_a_failed_step_leaves_the_pool_whole(tiny_llama_path: str, monkeypatch) -> None:
    """A step that fails mid-call (the device, say) raises to its callers; the call's new
    columns go back to the pool (only what the prefix cache keeps stays), and the same
    program goes on right."""
    on = load_hf(tiny_llama_path, batch_size=4, static_decode="on", cache_size=0)
    try:
        shape = model_shape(on)
        program = _program(on.vocab_size, 4, 6, seed=8)
        _drive(on, program[:3])
        kept = on.engine.pool.pages_in_use
        real = step_module.StepBucket.run

        def broken(self):
            raise RuntimeError("injected: the device failed mid-step")

        monkeypatch.setattr(step_module.StepBucket, "run", broken)
        with pytest.raises(RuntimeError, match="injected"):
            on.batch_next_token_logprobs_sync(program[3])
        assert on.engine.pool.pages_in_use == kept  # no page of the failed call is held
        monkeypatch.setattr(step_module.StepBucket, "run", real)
        for contexts in program[3:]:
            got = on.batch_next_token_logprobs_sync(contexts)
            ref = on.rows.finalize(torch.stack(on.engine.forward_uncached(contexts)))
            assert_rows_close(got, ref, shape, what="after a failed step")
    finally:
        on.close()


def test_a_capture_that_fails_falls_back(tiny_llama_path: str, caplog) -> None:
    """A capture the model cannot take (here: asked for on the CPU, where torch.cuda
    fails) turns graphs off and the call's rows are still right under "auto"; "on" raises."""
    on = load_hf(tiny_llama_path, batch_size=4, static_decode="on", cache_size=0)
    off = load_hf(tiny_llama_path, batch_size=4, static_decode="off", cache_size=0)
    try:
        step = on.engine.step
        step.graph = True  # the buckets it makes try to capture their step
        program = _program(on.vocab_size, 5, 8, seed=13, resample=3)
        with pytest.raises(Exception):  # noqa: B017 - whatever torch.cuda raises without CUDA
            _drive(on, program)
        step.strict = False  # "auto"
        step.buckets.clear()
        with caplog.at_level("WARNING", logger="genlm"):
            stats = _check(on, off, program)
        assert not step.graph and stats["static_captured"] == 0 and stats["static_steps"] > 0
        # the slow path is not silent: a warning every user sees, and a counter in stats
        assert stats["static_capture_failed"] == 1
        assert any(
            "could not be captured" in r.getMessage() for r in caplog.records if r.levelname == "WARNING"
        )
    finally:
        on.close()
        off.close()


def test_a_graph_is_captured_again_when_the_pool_moves(tiny_llama_path: str, monkeypatch) -> None:
    """A graph reads the pool's tensor where it was at capture: once the pool grows (a new
    tensor), the bucket captures again. Oracle: a stand-in graph that counts captures and
    replays the step uncaptured."""
    on = load_hf(tiny_llama_path, batch_size=4, static_decode="on", cache_size=0)
    try:
        captures = []

        class Replay:
            def __init__(self, bucket):
                self.bucket = bucket

            def replay(self):
                self.bucket.out = self.bucket.step()

        def capture(self):
            captures.append(self.pool.grown)
            self.graph, self.captured_at = Replay(self), self.pool.grown
            self.graph.replay()

        monkeypatch.setattr(step_module.StepBucket, "capture", capture)
        step = on.engine.step
        step.graph = True
        shape = model_shape(on)
        program = _program(on.vocab_size, 4, 20, seed=3)
        for i, contexts in enumerate(program):
            if i == 10:
                # the pool moves to a new tensor (on a GPU it grows so; on the CPU it reserves
                # its bound at once, so the test grows it past the bound)
                assert on.engine.pool._grow(past_bound=True)
            got = on.batch_next_token_logprobs_sync(contexts)
            ref = on.rows.finalize(torch.stack(on.engine.forward_uncached(contexts)))
            assert_rows_close(got, ref, shape, what=f"step {i}, replayed")
        # each bucket in use was captured over the first tensor, and again over the second
        assert captures.count(0) >= 1 and captures.count(1) >= 1 and set(captures) == {0, 1}
    finally:
        on.close()


def test_buckets() -> None:
    assert [bucket_size(n) for n in (1, 2, 3, 5, 9)] == [1, 2, 4, 8, 16]
    assert bucket_size(3, MIN_WIDTH) == MIN_WIDTH and bucket_size(17, MIN_WIDTH) == 32
    assert MAX_BUCKETS >= 8


def test_auto_is_off_on_the_cpu(tiny_llama_path: str) -> None:
    llm = load_hf(tiny_llama_path)
    try:
        assert llm.engine.step is None and "static_steps" not in llm.stats()["engine"]
    finally:
        llm.close()


def test_static_decode_option_is_checked() -> None:
    from genlm_hf.config import HFConfig

    with pytest.raises(ValueError, match="static_decode"):
        HFConfig(static_decode="sometimes")
    with pytest.warns(DeprecationWarning, match="static_decode_bytes is deprecated"):
        HFConfig(static_decode_bytes=1 << 20)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_steps_captured_on_cuda(tiny_llama_path: str, dtype: str) -> None:  # pragma: no cover - GPU
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (the cuda marker deselects this test on such machines)")
    # auto: on, captured, on CUDA
    on = load_hf(tiny_llama_path, batch_size=4, device="cuda", dtype=dtype, cache_size=0)
    off = load_hf(
        tiny_llama_path, batch_size=4, device="cuda", dtype=dtype, static_decode="off", cache_size=0
    )
    try:
        program = _program(on.vocab_size, 9, 26, seed=12, resample=3, join=7, jump=11)
        stats = _check(on, off, program, dtype)
        assert stats["static_captured"] > 0 and stats["static_steps"] > stats["static_captured"]
        assert stats["static_capture_failed"] == 0 and on.engine.step.graph  # no silent eager fallback
    finally:
        on.close()
        off.close()
