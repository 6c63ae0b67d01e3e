"""DecodeSessions' end of a burst and its names, over a fake engine that records aborts
(no vLLM engine runs): end_burst ends exactly the released handles' sessions, a turn
needs rows, and the count of closed sessions is ``sessions_closed``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from genlm_vllm.sessions import DecodeSessions, Session


def fake_engine() -> SimpleNamespace:
    aborted: list[str] = []
    llm_engine = SimpleNamespace(abort_request=lambda ids, internal: aborted.extend(ids))
    return SimpleNamespace(llm=SimpleNamespace(llm_engine=llm_engine), lora_request=None, aborted=aborted)


def test_end_burst_ends_the_released_sessions_only() -> None:
    engine = fake_engine()
    sessions = DecodeSessions(engine)
    sessions.live = {h: Session(f"r{h}", f"e{h}", (1, h), None) for h in range(3)}
    sessions.end_burst({0, 2, 7})  # 7: a handle with no session
    assert sorted(engine.aborted) == ["r0", "r2"] and list(sessions.live) == [1]
    assert sessions.sessions_closed == 2
    with pytest.warns(DeprecationWarning, match="sessions_closed"):
        assert sessions.closed == 2
    with pytest.raises(ValueError, match="end_burst"):
        sessions.take_turn({}, {1})
    with pytest.warns(DeprecationWarning, match="take_turn"):
        assert sessions.step({}, {1}) is None  # the old end of a burst
    assert sorted(engine.aborted) == ["r0", "r1", "r2"] and sessions.live == {}
