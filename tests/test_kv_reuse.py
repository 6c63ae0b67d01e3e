"""genlm_core.engine.kv_reuse: the KV-reuse bookkeeping every engine with its own KV shares.
Oracle: hand-built prefix tables (which prefix is cached at which depth)."""

from __future__ import annotations

import pytest

from genlm_core.config import ConfigError
from genlm_core.engine.kv_reuse import KVCacheOptions, KVReuse


def test_lookup_finds_the_deepest_proper_prefix() -> None:
    kv = KVReuse(budget=100, sizeof=len)
    assert kv.lookup([(1, 2, 3)]) == [(0, None)]
    assert kv.store((1, 2), "ab") and kv.store((1, 2, 3), "abc")
    # (1, 2, 3) itself is cached, but a context is looked up at most len - 1 deep:
    # the model must compute its last token (whose logits are the answer)
    assert kv.lookup([(1, 2, 3), (1, 2, 3, 4), (1, 9), (7,)]) == [(2, "ab"), (3, "abc"), (0, None), (0, None)]


def test_store_refuses_what_cannot_be_kept() -> None:
    dropped: list[str] = []
    kv = KVReuse(budget=4, sizeof=len, on_evict=dropped.append)
    assert not kv.store((1,), "toolong")  # over the whole budget: not kept, nothing evicted
    assert not kv.store((1,), None)
    assert kv.store((1,), "ab") and kv.store((2,), "cd")
    assert kv.store((3,), "ef")  # 6 > 4 units: the least recently used payload goes
    assert dropped == ["ab"]
    kv.clear()
    assert sorted(dropped) == ["ab", "cd", "ef"]


def test_counters_and_stats() -> None:
    kv = KVReuse(budget=None)
    kv.count(computed=5, reused=0)
    kv.count(computed=1, reused=5)
    assert kv.stats() == {"forward_calls": 2, "tokens_computed": 6, "tokens_reused": 5, "kv_reuse": True}


@pytest.mark.parametrize("options", [{"enabled": False}, {"budget": 0}])
def test_reuse_off_keeps_nothing(options: dict) -> None:
    kv = KVReuse(**{"budget": 100, **options})
    assert kv.cache is None and not kv.enabled
    assert not kv.store((1, 2), "ab")
    assert kv.lookup([(1, 2, 3)]) == [(0, None)]
    assert kv.stats()["kv_reuse"] is False


def test_options_mixin_checks_its_values() -> None:
    from genlm_core.config import BackendConfig

    class Config(KVCacheOptions, BackendConfig):
        component = "kv-test"

    assert Config().prefix_cache is True and Config().kv_cache_bytes == 1 << 30
    with pytest.raises(ConfigError, match=r"kv_cache_bytes=-1.*>= 0"):
        Config(kv_cache_bytes=-1)
    # the mixin's options follow the common ones in the schema and the reference docs
    fields = list(Config.model_fields)
    assert fields.index("prefix_cache") > fields.index("dtype")


def test_a_budget_below_one_steps_contexts_is_reported_once(caplog) -> None:
    """Payloads stored since the last lookup that the budget drops before any lookup (the
    next call would compute those contexts from their start): counted, and a WARNING
    names the budget's option once. Evictions of payloads a lookup came after, a clear,
    and a budget that holds a step are not reported."""
    import logging

    kv = KVReuse(budget=6, sizeof=len, budget_option="kv_cache_tokens")
    with caplog.at_level(logging.WARNING, logger="genlm"):
        kv.lookup([(1, 2)])
        for i in range(3):  # a step of three contexts, 6 units: kept whole
            assert kv.store((i, 0), bytearray(2))
        kv.lookup([(0, 0, 5)])
        for i in range(3):  # the next step drops the first step's payloads: read already
            assert kv.store((i, 0, 5), bytearray(2))
        assert kv.store((2, 0, 5), bytearray(2))  # a context stored again: replaced, no loss
        assert kv.self_evictions == 0 and not caplog.records
        kv.lookup([(0, 0, 5, 6)])
        for i in range(4):  # 8 units: the first of them goes before anything read it
            assert kv.store((i, 0, 5, 6), bytearray(2))
        assert kv.self_evictions == 1
        for i in range(4, 6):
            assert kv.store((i, 0, 5, 6), bytearray(2))
        assert kv.self_evictions == 3
        kv.clear()  # a clear drops unread payloads too: not the budget's doing
        assert kv.self_evictions == 3
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "kv_cache_tokens=6" in warnings[0].getMessage()


def test_a_context_larger_than_the_whole_budget_is_reported_once(caplog) -> None:
    """A payload larger than the whole budget is not kept (every call over that context
    computes it from its start): counted, and one WARNING names the context's length, the
    size it needs, the option and its value, and the fix; nothing kept is evicted for it."""
    import logging

    dropped: list[bytes] = []
    kv = KVReuse(budget=6, sizeof=len, budget_option="kv_cache_tokens", on_evict=dropped.append)
    with caplog.at_level(logging.WARNING, logger="genlm"):
        assert kv.store((1,), b"ab")
        assert not kv.store(tuple(range(9)), b"x" * 9)
        assert not kv.store(tuple(range(12)), b"x" * 12)
        assert kv.oversized == 2 and dropped == []
        assert kv.lookup([(1, 2)]) == [(1, b"ab")]  # what was kept stays
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "9-token context" in warning and "kv_cache_tokens=6" in warning
    assert "Raise kv_cache_tokens in load() to at least 9" in warning
