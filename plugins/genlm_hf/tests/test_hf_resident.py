"""Resident rows (genlm_hf.resident): ordinary calls whose contexts extend the call
before's by one token continue in place on the static decode step.

Each program below is run through the public API (``batch_next_token_logprobs_sync``, the
batcher splitting a step into calls of ``batch_size``) on a backend with the static path
on and on one with it off (the eager path, the oracle that shares no code with it past
the model), and every row of every step is compared with both that and the uncached
model (one full pass per context), at the bound derived from the arithmetic
(:mod:`genlm_core.testing.tolerance`). The programs have the shapes that matter: SIS
(every particle one token a step), SMC (resampling: two particles on one row fork), more
particles than ``batch_size`` (several calls a step), a new prompt joining mid-run, a
context several tokens past a live row, a context re-asked; the rows cross the 16- and
32-column buckets.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from genlm_hf.passes import pass_groups
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
    gauges = {"resident_rows", "resident_blocks", "static_bytes"}
    stats = {
        k: v - before.get(k, 0) if isinstance(v, int) and k not in gauges else v for k, v in after.items()
    }
    stats["calls"] = stats["forward_calls"]
    want = _drive(off, program)
    for step, (contexts, a, b) in enumerate(zip(program, got, want)):
        distinct = list(dict.fromkeys(contexts))
        ref = on._finalize(torch.stack(on.engine.forward_uncached(distinct)))
        assert_rows_close(a, b, shape, dtype=dtype, what=f"step {step}: resident vs eager")
        assert_rows_close(a, ref, shape, dtype=dtype, what=f"step {step}: resident vs uncached")
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
def test_sis_rows_continue_in_place(pair, n: int) -> None:
    on, off = pair
    program = _program(on.vocab_size, n, 26, seed=n)
    stats = _check(on, off, program)
    steps = len(program)
    assert stats["rows_resumed"] >= n * (steps - 2)  # every particle continued its row
    assert stats["static_moved"] == 0 and stats["resident_grown"] > 0  # rows crossed 16, 32 columns
    # one static step a call: the particles of a call share a block
    first = -(-n // 4)  # the first step's calls prefill the prompts (eager)
    assert stats["static_steps"] == stats["calls"] - first
    assert stats["resident_rows"] == n
    assert "rows_resumed" not in off.stats()["engine"]  # off: the eager path, untouched


@pytest.mark.parametrize("n", [4, 9])
def test_smc_resampled_particles_fork_rows(pair, n: int) -> None:
    on, off = pair
    program = _program(on.vocab_size, n, 24, seed=10 + n, resample=3, join=7, jump=11)
    stats = _check(on, off, program)
    assert stats["resident_joined"] > 0  # duplicates forked by a copy of their parent's row
    # rows of a call are gathered in one block: resampling does not multiply the steps
    assert stats["static_steps"] <= stats["calls"]


def test_bfloat16(tiny_llama_path: str) -> None:
    on = load_hf(tiny_llama_path, batch_size=4, static_decode="on", dtype="bfloat16", cache_size=0)
    off = load_hf(tiny_llama_path, batch_size=4, static_decode="off", dtype="bfloat16", cache_size=0)
    try:
        stats = _check(on, off, _program(on.vocab_size, 6, 16, seed=4, resample=4), "bfloat16")
        assert stats["static_steps"] > 0
    finally:
        on.close()
        off.close()


def test_no_room_runs_eagerly(tiny_llama_path: str) -> None:
    on = load_hf(tiny_llama_path, batch_size=4, static_decode="on", static_decode_bytes=0, cache_size=0)
    off = load_hf(tiny_llama_path, batch_size=4, static_decode="off", cache_size=0)
    try:
        stats = _check(on, off, _program(on.vocab_size, 5, 8, seed=5, resample=3))
        assert stats["static_steps"] == 0 and stats["resident_rows"] == 0
        assert stats["resident_eager"] > 0 and on.engine.static.nbytes == 0
        assert on.stats()["prefix_cache"]["hits"] > 0  # every row's KV went to the prefix cache
    finally:
        on.close()
        off.close()


@pytest.mark.parametrize("room", [0, 1])
def test_one_token_contexts_without_a_row(tiny_llama_path: str, room: int) -> None:
    """A one-token context has no prefix to copy (it would join a row with nothing in it);
    with no row to take (no buffers at all, or one row that a live context holds) it runs
    on the eager path from nothing."""
    bound = room * 16 * column_bytes(tiny_llama_path)
    on = load_hf(tiny_llama_path, batch_size=2, static_decode="on", cache_size=0, static_decode_bytes=bound)
    try:
        shape = model_shape(on)
        program = [[(5,), (9, 4, 7)], [(5, 11), (9, 4, 7, 3), (6,)], [(5, 11, 2), (8,), (6, 1)]]
        for step, contexts in enumerate(program):
            got = on.batch_next_token_logprobs_sync(contexts)
            ref = on._finalize(torch.stack(on.engine.forward_uncached(contexts)))
            assert_rows_close(got, ref, shape, what=f"step {step}")
        assert on.stats()["engine"]["resident_eager"] > 0
    finally:
        on.close()


def test_a_burst_takes_the_buffers_and_calls_resume_after(tiny_llama_path: str) -> None:
    on = load_hf(tiny_llama_path, batch_size=4, static_decode="on", cache_size=0)
    try:
        shape = model_shape(on)
        program = _program(on.vocab_size, 3, 6, seed=6)
        _drive(on, program)
        engine = on.engine
        assert engine.resident.blocks
        rows = {h: c for h, c in enumerate(program[-1])}
        got = on._finalize(engine.decode_step(rows, ()))
        assert not engine.resident.blocks  # flushed: the burst's batches need the buffers
        ref = on._finalize(torch.stack(engine.forward_uncached(list(rows.values()))))
        assert_rows_close(got, ref, shape, what="burst step after resident calls")
        engine.end_burst(list(rows))
        nxt = [c + (7,) for c in program[-1]]
        got = on.batch_next_token_logprobs_sync(nxt)
        ref = on._finalize(torch.stack(engine.forward_uncached(nxt)))
        assert_rows_close(got, ref, shape, what="a call after the burst")
        on.clear_cache()
        # no row left, every slot back in the pool (which clear_cache keeps, with its graphs)
        assert not engine.resident.blocks and engine.static._busy_bytes == 0
    finally:
        on.close()


def test_a_failed_step_leaves_no_row_behind(tiny_llama_path: str, monkeypatch) -> None:
    from genlm_hf import static

    on = load_hf(tiny_llama_path, batch_size=4, static_decode="on", cache_size=0)
    try:
        shape = model_shape(on)
        program = _program(on.vocab_size, 4, 5, seed=8)
        _drive(on, program[:3])
        real = static.StaticSlot.run

        def broken(self, *a, **k):
            raise RuntimeError("injected: the device failed mid-step")

        monkeypatch.setattr(static.StaticSlot, "run", broken)
        with pytest.raises(RuntimeError, match="injected"):
            on.batch_next_token_logprobs_sync(program[3])
        assert not on.engine.resident.blocks and len(on.engine.resident) == 0
        monkeypatch.setattr(static.StaticSlot, "run", real)
        for contexts in program[3:]:  # the same program goes on, from the eager path
            got = on.batch_next_token_logprobs_sync(contexts)
            ref = on._finalize(torch.stack(on.engine.forward_uncached(contexts)))
            assert_rows_close(got, ref, shape, what="after a failed step")
    finally:
        on.close()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_resident_captured_on_cuda(tiny_llama_path: str, dtype: str) -> None:  # pragma: no cover - GPU
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
        assert stats["resident_joined"] > 0 and stats["static_steps"] <= stats["calls"]
        assert stats["static_capture_failed"] == 0 and on.engine.static.graph  # no silent eager fallback
    finally:
        on.close()
        off.close()


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_random_programs_under_a_tight_bound(
    tiny_llama_path: str, seed: int, split: bool, monkeypatch
) -> None:
    """Random programs (particles, resampling, joins, jumps, re-asks, calls of 3) with
    buffers for about two small blocks: rows are evicted while others fork from them,
    joins find no row and run eagerly, blocks grow and move; every row still equals the
    eager path's and the uncached model's. ``split``: every call's eager contexts run in a
    pass per suffix length (no cost to a pass), so a pass reads prefixes from rows that
    placement evicted and that an earlier pass's contexts were copied into."""
    g = torch.Generator().manual_seed(100 + seed)
    per_column = column_bytes(tiny_llama_path)
    on = load_hf(
        tiny_llama_path,
        batch_size=3,
        static_decode="on",
        cache_size=0,
        static_decode_bytes=2 * 4 * 32 * per_column,
    )
    passes: list[int] = []  # the eager passes of each call that ran some
    if split:
        from genlm_hf import resident

        def counted(suffixes, pass_cost):
            groups = pass_groups(suffixes, pass_cost)
            passes.append(len(groups))
            return groups

        monkeypatch.setattr(resident, "pass_groups", counted)
        on.engine.resident.pass_cost = 0
    off = load_hf(tiny_llama_path, batch_size=3, static_decode="off", cache_size=0)
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
        if split:  # some call ran its eager contexts in more than one pass
            assert max(passes) > 1 and stats["resident_eager_passes"] == sum(passes)
        assert (
            on.engine.static.nbytes <= on.engine.static.max_bytes
            or stats["static_moved"] + stats["resident_grown"] > 0
        )
    finally:
        on.close()
        off.close()


