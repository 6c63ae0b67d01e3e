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
