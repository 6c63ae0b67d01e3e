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


def test_rows_sharing_a_prompt_hold_its_full_blocks_once() -> None:
    """block_size 4: a 10-token prompt is 2 full blocks and a partial one; 4 particles a
    token past it hold the 2 shared blocks and a partial block each: 6 blocks, 24 tokens
    (counted per row: 44)."""
    prompt = (1,) * 8 + (2, 2)
    particles = [prompt + (10 + i,) for i in range(4)]
    rows = ResidentRows(8, block_size=4)
    run(rows, [prompt])
    plan = run(rows, particles, token_budget=24)
    assert [p.keep for p in plan.placements] == [True] * 4 and len(rows) == 4
    rows = ResidentRows(8, block_size=4)
    run(rows, [prompt])
    plan = run(rows, particles, token_budget=20)  # 2 shared + 3 partial blocks
    assert [p.keep for p in plan.placements] == [True, True, True, False]
    # without a block size every row holds its whole context: 2 of them fit in 24 tokens
    rows = ResidentRows(8)
    run(rows, [prompt])
    assert [p.keep for p in run(rows, particles, token_budget=24).placements] == [True, True, False, False]


def test_a_fresh_context_never_ends_a_row_its_step_still_continues() -> None:
    """6 particles, room for 4 rows, each step split in two calls of 3 (the batcher): the
    rows continued at the step's second call are never ended by the first call's fresh
    contexts (least-recently-used eviction would: each ended row restarts and ends another,
    every particle restarting every step)."""
    clock = Clock()
    rows = ResidentRows(4, clock=clock)
    ctxs = [(i,) for i in range(6)]
    restarted = []
    for step in range(6):
        before = rows.stats()["rows_restarted"]
        for half in (ctxs[:3], ctxs[3:]):
            clock.t += 1
            run(rows, half)
        restarted.append(rows.stats()["rows_restarted"] - before)
        ctxs = [c + (step,) for c in ctxs]
    assert restarted[0] == 6 and all(r == 2 for r in restarted[1:]), restarted
    assert len(rows) == 4


def test_a_fresh_context_forks_the_row_holding_its_prefix() -> None:
    rows = ResidentRows(8)
    run(rows, [(1, 2, 3), (7, 8)])
    plan = rows.plan([(1, 2, 3, 4), (1, 2, 3, 5), (7, 8, 9, 9), (5,)], None)  # before its commit
    first, second, third, fourth = plan.placements
    assert first.row is not None and first.source is None  # continues its row
    # a sibling forks the row the first continues, as it was before the call
    assert second.row is None and second.source is first.row and second.source.context == (1, 2, 3)
    assert second.source_depth == 3
    assert third.row is not None and third.new_tokens == (9, 9)
    assert fourth.source is None
    rows.commit(plan, [("state", p.context) for p in plan.placements], None)
    # a later call of the same step (the batcher split it): the row continued first still
    # holds the prompt its step extends, and the others fork it
    plan = rows.plan([(1, 2, 3, 6), (7, 8, 5)], None)
    assert plan.placements[0].row is None and plan.placements[0].source is first.row
    assert plan.placements[0].source.context == (1, 2, 3, 4) and plan.placements[0].source_depth == 3
    assert plan.placements[1].source is third.row and plan.placements[1].source_depth == 2