def test_a_capture_that_fails_falls_back(tiny_llama_path: str, caplog) -> None:
    """A capture the model cannot take (here: asked for on the CPU, where torch.cuda
    fails) turns graphs off and the call's rows are still right under "auto"; "on" raises
    and leaves no row behind."""
    on = load_hf(tiny_llama_path, batch_size=4, static_decode="on", cache_size=0)
    off = load_hf(tiny_llama_path, batch_size=4, static_decode="off", cache_size=0)
    try:
        static = on.engine.static
        static.graph = True  # the slots it makes try to capture their step
        program = _program(on.vocab_size, 5, 8, seed=13, resample=3)
        with pytest.raises(Exception):  # noqa: B017 - whatever torch.cuda raises without CUDA
            _drive(on, program)
        assert not on.engine.resident.blocks
        static.strict = False  # "auto"
        with caplog.at_level("WARNING", logger="genlm"):
            stats = _check(on, off, program)
        assert not static.graph and stats["static_captured"] == 0 and stats["static_steps"] > 0
        # the slow path is not silent: a warning every user sees, and a counter in stats
        assert stats["static_capture_failed"] == 1
        assert any(
            "could not be captured" in r.getMessage() for r in caplog.records if r.levelname == "WARNING"
        )
    finally:
        on.close()
        off.close()
