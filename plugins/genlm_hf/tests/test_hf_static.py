"""The static decode step (genlm_hf.static): a burst's kept batches on static KV buffers
of fixed buckets, checked against the eager decode path (static_decode="off") and the
uncached model, at the bounds derived from the arithmetic (genlm_core.testing.tolerance).

Every step of a scripted burst (rows of different lengths, several batch sizes with
padded batch buckets, rows crossing length buckets, a resampled row, a row added
mid-burst) is compared row by row. bfloat16: both sides computed in bfloat16, so the
bound is ``row_atol(shape, magnitude, "bfloat16")`` (two bfloat16 paths, unit roundoff
2^-8 for the stored values, float32 accumulation).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from genlm_hf.static import MIN_COLUMNS, batch_bucket, column_bucket
from hf_helpers import column_bytes, load_hf

from genlm_core.testing.tolerance import assert_rows_close, model_shape


def _script(vocab: int, n: int, steps: int, seed: int) -> list[dict[int, tuple[int, ...]]]:
    """The rows of each step of a burst of ``n`` rows: prompts of 3 to 12 tokens, one
    random token a step; at step 4 row 0 is resampled from the last row's context, at
    step 6 a row with a new prompt joins."""
    g = torch.Generator().manual_seed(seed)

    def toks(k: int) -> tuple[int, ...]:
        return tuple(torch.randint(3, vocab, (k,), generator=g).tolist())

    rows = {i: toks(3 + (i * 5) % 10) for i in range(n)}
    out = [dict(rows)]
    for step in range(1, steps):
        if step == 4 and n > 1:
            rows[0] = rows[n - 1]  # resampled: row 0 continues the last row's particle
        rows = {i: c + toks(1) for i, c in rows.items()}
        if step == 6:
            rows[n] = toks(5)
        out.append(dict(rows))
    return out


def _run(llm: Any, script: list[dict[int, tuple[int, ...]]]) -> list[torch.Tensor]:
    llm.clear_cache()
    engine = llm.engine
    # the engine's logits, normalised as the core normalises a decode step's
    outs = [llm._finalize(engine.decode_step(rows, ())).clone() for rows in script]
    engine.end_burst(list(script[-1]))
    return outs


def _check(llm: Any, eager: Any, script: list[dict], dtype: str) -> dict:
    shape = model_shape(llm)
    got = _run(llm, script)
    stats = dict(llm.stats()["engine"])
    want = _run(eager, script)
    for step, (rows, a, b) in enumerate(zip(script, got, want)):
        ref = llm._finalize(torch.stack(llm.engine.forward_uncached(list(rows.values()))))
        assert_rows_close(a, b, shape, dtype=dtype, what=f"step {step}: static vs eager decode")
        assert_rows_close(a, ref, shape, dtype=dtype, what=f"step {step}: static vs uncached")
    return stats


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def pair(request: pytest.FixtureRequest) -> Any:
    from genlm_core.testing import models

    path = str(models.tiny_model(request.param))
    on = load_hf(path, batch_size=4, static_decode="on")
    off = load_hf(path, batch_size=4, static_decode="off")
    yield on, off
    on.close()
    off.close()


@pytest.mark.parametrize("n", [1, 3, 6])
def test_static_steps_equal_eager_and_uncached(pair, n: int) -> None:
    on, off = pair
    # 30 steps from prompts of up to 12 tokens: the rows cross the 16- and 32-column buckets
    stats = _check(on, off, _script(on.vocab_size, n, 30, seed=n), "float32")
    assert stats["static_steps"] > 0 and stats["static_joined"] > 0
    assert stats["static_moved"] > 0  # a batch crossed a length bucket
    assert stats["static_refused"] == 0
    assert "static_steps" not in off.stats()["engine"]  # off: the eager path, untouched


def test_static_bfloat16(tiny_llama_path: str) -> None:
    on = load_hf(tiny_llama_path, batch_size=4, static_decode="on", dtype="bfloat16")
    off = load_hf(tiny_llama_path, batch_size=4, static_decode="off", dtype="bfloat16")
    try:
        assert on.dtype == "bfloat16"
        stats = _check(on, off, _script(on.vocab_size, 5, 20, seed=7), "bfloat16")
        assert stats["static_steps"] > 0
    finally:
        on.close()
        off.close()


def test_memory_bound_leaves_batches_on_the_eager_path(tiny_llama_path: str) -> None:
    none = load_hf(tiny_llama_path, batch_size=4, static_decode="on", static_decode_bytes=0)
    off = load_hf(tiny_llama_path, batch_size=4, static_decode="off")
    try:
        stats = _check(none, off, _script(none.vocab_size, 3, 8, seed=3), "float32")
        assert stats["static_steps"] == 0 and stats["static_refused"] > 0 and stats["static_bytes"] == 0
    finally:
        none.close()
        off.close()


def test_free_buckets_are_dropped_within_the_bound(tiny_llama_path: str) -> None:
    llm = load_hf(tiny_llama_path, batch_size=4, static_decode="on")
    try:
        static = llm.engine.static
        per_column = column_bytes(tiny_llama_path)
        static.max_bytes = 4 * 32 * per_column  # one 4 x 32 bucket, or two 4 x 16 ones
        # 4 rows, then 5 (a batch of 4 and one of 1), crossing 16 and 32 columns: moves pass
        # the bound mid-burst, and what is pooled once the burst ends is within it
        _run(llm, _script(llm.vocab_size, 4, 25, seed=5))
        assert 0 < static.nbytes <= static.max_bytes
        assert llm.stats()["engine"]["static_moved"] > 0
        pooled = static.nbytes
        llm.clear_cache()
        assert static.nbytes == pooled  # the pool (and its graphs) outlives the cleared caches
    finally:
        llm.close()


def test_clear_cache_keeps_the_pooled_slots(tiny_llama_path: str) -> None:
    """A program that clears its caches between runs finds its buckets' slots (on CUDA,
    their captured graphs) again; the stale columns of a reused slot change no row."""
    llm = load_hf(tiny_llama_path, batch_size=4, static_decode="on")
    off = load_hf(tiny_llama_path, batch_size=4, static_decode="off")
    try:
        static = llm.engine.static
        _run(llm, _script(llm.vocab_size, 4, 25, seed=21))  # long rows: stale KV in every column
        pooled = {id(s) for s in static._free.values()}
        assert pooled
        # shorter rows, other tokens: each reused column past a row's length holds another
        # run's KV, and every step is compared with the eager path and the uncached model
        _check(llm, off, _script(llm.vocab_size, 4, 10, seed=22), "float32")
        assert {id(s) for s in static._free.values()} >= pooled  # the same slots, reused
    finally:
        llm.close()
        off.close()


def test_a_capture_that_fails_falls_back_unless_on(tiny_llama_path: str) -> None:
    """ "auto" on a model the capture cannot take runs the static step without graphs (here:
    a capture asked for on the CPU, where torch.cuda fails); "on" raises."""
    llm = load_hf(tiny_llama_path, batch_size=4, static_decode="on")
    off = load_hf(tiny_llama_path, batch_size=4, static_decode="off")
    try:
        static = llm.engine.static
        static.graph = True  # the slots it makes try to capture their step
        script = _script(llm.vocab_size, 3, 6, seed=2)
        with pytest.raises(Exception):  # noqa: B017 - whatever torch.cuda raises without CUDA
            _run(llm, script)
        static.strict = False  # "auto"
        stats = _check(llm, off, script, "float32")
        assert not static.graph and stats["static_captured"] == 0 and stats["static_steps"] > 0
        assert stats["static_capture_failed"] == 1  # counted (and warned), once
    finally:
        llm.close()
        off.close()


def test_buckets() -> None:
    assert [batch_bucket(n, 64) for n in (1, 2, 3, 5, 33, 64)] == [1, 2, 4, 8, 64, 64]
    assert batch_bucket(5, 6) == 6 and batch_bucket(7, 4) == 7  # at most batch_size, never below the rows
    assert column_bucket(1, 256) == MIN_COLUMNS
    assert [column_bucket(n, 256) for n in (17, 33, 200, 256)] == [32, 64, 256, 256]
    assert column_bucket(257, 256) is None and column_bucket(300, None) == 512


def test_the_default_bound() -> None:
    from genlm_hf.static_setup import DEFAULT_BYTES, static_bytes

    assert static_bytes(12345, torch.device("cpu")) == 12345
    assert static_bytes(0, torch.device("cpu")) == 0
    assert static_bytes(None, torch.device("cpu")) == DEFAULT_BYTES == 2**30


def test_static_decode_option_is_checked() -> None:
    import genlm_core

    with pytest.raises(ValueError, match="static_decode"):
        genlm_core.backend_config("hf", static_decode="yes")
    with pytest.raises(ValueError, match="static_decode_bytes"):
        genlm_core.backend_config("hf", static_decode_bytes=-1)


def test_auto_is_off_on_the_cpu(tiny_llama_path: str) -> None:
    llm = load_hf(tiny_llama_path)
    try:
        assert llm.engine.static is None  # does not pay on the CPU (docs/gpu.md)
    finally:
        llm.close()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_static_decode_captured_on_cuda(tiny_llama_path: str, dtype: str) -> None:  # pragma: no cover - GPU
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (the cuda marker deselects this test on such machines)")
    on = load_hf(tiny_llama_path, batch_size=4, device="cuda", dtype=dtype)  # auto: captured on CUDA
    off = load_hf(tiny_llama_path, batch_size=4, device="cuda", dtype=dtype, static_decode="off")
    try:
        assert on.engine.static.max_bytes >= 2**30  # a quarter of the free memory at load, >= 1 GiB
        stats = _check(on, off, _script(on.vocab_size, 6, 30, seed=11), dtype)
        assert stats["static_captured"] > 0 and stats["static_steps"] > stats["static_captured"]
        assert stats["static_moved"] > 0 and stats["static_capture_failed"] == 0  # moved slots captured too
        # the same shapes again after clear_cache: the pooled graphs replay, none is captured
        again = _check(on, off, _script(on.vocab_size, 6, 30, seed=12), dtype)
        assert again["static_captured"] == stats["static_captured"] and again["static_capture_failed"] == 0
    finally:
        on.close()
        off.close()
