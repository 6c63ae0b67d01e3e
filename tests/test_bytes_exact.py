"""Exactness oracle for the byte beam: brute-force enumeration of tokenizations.

Small vocabularies over the alphabet {a, b} with heavily overlapping tokens, a
duplicate token and an EOS token whose bytes overlap other tokens; the token LM is
a table (seeded per context). With ``K=None`` and ``prune_threshold=0`` the beam
must reproduce the exact prefix probability of every byte string up to length 6,
and its next-byte distribution, in both EOS modes.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from genlm_core.bytes import BeamParams, ByteBeamState, EOSMode
from genlm_core.bytes.testing import BruteForce, TableBackend

pytestmark = pytest.mark.numeric  # run again with the SIMD path capped (scripts/test.sh)

VOCAB = [
    b"a", b"b", b"aa", b"ab", b"ba", b"bb", b"aab", b"aba", b"abb", b"baa", b"bab",
    b"bba", b"abab", b"baba", b"aaaa", b"bbbb", b"abba", b"ab", b"<e>", b"bab",
    b"aabb", b"babab",
]  # fmt: skip
EOS_ID = 18  # b"<e>": also the BOS of every context
# a second vocabulary whose EOS token's bytes overlap ordinary tokens
VOCAB2 = [b"a", b"b", b"ab", b"ba", b"aab", b"abb", b"bba", b"aa"]
EOS2 = 5  # b"abb" is EOS: in WITH_EOS mode its bytes are never read

MAXLEN = 6
ALPHABET = b"ab"

# Tolerances. The oracle reads each float32 row as the beam does (exp in float64,
# renormalised: see BruteForce._probs), so the beam and the oracle differ by float64
# rounding only: sums and products of at most a few thousand terms here, each
# rounding step <= eps64 = 1.1e-16 relative, so <= ~1e-12 relative on a probability
# and on logZ (|logZ| < 20 here). TOL64 = 1e-10 leaves two orders of magnitude.
# Nothing here depends on the CPU's float32 SIMD path any more.
TOL64 = 1e-10


def strings(maxlen: int) -> list[bytes]:
    out = []
    for n in range(maxlen + 1):
        out += [bytes(p) for p in itertools.product(ALPHABET, repeat=n)]
    return out


def backend(which: int, seed: int = 0) -> TableBackend:
    if which == 1:
        return TableBackend(VOCAB, eos_token_ids=[EOS_ID], seed=seed, scale=1.5)
    return TableBackend(VOCAB2, eos_token_ids=[EOS2], bos=0, seed=seed, scale=1.5)


async def walk(beam: ByteBeamState, maxlen: int, prune: bool = False):
    """Yield (x, beam after x) for every string over the alphabet up to maxlen (DFS)."""
    stack = [(b"", beam)]
    while stack:
        x, bm = stack.pop()
        yield x, bm
        if len(x) < maxlen:
            for c in ALPHABET:
                nxt = await ((bm.prune() if prune else bm) << c)
                stack.append((x + bytes([c]), nxt))


@pytest.mark.parametrize("which", [1, 2])
@pytest.mark.parametrize("mode", [EOSMode.WITH_EOS, EOSMode.WITHOUT_EOS])
async def test_exact_logZ_and_next_byte(which, mode):
    llm = backend(which)
    params = BeamParams(K=None, prune_threshold=0.0)
    beam = (await ByteBeamState.initial(llm, params)).with_mode(mode)
    bf = BruteForce(llm, beam.states[0].lm.context, with_eos=mode is EOSMode.WITH_EOS)
    checked = 0
    async for x, bm in walk(beam, MAXLEN):
        want = math.log(bf.prefix(x))
        assert bm.logZ == pytest.approx(want, abs=TOL64), x
        if len(x) < MAXLEN:
            got = (await bm.logp_next()).ps
            exact = bf.next_byte_logprobs(x)
            assert np.exp(got).sum() == pytest.approx(1.0, abs=TOL64)
            assert np.array_equal(np.isneginf(got), np.isneginf(exact)), x
            fin = ~np.isneginf(exact)
            np.testing.assert_allclose(np.exp(got[fin]), np.exp(exact[fin]), atol=TOL64, err_msg=repr(x))
            assert got[256] == -np.inf  # EOT is summed out at the beam level
            if mode is EOSMode.WITHOUT_EOS:
                assert got[257] == -np.inf
        checked += 1
    assert checked == len(strings(MAXLEN))


async def test_eos_probability_is_exact_and_consumable():
    llm = backend(2)
    beam = await ByteBeamState.initial(llm, BeamParams(K=None))
    bf = BruteForce(llm, beam.states[0].lm.context, with_eos=True)
    bm = beam
    for c in b"aba":
        bm = await (bm << c)
    q = await bm.logp_next()
    p_eos = bf.exact_then_eos(b"aba") / bf.prefix(b"aba")
    assert p_eos > 0
    assert math.exp(q[257]) == pytest.approx(p_eos, rel=TOL64)
    done = await (bm << 257)
    assert done.terminated
    assert done.logZ == pytest.approx(math.log(bf.exact_then_eos(b"aba")), abs=TOL64)
    # a terminated beam says so instead of returning NaN
    from genlm_core.bytes import TerminatedBeamError

    with pytest.raises(TerminatedBeamError):
        await done.logp_next()
    # stepping past EOS is an error too, not a silently empty beam
    with pytest.raises(TerminatedBeamError, match="consumed EOS"):
        await (done << ord("a"))
    with pytest.raises(TerminatedBeamError, match="consumed EOS"):
        await done.prefill(b"a")


@pytest.mark.parametrize("K", [1, 2, 3])
async def test_finite_K_is_a_lower_bound(K):
    llm = backend(1, seed=3)
    beam = await ByteBeamState.initial(llm, BeamParams(K=K))
    bf = BruteForce(llm, beam.states[0].lm.context, with_eos=True)
    strict = 0
    async for x, bm in walk(beam, 5, prune=True):
        exact = math.log(bf.prefix(x))
        assert bm.logZ <= exact + TOL64, x  # a lower bound, up to float64 rounding
        assert len(bm.prune()) <= K
        strict += bm.logZ < exact - 1e-6  # lost far more than any rounding
    assert strict > 0  # pruning actually lost mass somewhere (the test can fail)


async def test_prune_threshold_is_a_lower_bound_and_drops_candidates():
    llm = backend(1, seed=5)
    full = await ByteBeamState.initial(llm, BeamParams(K=None))
    thr = await ByteBeamState.initial(llm, BeamParams(K=None, prune_threshold=0.05))
    x = b"abbaba"
    a, b = full, thr
    for c in x:
        a = await (a.prune() << c)
        b = await (b.prune() << c)
        assert b.logZ <= a.logZ + 1e-12  # same rows, float64 sums in another order: ~1e-15
    assert len(b.prune()) < len(a.prune())


@pytest.mark.parametrize("mode", [EOSMode.WITH_EOS, EOSMode.WITHOUT_EOS])
async def test_state_level_eot_matches_brute_force(mode):
    """Per candidate, P(EOT) is the probability that the partial bytes are the
    whole token; the masses in both modes agree with the core trie's modes."""
    llm = backend(2, seed=1)
    beam = (await ByteBeamState.initial(llm, BeamParams(K=None))).with_mode(mode)
    bm = beam
    for c in b"ab":
        bm = await (bm << c)
    trie = bm.trie.trie
    for s in bm.states:
        probs = np.exp(llm.next_token_logprobs_sync(s.lm.context).numpy().astype(np.float64))
        want = trie.weight_sum(probs, mode)
        for node in range(trie.num_nodes):
            assert s.masses.get(node, mode is EOSMode.WITH_EOS) == pytest.approx(float(want[node]), abs=1e-12)
        part = s.partial
        ok = [
            i
            for i, t in enumerate(VOCAB2)
            if t.startswith(part) and not (mode is EOSMode.WITH_EOS and i == EOS2)
        ]
        exact = [i for i in ok if VOCAB2[i] == part]
        p_eot = sum(probs[i] for i in exact) / sum(probs[i] for i in ok)
        got = s.logp_next[None]
        assert (math.exp(got) if got > -math.inf else 0.0) == pytest.approx(p_eot, abs=1e-9)


async def test_duplicate_tokens_are_distinct_candidates():
    llm = backend(1, seed=2)
    beam = await ByteBeamState.initial(llm, BeamParams(K=None))
    bm = beam
    for c in b"ab":
        bm = await (bm << c)
    exts = [e for s in bm.states for e in s.extend()]
    last = sorted(e.lm.context[-1] for e in exts if e.lm.context[-1] in (3, 17))
    assert last == [3, 17]  # both b"ab" tokens are committed separately
