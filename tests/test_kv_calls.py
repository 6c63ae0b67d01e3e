"""The core's side of KV reuse (genlm_core.engine.kv_calls) against brute force.

A toy engine resumes a context from the payload the core hands it: its row is computed
from the payload's tokens plus the row's new tokens, so a wrong payload or depth gives a
wrong row (the oracle is the row of the whole context). Its memory is a count of tokens
held by live payloads, bounded by ``capacity``: the core must make room (releasing what
the rows do not read, by the declared rule) or run the rows in parts.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from genlm_core.config import BackendConfig
from genlm_core.engine import BaseLogprobBackend, Engine, KVCacheOptions
from genlm_core.engine.kv_calls import KVCalls
from genlm_core.engine.kv_reuse import KVReuse
from genlm_core.engine.kv_rows import KVPolicy, ResumeRow, RowsOut
from genlm_core.protocols import PrefixKVCache
from genlm_core.token import Token

V = 64


class KVConfig(KVCacheOptions, BackendConfig):
    pass


def oracle(context: tuple[int, ...]) -> torch.Tensor:
    g = torch.Generator().manual_seed(hash(context) % (1 << 31))
    return torch.randn(V, generator=g)


class Payload:
    def __init__(self, tokens: tuple[int, ...]) -> None:
        self.tokens = tokens
        self.live = True


class Tok:
    eos_token_id = 0

    def encode(self, text: str) -> list[int]:
        return [1]

    def decode(self, ids: list[int]) -> str:
        return ""


class Resumes(Engine):
    """Payloads hold whole contexts (no sharing): memory = tokens of live payloads."""

    supports = frozenset({"resume"})

    def __init__(self, policy: KVPolicy, capacity: int | None = None) -> None:
        self.tokenizer = Tok()
        self.byte_vocab = [Token(i, bytes([32 + i])) for i in range(V)]
        self.policy = policy
        self.capacity = capacity
        self.used = 0
        self.calls: list[list[ResumeRow]] = []
        self.released: list[tuple[int, ...]] = []
        self.fail = False

    def kv_policy(self) -> KVPolicy:
        return self.policy

    def kv_owner(self, payload: Payload) -> Payload:
        return payload

    def kv_size(self, payload: Payload) -> int:
        return len(payload.tokens)

    def release_kv(self, owner: Payload) -> None:
        assert owner.live, "a payload handed back twice"
        owner.live = False
        self.used -= len(owner.tokens)
        self.released.append(owner.tokens)

    def kv_shortfall(self, rows: list[ResumeRow]) -> int:
        if self.capacity is None:
            return 0
        return max(0, self.used + sum(len(r.context) for r in rows) - self.capacity)

    def forward_rows(self, rows: list[ResumeRow]) -> RowsOut:
        self.calls.append(list(rows))
        if self.fail:
            raise RuntimeError("engine failed")
        assert self.kv_shortfall(rows) == 0, "the core handed rows without room"
        out, kept = [], []
        for r in rows:
            if r.payload is not None:
                assert r.payload.live, "the core handed a released payload"
                past = r.payload.tokens[: r.depth]
            else:
                assert r.depth == 0
                past = ()
            ctx = past + r.context[r.depth :]  # what this engine computes: wrong payload, wrong row
            out += [oracle(ctx[:n]) for n in r.read_off] + [oracle(ctx)]
            for n in r.read_off:
                kept.append((r.context[:n], Payload(ctx[:n])))
                self.used += n
            kept.append((r.context, Payload(ctx)))
            self.used += len(ctx)
        return RowsOut(torch.stack(out), kept)


def backend(policy: KVPolicy, capacity: int | None = None, **options: Any) -> BaseLogprobBackend:
    return BaseLogprobBackend(Resumes(policy, capacity), KVConfig(**options), name="toy")


def check_rows(llm: BaseLogprobBackend, contexts: list[tuple[int, ...]]) -> None:
    got = llm.kv_calls.forward(contexts)
    for c, row in zip(contexts, got):
        assert torch.equal(row, oracle(c)), c


def test_rows_resume_from_the_deepest_kept_prefix_and_the_core_counts() -> None:
    llm = backend(KVPolicy())
    P = tuple(range(1, 11))
    check_rows(llm, [P])
    check_rows(llm, [P + (1,), P + (2,)])
    last = llm.engine.calls[-1]
    assert [(r.depth, r.payload.tokens) for r in last] == [(10, P), (10, P)]
    s = llm.stats()["engine"]
    assert (s["tokens_computed"], s["tokens_reused"], s["forward_calls"]) == (12, 20, 2)
    assert llm.next_token_logprobs_sync(list(P + (3,))).shape == (V,)
    llm.close()


def test_nested_contexts_are_read_off_and_shared_prefixes_run_once() -> None:
    llm = backend(KVPolicy(read_off=True, branch_tokens=4))
    X = tuple(range(1, 9))
    check_rows(llm, [X, X + (1, 2)])
    assert len(llm.engine.calls) == 1 and llm.engine.calls[0][0].read_off == (8,)
    assert llm.stats()["engine"]["tokens_computed"] == 10
    P = tuple(range(20, 40))
    check_rows(llm, [P + (1,), P + (2,), P + (3,)])
    branch, rows = llm.engine.calls[-2:]
    assert [(r.context, r.wanted) for r in branch] == [(P, False)]
    assert [r.depth for r in rows] == [20, 20, 20]
    assert llm.stats()["engine"]["tokens_computed"] == 10 + 20 + 3
    llm.close()


def test_without_read_off_a_nested_context_is_a_row_of_its_own() -> None:
    llm = backend(KVPolicy())
    X = tuple(range(1, 9))
    check_rows(llm, [X, X + (1, 2)])
    assert [r.read_off for r in llm.engine.calls[0]] == [(), ()]
    llm.close()


def test_room_is_made_by_releasing_the_least_recently_used_unread_context() -> None:
    llm = backend(KVPolicy(release="lru"), capacity=30)
    A, B, C = (1,) * 8, (2,) * 8, (3,) * 8
    for c in (A, B, C):
        check_rows(llm, [c])
    check_rows(llm, [A + (1,)])  # needs 9 of 30 with 24 held: B (least recently used, unread) goes
    assert llm.engine.released == [B]
    assert llm.engine.calls[-1][0].depth == 8  # A itself was kept: the row read it
    assert llm.engine.used <= 30
    llm.close()


def test_room_is_made_by_releasing_the_youngest_lineage_by_default() -> None:
    """Under "resident" a lineage's rank is its first keeping: C + (1,) (C's lineage, the
    youngest, though the most recently used) goes where LRU lets B go; C itself is not a
    leaf (C + (1,) extends it) and goes only after."""
    A, B, C = (1,) * 8, (2,) * 8, (3,) * 8
    released = {}
    for release in ("resident", "lru"):
        llm = backend(KVPolicy(release=release), capacity=41)
        for c in (A, B, C, C + (1,)):
            check_rows(llm, [c])
        check_rows(llm, [A + (1,)])  # 33 held + 9 > 41
        released[release] = llm.engine.released
        assert llm.engine.calls[-1][0].depth == 8
        llm.close()
    assert released == {"resident": [C + (1,)], "lru": [B]}


def test_leaves_go_first_under_the_leaves_rule() -> None:
    llm = backend(KVPolicy(release="leaves"), capacity=30)
    P = (5,) * 10
    check_rows(llm, [P])
    check_rows(llm, [P + (1,)])
    check_rows(llm, [(7,) * 12])  # 21 held + 12 > 30: P is least recently used, but P + (1,) extends it
    assert llm.engine.released == [P + (1,)]
    lru = backend(KVPolicy(release="lru"), capacity=30)
    check_rows(lru, [P])
    check_rows(lru, [P + (1,)])
    check_rows(lru, [(7,) * 12])
    assert lru.engine.released == [P]
    llm.close()
    lru.close()


def test_rows_that_do_not_fit_together_run_in_parts_and_alone_from_their_start() -> None:
    llm = backend(KVPolicy(), capacity=40)
    contexts = [(i,) * 12 for i in range(1, 5)]  # 48 tokens: no room for all at once
    check_rows(llm, contexts)
    assert llm.kv_calls.counts["call_parts_split"] >= 1 and max(map(len, llm.engine.calls)) < 4
    assert llm.engine.used <= 40
    tight = backend(KVPolicy(), capacity=25)
    P = (9,) * 12
    check_rows(tight, [P])
    check_rows(tight, [P + (1,)])  # 12 held + 13 new fits (25)
    check_rows(tight, [P + (1, 2)])  # reads P + (1,) (13) and needs 14 more: from its start
    assert tight.kv_calls.counts["rows_from_start"] == 1 and tight.engine.calls[-1][0].depth == 0
    llm.close()
    tight.close()


def test_what_is_not_kept_goes_back_to_the_engine() -> None:
    off = backend(KVPolicy(), prefix_cache=False)
    check_rows(off, [(1, 2, 3), (4, 5)])
    assert sorted(off.engine.released) == [(1, 2, 3), (4, 5)] and off.engine.used == 0
    assert not off.kv_reuse and off.prefix_cache is None
    with pytest.warns(UserWarning, match="toy: this model cannot reuse KV state \\(recurrent\\)"):
        broken = backend(KVPolicy(problem="recurrent"))
    check_rows(broken, [(1, 2)])
    assert broken.engine.used == 0 and not broken.kv_reuse
    small = backend(KVPolicy(budget=5, budget_option="kv_cache_tokens"))
    check_rows(small, [(1,) * 8])  # larger than the whole budget: handed back at once
    assert small.engine.released == [(1,) * 8] and small.prefix_cache.budget == 5
    for llm in (off, broken, small):
        llm.close()


def test_clear_hands_every_payload_back_and_a_failed_call_of_an_emptying_engine_forgets() -> None:
    llm = backend(KVPolicy())
    check_rows(llm, [(1, 2), (3, 4)])
    llm.clear_kv_cache()
    assert sorted(llm.engine.released) == [(1, 2), (3, 4)] and llm.engine.used == 0
    drops = backend(KVPolicy(drops_kv=True))
    check_rows(drops, [(1, 2)])
    drops.engine.fail = True
    with pytest.raises(RuntimeError, match="engine failed"):
        drops.kv_calls.forward([(1, 2, 3)])
    assert drops.kv_calls.reuse.lookup([(1, 2, 3)]) == [(0, None)]  # forgotten, not handed back
    assert drops.engine.released == []
    llm.close()
    drops.close()


def test_the_engine_holds_nothing_of_the_core() -> None:
    llm = backend(KVPolicy(read_off=True))
    check_rows(llm, [(1, 2, 3), (1, 2, 3, 4)])
    core_types = (KVCalls, KVReuse, BaseLogprobBackend)
    held = [
        k for k, v in vars(llm.engine).items() if isinstance(v, core_types) or isinstance(v, PrefixKVCache)
    ]
    assert held == []
    llm.close()


def test_a_bad_policy_is_refused_naming_the_fix() -> None:
    with pytest.raises(ValueError, match="KVPolicy.release is 'mru': use 'resident', 'lru' or 'leaves'"):
        KVPolicy(release="mru")  # type: ignore[arg-type]

    class NoPolicy(Resumes):
        def kv_policy(self) -> Any:
            return None

    with pytest.raises(TypeError, match="returns a genlm_core.engine.KVPolicy"):
        BaseLogprobBackend(NoPolicy(KVPolicy()), KVConfig())
    with pytest.raises(TypeError, match="declares 'kept_batches' without 'resume'"):

        class Kept(Resumes):
            supports = frozenset({"kept_batches"})

            def decode_ops(self) -> Any:
                return None

        BaseLogprobBackend(Kept(KVPolicy()), KVConfig())
