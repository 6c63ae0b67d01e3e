"""Byte beam API: params, batching per step, context limits, generation, display."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

import genlm_core
from genlm_core.bytes import (
    EOS,
    BeamParams,
    ByteBeamState,
    ByteDistribution,
    EOSMode,
    StatefulTokenizedLM,
)
from genlm_core.bytes.dist import EOT_INDEX
from genlm_core.bytes.testing import BruteForce, TableBackend
from genlm_core.config import ConfigError

pytestmark = pytest.mark.numeric  # run again with the SIMD path capped (scripts/test.sh)

VOCAB = [b"a", b"b", b"aa", b"ab", b"ba", b"bb", b"aab", b"abb", b"bab", b"<e>", b"abab", b"ba"]
EOS_ID = 9


def table_llm(**kw) -> TableBackend:
    return TableBackend(VOCAB, eos_token_ids=[EOS_ID], **kw)


# ---------------------------------------------------------------------- params
def test_params_validation_and_aliases():
    assert BeamParams(K=None).K is None
    assert BeamParams().K == 5
    for bad in ({"K": 0}, {"prune_threshold": -0.1}, {"prune_threshold": 1.0}, {"heal_max_backoff": -1}):
        with pytest.raises(ValueError):
            BeamParams(**bad)
    p = BeamParams(eos_byte_strings=[b"<e>", "</s>"])
    assert p.eos_tokens == (b"<e>", b"</s>")
    q = BeamParams.build(eos_byte_strings=[b"<e>"], K=None)
    assert q.eos_tokens == (b"<e>",) and q.K is None
    with pytest.raises(ConfigError, match="prune_treshold"):
        BeamParams.build(prune_treshold=0.1)
    with pytest.raises(ConfigError, match="K"):
        BeamParams.build(K=0)
    assert BeamParams(prune_threshold=0.0).log_prune_threshold == -math.inf
    assert BeamParams(prune_threshold=0.5).log_prune_threshold == pytest.approx(math.log(0.5))
    assert "heal_max_splits" in BeamParams.schema_json()


def test_registry_names_the_beam():
    reg = genlm_core.resolve("beam", kind="byte_model")
    assert reg.load_target() is ByteBeamState


async def test_load_byte_model_builds_the_registered_beam_from_its_options():
    llm = table_llm()
    by_name = await genlm_core.load_byte_model(llm, "beam", K=3)
    direct = await ByteBeamState.initial(llm, BeamParams(K=3))  # the oracle: the class itself
    assert type(by_name) is ByteBeamState and by_name.params == direct.params
    a = await (await by_name.prefill(b"ab")).logp_next()
    b = await (await direct.prefill(b"ab")).logp_next()
    assert list(a.ps) == list(b.ps)
    with pytest.raises(ConfigError, match="Unknown option 'k' for 'beam'"):
        await genlm_core.load_byte_model(llm, "beam", k=3)
    with pytest.raises(genlm_core.UnknownImplementationError, match="beam"):
        await genlm_core.load_byte_model(llm, "beem")


# ---------------------------------------------------------------------- token context
def test_lm_context_is_immutable_and_limit_is_passed_on():
    lm = StatefulTokenizedLM(object(), [1, 2, 3], max_context_length=3)
    nxt = lm << 4
    assert lm.context == (1, 2, 3)  # not mutated (never truncated in place)
    assert nxt.context == (2, 3, 4) and nxt.max_context_length == 3
    assert (nxt << 5 << 6).context == (4, 5, 6)
    assert (nxt << 5 << 6).max_context_length == 3


async def test_max_context_length_reaches_every_extended_state():
    llm = table_llm()
    beam = await ByteBeamState.initial(llm, BeamParams(K=3, max_context_length=2))
    bm = await beam.prefill(b"abbabaab")
    assert bm.states
    for s in bm.states:
        assert s.lm.max_context_length == 2
        assert len(s.lm.context) <= 2
        for e in s.extend():
            assert len(e.lm.context) <= 2 and e.lm.max_context_length == 2


# ---------------------------------------------------------------------- batching
async def test_one_model_call_and_one_trie_call_per_step():
    llm = table_llm(seed=4)
    beam = await ByteBeamState.initial(llm, BeamParams(K=None))
    bm = await beam.prefill(b"ab")
    trie = bm.trie
    n_ext = len([e for s in bm.states for e in s.extend()])
    assert n_ext >= 2
    calls, rows, tb = llm.forward_calls, llm.forward_rows, trie.trie_batches
    nxt = await (bm << ord("a"))
    assert llm.forward_calls - calls == 1
    assert llm.forward_rows - rows == n_ext
    assert trie.trie_batches - tb == 1
    # logp_next's extensions are the ones << reuses: no new call
    calls = llm.forward_calls
    await nxt.logp_next()
    await (nxt << ord("b"))
    assert llm.forward_calls - calls == 1


async def test_concurrent_beams_share_the_batched_calls():
    llm = TableBackend(VOCAB, eos_token_ids=[EOS_ID], seed=7, timeout=0.01)
    params = BeamParams(K=None)
    beams = await asyncio.gather(*(ByteBeamState.initial(llm, params) for _ in range(3)))
    beams = [await b.prefill(x) for b, x in zip(beams, (b"ab", b"ba", b"bb"))]
    calls, tb = llm.forward_calls, beams[0].trie.trie_batches
    await ByteBeamState.advance_batch(beams, [ord("a")] * 3)
    assert llm.forward_calls - calls == 1
    assert beams[0].trie.trie_batches - tb == 1


# ---------------------------------------------------------------------- distribution
async def test_distribution_views():
    llm = table_llm(seed=2)
    beam = await ByteBeamState.initial(llm, BeamParams(K=None))
    q = await (await beam.prefill(b"ab")).logp_next()
    assert isinstance(q, ByteDistribution)
    assert q.total() == pytest.approx(1.0, abs=1e-9)  # float64 logsumexp of 258 entries: ~1e-15
    top = q.top(3)
    assert [k for k, _ in top][0] == q.argmax()
    assert top[0][1] >= top[1][1] >= top[2][1]
    text = q.pretty(3)
    assert "b'a'" in text and "prob" in text
    assert q[None] == -math.inf  # EOT summed out
    assert set(q.materialize()) <= {ord("a"), ord("b"), ord("<"), EOS}
    assert "ByteDistribution(" in repr(q)


async def test_bits_per_byte_is_exact_with_unbounded_beam():
    llm = table_llm(seed=1)
    beam = await ByteBeamState.initial(llm, BeamParams(K=None))
    bf = BruteForce(llm, beam.states[0].lm.context, with_eos=False)
    x = b"abbab"
    lp = await beam.log_prefix_prob(x)
    # the oracle renormalises rows as the beam does: float64 rounding only (~1e-13 here)
    assert lp == pytest.approx(math.log(bf.prefix(x)), abs=1e-10)
    assert await beam.bits_per_byte(x) == pytest.approx(-lp / (len(x) * math.log(2)))
    # conditional on bytes already read
    mid = await beam.prefill(b"ab")
    assert await mid.log_prefix_prob(b"bab") == pytest.approx(
        math.log(bf.prefix(x) / bf.prefix(b"ab")), abs=1e-10
    )


async def test_with_mode_round_trip():
    llm = table_llm(seed=3)
    beam = await ByteBeamState.initial(llm, BeamParams(K=None))
    bm = await (await (beam << ord("a")) << ord("b"))
    back = bm.with_mode(EOSMode.WITHOUT_EOS).with_mode(EOSMode.WITH_EOS)
    assert back.logZ == pytest.approx(bm.logZ, abs=1e-12)
    assert bm.with_mode("without_eos").mode is EOSMode.WITHOUT_EOS


# ---------------------------------------------------------------------- generation
EOS_TABLE = {
    (EOS_ID,): {0: 0.9, 1: 0.05, EOS_ID: 0.05},
    (EOS_ID, 0): {1: 0.9, 0: 0.05, EOS_ID: 0.05},
    (EOS_ID, 0, 1): {EOS_ID: 0.9, 0: 0.05, 1: 0.05},
}


async def test_greedy_stops_at_eos():
    llm = table_llm(table=EOS_TABLE)
    beam = await ByteBeamState.initial(llm, BeamParams(K=3))
    assert await beam.greedy(b"", 50) == b"ab"


async def test_sample_stops_at_eos_and_is_seeded():
    llm = table_llm(default={0: 0.3, 1: 0.3, EOS_ID: 0.4})
    beam = await ByteBeamState.initial(llm, BeamParams(K=3))
    outs = [await beam.sample(b"a", 500, seed=s) for s in range(5)]
    assert all(len(o) < 100 for o in outs)  # stopped at EOS long before 500 bytes
    assert all(o.startswith(b"a") and set(o) <= set(b"ab") for o in outs)
    assert await beam.sample(b"a", 500, seed=3) == outs[3]


async def test_sample_with_a_draw_of_ones_own():
    """``sample(..., draw=f)``: ``f`` picks each byte from the next byte's distribution;
    against the same choices made by hand (prune, logp_next, <<), stopping at EOS."""
    llm = table_llm(seed=4)
    beam = await ByteBeamState.initial(llm, BeamParams(K=3))

    def second(q):  # the second likeliest entry: no seeded draw makes it by chance
        order = np.argsort(-np.asarray(q.ps), kind="stable")
        return None if order[1] == EOT_INDEX else int(order[1])

    want, state = bytearray(b"ab"), await beam.prefill(b"ab")
    for _ in range(6):
        state = state.prune()
        b = second(await state.logp_next())
        if b is None or b == EOS:
            break
        state = await (state << b)
        want.append(b)
    assert await beam.sample(b"ab", 6, draw=second) == bytes(want)
    assert await beam.sample(b"ab", 6, draw=lambda q: None) == b"ab"  # None stops at once


async def test_generation_reads_the_context_once():
    data = b"abbab"
    llm1 = table_llm(seed=9)
    b1 = await ByteBeamState.initial(llm1, BeamParams(K=2))
    await b1.prefill(data)
    prefill_rows = llm1.forward_rows
    llm2 = table_llm(seed=9)
    b2 = await ByteBeamState.initial(llm2, BeamParams(K=2))
    out = await b2.greedy(data, 0)
    assert out == data
    assert llm2.forward_rows == prefill_rows
    out = await b2.greedy(data, 4)
    assert out[: len(data)] == data and len(out) <= len(data) + 4


async def test_bad_symbols_and_context_manager():
    llm = table_llm()
    async with await ByteBeamState.initial(llm, BeamParams(K=2)) as beam:
        with pytest.raises(ValueError):
            await (beam << 300)
        with pytest.raises(TypeError):
            await (beam << b"a")
        assert "logZ" in beam.pretty()
    assert np.isfinite(beam.logZ)


async def test_mock_backend_end_to_end():
    llm = genlm_core.load("mock")
    beam = await ByteBeamState.initial(llm, K=2)
    out = await beam.greedy(b"Hello", 10)
    assert out.startswith(b"Hello")
    q = await (await beam.prefill(b"the")).logp_next()
    assert q.total() == pytest.approx(1.0, abs=1e-6)


async def test_prefill_scores_fewer_contexts_but_keeps_the_same_beam():
    data = b"abbabbaababbbab"
    saved = 0
    for K in (1, 2, 3):
        llm1 = table_llm(seed=11)
        ref = (await ByteBeamState.initial(llm1, BeamParams(K=K))).with_mode(EOSMode.WITHOUT_EOS)
        for c in data:  # prefill's definition: one byte at a time
            ref = await (ref.prune() << c)
        ref = ref.with_mode(EOSMode.WITH_EOS)
        llm2 = table_llm(seed=11)
        # the floor alone (the lookahead trades extra rows for fewer passes: its own tests)
        got = await (await ByteBeamState.initial(llm2, BeamParams(K=K, lookahead=0))).prefill(data)
        assert got.logZ == pytest.approx(ref.logZ, abs=1e-12)
        assert [(s.lm.context, s.partial) for s in got] == [(s.lm.context, s.partial) for s in ref]
        assert llm2.forward_rows <= llm1.forward_rows
        saved += llm1.forward_rows - llm2.forward_rows
    assert saved > 0


# ---------------------------------------------------------------------- byte-string arguments, terminated beams
async def test_byte_string_arguments_take_bytes_only():
    """An int n must not be read as n NUL bytes (``bytes(n)``); str is not bytes
    either (genlm-bytes reads neither)."""
    llm = table_llm(seed=4)
    beam = await ByteBeamState.initial(llm, BeamParams(K=3))
    want = await beam.log_prefix_prob(b"ab")
    # the bytes-like types give the same answer as bytes
    assert await beam.log_prefix_prob(bytearray(b"ab")) == want
    assert await beam.log_prefix_prob(memoryview(b"ab")) == want
    assert (await beam.prefill(bytearray(b"ab"))).logZ == (await beam.prefill(b"ab")).logZ
    calls = {
        "prefill": lambda x: beam.prefill(x),
        "log_prefix_prob": lambda x: beam.log_prefix_prob(x),
        "bits_per_byte": lambda x: beam.bits_per_byte(x),
        "greedy": lambda x: beam.greedy(x, 2),
        "sample": lambda x: beam.sample(x, 2, seed=0),
    }
    for name, call in calls.items():
        arg = "context" if name in ("greedy", "sample") else "bs"
        with pytest.raises(TypeError, match=rf"{arg} must be bytes, got int 3.*bytes\(\[3\]\)"):
            await call(3)
        with pytest.raises(TypeError, match=rf"{arg} must be bytes, got str 'ab'.*encode"):
            await call("ab")
        with pytest.raises(TypeError, match=rf"{arg} must be bytes.*got list"):
            await call([97, 98])
        with pytest.raises(TypeError, match=rf"{arg} must be bytes.*got bool"):
            await call(True)


async def test_terminated_beam_refuses_to_step():
    """``terminated << 65`` and ``terminated.prefill(b'x')`` raise, as logp_next and
    greedy do, instead of returning an empty beam."""
    from genlm_core.bytes import TerminatedBeamError

    llm = table_llm(default={0: 0.4, 1: 0.3, EOS_ID: 0.3})
    beam = await ByteBeamState.initial(llm, BeamParams(K=3))
    done = await ((await (beam << ord("a"))).prune() << EOS)
    assert done.terminated and done.logZ > -math.inf
    for step in (lambda: done << 65, lambda: done.prefill(b"x"), lambda: done.log_prefix_prob(b"x")):
        with pytest.raises(TerminatedBeamError, match="consumed EOS"):
            await step()
    with pytest.raises(TerminatedBeamError):
        await ByteBeamState.advance_batch([done], [65])
    assert (await done.prefill(b"")).terminated  # reading nothing is not a step


async def test_sample_temperature_is_validated():
    llm = table_llm(default={0: 0.3, 1: 0.3, EOS_ID: 0.4})
    beam = await ByteBeamState.initial(llm, BeamParams(K=3))
    for bad in (math.inf, math.nan, -0.5):
        with pytest.raises(ValueError, match=r"temperature must be a finite number >= 0"):
            await beam.sample(b"a", 3, seed=0, temperature=bad)
    for bad in ("1", True, None):
        with pytest.raises(TypeError, match="temperature must be a real number"):
            await beam.sample(b"a", 3, seed=0, temperature=bad)
    q = await (await beam.prefill(b"a")).logp_next()
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="temperature"):
        q.sample(rng, math.inf)
    # a tiny temperature is the argmax (it overflowed to NaN before the max was subtracted)
    assert q.sample(rng, 1e-300) == q.argmax()
