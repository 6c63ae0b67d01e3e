"""The core's KV reuse counts what reads an engine resource (a payload's owner: a
llama.cpp KV sequence several cached prefixes share) and frees it when nothing does.
Checked against a brute-force oracle: after every operation, an owner is live exactly
when a cached payload or a running hold reads it, and each owner is freed once."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from genlm_core.engine.kv_reuse import KVReuse


@dataclass(eq=False)
class Owner:
    name: int


@dataclass(eq=False)
class Payload:
    owner: Owner
    n_tokens: int


def _kv(budget: int, freed: list[Owner]) -> KVReuse:
    return KVReuse(
        budget,
        sizeof=lambda p: p.n_tokens,
        owner=lambda p: p.owner,
        release=freed.append,
    )


@pytest.mark.parametrize("seed", range(20))
def test_owners_are_freed_exactly_when_nothing_reads_them(seed: int) -> None:
    rng = random.Random(seed)
    freed: list[Owner] = []
    kv = _kv(budget=rng.choice([6, 12, 40]), freed=freed)
    owners = [Owner(i) for i in range(6)]
    held: list[Owner] = []
    holds = []
    used: set[int] = set()
    for _ in range(200):
        op = rng.random()
        if op < 0.6:
            ctx = tuple(rng.randrange(4) for _ in range(rng.randint(1, 5)))
            owner = rng.choice(owners)
            if owner in freed:  # a freed resource is never handed out again
                owner = Owner(len(owners))
                owners.append(owner)
            used.add(id(owner))
            hold = kv.hold([owner])  # an engine call holds what it decodes into while it stores
            hold.__enter__()
            kv.store(ctx, Payload(owner, len(ctx)))
            if rng.random() < 0.3:  # keep holding it for a while (a long call)
                holds.append(hold)
                held.append(owner)
            else:
                hold.__exit__(None, None, None)
        elif op < 0.75 and holds:
            i = rng.randrange(len(holds))
            holds.pop(i).__exit__(None, None, None)
            held.pop(i)
        elif op < 0.85 and kv.cache is not None:
            kv.cache.evict_lru_kv()
        elif op < 0.9:
            kv.clear()
        # the oracle: what reads each owner now
        cached = {id(p.owner) for p in _payloads(kv)}
        for o in owners:
            live = id(o) in cached or any(h is o for h in held)
            assert (o in freed) == (id(o) in used and not live), (o, live, freed)
            expected = sum(p.owner is o for p in _payloads(kv)) + sum(h is o for h in held)
            assert kv.readers(o) == expected
    assert len({id(o) for o in freed}) == len(freed), "an owner was freed twice"


def _payloads(kv: KVReuse) -> list[Payload]:
    cache = kv.cache
    if cache is None:
        return []
    return [cache.deepest_kv(p)[1] for p in cache.kv_prefixes()]


def test_forget_drops_everything_without_freeing() -> None:
    """``forget``: the engine freed all of its KV itself (llama.cpp emptied its cache)."""
    freed: list[Owner] = []
    kv = _kv(100, freed)
    a = Owner(0)
    with kv.hold([a]):
        kv.store((1, 2), Payload(a, 2))
    kv.forget()
    assert freed == [] and kv.readers(a) == 0 and _payloads(kv) == []
    kv.store((3,), Payload(a, 1))  # usable again afterwards
    kv.clear()
    assert freed == [a]


def test_a_payload_larger_than_the_budget_is_not_kept_and_its_owner_freed_after_the_hold() -> None:
    freed: list[Owner] = []
    kv = _kv(3, freed)
    a = Owner(0)
    with kv.hold([a]):
        assert not kv.store((1, 2, 3, 4), Payload(a, 4))
        assert freed == []
    assert freed == [a]
