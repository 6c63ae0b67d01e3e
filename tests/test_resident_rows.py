"""genlm_core.engine.resident.ResidentRows: which context of a call continues which live
row (engine-free bookkeeping; genlm-vllm's resident path runs on it)."""

from __future__ import annotations

from genlm_core.engine.resident import ResidentRows


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def run(rows: ResidentRows, contexts, key=None, **kw):
    """Plan a call, 'run' it (each state names the context it holds), commit it."""
    plan = rows.plan(contexts, key, **kw)
    rows.commit(plan, [("state", p.context) for p in plan.placements], key)
    return plan


def test_a_context_plus_one_token_continues_its_row() -> None:
    rows = ResidentRows(8)
    first = run(rows, [(1, 2), (1, 3)])
    assert [p.row for p in first.placements] == [None, None] and len(rows) == 2
    plan = run(rows, [(1, 2, 5), (1, 3, 6, 7), (9,)])
    cont = [p.row is not None for p in plan.placements]
    assert cont == [True, True, False]
    assert [p.new_tokens for p in plan.placements] == [(5,), (6, 7), (9,)]
    assert set(rows.rows) == {(1, 2, 5), (1, 3, 6, 7), (9,)}
    assert rows.stats()["rows_resumed"] == 2 and rows.stats()["rows_restarted"] == 3


def test_a_row_continues_one_context_per_call() -> None:
    rows = ResidentRows(8)
    run(rows, [(1, 2)])
    plan = run(rows, [(1, 2, 3), (1, 2, 4)])  # two particles that shared a row diverge
    assert [p.row is not None for p in plan.placements] == [True, False]
    assert len(rows) == 2


def test_rows_of_another_key_never_continue() -> None:
    rows = ResidentRows(8)
    run(rows, [(1, 2)], key="a")
    plan = run(rows, [(1, 2, 3)], key="b")
    assert plan.placements[0].row is None
    plan = run(rows, [(1, 2, 4)], key="a")  # back to the first adapter: its row is live
    assert plan.placements[0].row is not None


def test_the_bound_evicts_the_least_recently_used() -> None:
    clock = Clock()
    rows = ResidentRows(2, clock=clock)
    run(rows, [(1,)])
    clock.t = 1
    run(rows, [(2,)])
    clock.t = 2
    run(rows, [(2, 5)])  # (2,) becomes the most recent
    clock.t = 3
    plan = run(rows, [(3,)])
    assert [r.context for r in plan.evicted] == [(1,)]
    assert set(rows.rows) == {(2, 5), (3,)}
    # more fresh contexts than room: the excess runs once and ends
    plan = run(rows, [(4,), (5,), (6,)])
    assert [p.keep for p in plan.placements] == [True, True, False]
    assert len(rows) == 2 and rows.stats()["resident_evicted"] == 3


def test_a_token_budget_bounds_the_rows() -> None:
    rows = ResidentRows(8)
    run(rows, [(1,) * 4, (2,) * 4])
    plan = run(rows, [(3,) * 4], token_budget=8)
    assert [r.context for r in plan.evicted] == [(1,) * 4]
    assert sum(map(len, rows.rows)) <= 8


def test_idle_rows_expire() -> None:
    clock = Clock()
    rows = ResidentRows(8, idle_s=10, clock=clock)
    run(rows, [(1,), (2,)])
    clock.t = 5
    run(rows, [(1, 7)])
    clock.t = 12
    assert [r.context for r in rows.expire()] == [(2,)]
    assert set(rows.rows) == {(1, 7)} and rows.stats()["resident_expired"] == 1


def test_a_context_a_row_holds_exactly_replaces_it() -> None:
    rows = ResidentRows(8)
    run(rows, [(1, 2)])
    plan = run(rows, [(1, 2)])  # nothing new to run over it: a fresh row replaces it
    assert plan.placements[0].row is None and [r.context for r in plan.evicted] == [(1, 2)]
    assert len(rows) == 1


def test_shrink_and_clear() -> None:
    rows = ResidentRows(8)
    run(rows, [(1,), (2,), (3,)])
    assert [r.context for r in rows.shrink(1)] == [(1,), (2,)]
    assert [r.context for r in rows.clear()] == [(3,)] and len(rows) == 0
