"""Adaptive token healing on crafted vocabularies (weights checked by hand)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from genlm_core.bytes import BeamParams, ByteBeamState, EmptyBeamError
from genlm_core.bytes.testing import BruteForce, TableBackend

pytestmark = pytest.mark.numeric  # run again with the SIMD path capped (scripts/test.sh)

# --- scenario 1: "c" exists only inside b"bc"; K=1 keeps the partial b"ab" ------------
V1 = [b"a", b"b", b"ab", b"bc", b"<e>"]
A, B, AB, BC, E1 = range(5)
T1 = {
    (E1,): {AB: 0.7, A: 0.1, B: 0.1, BC: 0.05, E1: 0.05},
    (E1, A): {BC: 0.4, B: 0.3, A: 0.2, AB: 0.05, E1: 0.05},
}

# --- scenario 2: the replay needs a commit inside the suffix --------------------------
V2 = [b"x", b"a", b"b", b"ab", b"c", b"xabd", b"<e>"]
X, A2, B2, AB2, C2, XABD, E2 = range(7)
T2 = {
    (E2,): {X: 0.1, XABD: 0.8, A2: 0.04, B2: 0.02, AB2: 0.02, C2: 0.01, E2: 0.01},
    (E2, X): {A2: 0.3, AB2: 0.5, B2: 0.1, C2: 0.05, X: 0.03, E2: 0.02},
    (E2, X, AB2): {C2: 0.6, X: 0.1, A2: 0.1, B2: 0.1, AB2: 0.05, E2: 0.05},
}


async def read(beam: ByteBeamState, data: bytes) -> ByteBeamState:
    for c in data:
        beam = await (beam.prune() << c)
    return beam


async def beam1(**kw) -> ByteBeamState:
    return await ByteBeamState.initial(TableBackend(V1, [E1], table=T1), BeamParams(K=1, **kw))


def f32_tol(n_tokens: int) -> float:
    """Bound on |weight - exact| for a hand-computed weight of ``n_tokens`` table tokens.

    Each token's log-probability is a float32: the table's log(p) is rounded once and
    ``log_softmax`` rounds a few more times (x - max, the log of the sum, the
    difference), each <= half an ulp of values below 4 here; the renormalisation
    the beam applies in float64 removes the common ``log sum exp`` error. So per
    token <= 4 ulps(4.0) = 1.9e-6, whatever SIMD path the CPU takes.
    """
    return n_tokens * 4 * float(np.spacing(np.float32(4.0)))


async def beam2(**kw) -> ByteBeamState:
    return await ByteBeamState.initial(TableBackend(V2, [E2], table=T2), BeamParams(K=1, **kw))


async def test_unreachable_without_healing():
    bm = await read(await beam1(heal=False), b"ab")
    assert [s.partial for s in bm.prune()] == [b"ab"]  # K=1 dropped a|b
    after = await (bm.prune() << ord("c"))
    assert len(after) == 0 and after.logZ == -math.inf
    with pytest.raises(EmptyBeamError):
        await after.logp_next()


async def test_heal_single_commit_weight_is_exact():
    beam = await beam1()
    bm = await read(beam, b"abc")
    assert len(bm) == 1
    (s,) = bm.states
    assert s.lm.context == (E1, A) and s.partial == b"bc"
    want = math.log(0.1 * 0.4)  # p(a) * p(bc | a), by hand
    assert s.weight == pytest.approx(want, abs=f32_tol(2))
    bf = BruteForce(beam.states[0].lm.model, (E1,))
    # the only tokenization; the oracle reads the same rows: float64 rounding only
    assert bm.logZ == pytest.approx(math.log(bf.prefix(b"abc")), abs=1e-10)


async def test_heal_max_backoff_zero_cannot_back_off():
    bm = await read(await beam1(heal_max_backoff=0), b"abc")
    assert len(bm) == 0


async def test_heal_with_intra_suffix_split_weight_is_exact():
    bm = await read(await beam2(), b"xabc")
    (s,) = bm.states
    assert s.lm.context == (E2, X, AB2) and s.partial == b"c"
    # p(x) p(ab|x) p(c|x,ab), by hand
    assert s.weight == pytest.approx(math.log(0.1 * 0.5 * 0.6), abs=f32_tol(3))


@pytest.mark.parametrize(("splits", "ok"), [(0, False), (1, True), (None, True)])
async def test_heal_max_splits(splits, ok):
    bm = await read(await beam2(heal_max_splits=splits), b"xabc")
    assert (len(bm) == 1) is ok


@pytest.mark.parametrize(("backoff", "ok"), [(0, False), (1, False), (2, True), (3, True)])
async def test_heal_max_backoff(backoff, ok):
    # the partial is b"xab"; the only token to commit is b"x": 2 bytes back
    bm = await read(await beam2(heal_max_backoff=backoff), b"xabc")
    assert (len(bm) == 1) is ok


async def test_healed_beam_keeps_going():
    bm = await read(await beam2(), b"xabc")
    q = await bm.prune().logp_next()
    assert q.total() == pytest.approx(1.0, abs=1e-9)
