"""The conformance kit's random programs (genlm_core.testing.programs).

The programs hold every transition they are for (checked by classifying each context
against the step before, over many seeds), and the kit's check fails on an engine that
keeps state wrongly - a cache keyed on all but a context's last token, which returns a
sibling's row - while it passes on the same engine kept right.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import genlm_core
from genlm_core.testing import LogprobBackendConformance
from genlm_core.testing.programs import alone, random_program, run_program

TOKENS = list(range(3, 60))


class Kit(LogprobBackendConformance):
    atol = 0.0  # the mock's rows are a function of the context: every path gives the same bytes


def _kind(ctx: tuple[int, ...], before: list[tuple[int, ...]]) -> str:
    """How ``ctx`` relates to the contexts of the step before (the closest one)."""
    if ctx in before:
        return "asked again"
    kinds = []
    for b in before:
        if ctx[: len(b)] == b:
            kinds.append("one token" if len(ctx) == len(b) + 1 else "jump")
        else:
            shared = next((i for i, (x, y) in enumerate(zip(ctx, b)) if x != y), min(len(ctx), len(b)))
            if shared >= 1 and shared >= len(b) - 8:
                kinds.append("backed up")
    return kinds[0] if kinds else "new"


def test_programs_hold_every_transition_within_their_bounds() -> None:
    seen: dict[str, int] = {}
    forks = 0
    for seed in range(40):
        program = random_program(TOKENS, seed, steps=8, width=12, max_len=48)
        assert len(program) == 8
        for step, contexts in enumerate(program):
            assert contexts and len(contexts) <= 12 and len(set(contexts)) == len(contexts)
            assert all(1 <= len(c) <= 48 and set(c) <= set(TOKENS) for c in contexts)
            if step:
                for c in contexts:
                    kind = _kind(c, program[step - 1])
                    seen[kind] = seen.get(kind, 0) + 1
                parents = [c[:-1] for c in contexts if c[:-1] in program[step - 1]]
                forks += len(parents) - len(set(parents))
    assert forks > 0  # siblings of one parent
    for kind in ("one token", "jump", "backed up", "asked again", "new"):
        assert seen.get(kind, 0) > 0, (kind, seen)
    assert random_program(TOKENS, 3) == random_program(TOKENS, 3)  # a seed is a program


@pytest.fixture
def mock() -> Any:
    llm = genlm_core.load("mock", batch_size=3)
    yield llm
    llm.close()


def test_the_check_passes_on_a_sound_engine(mock: Any) -> None:
    Kit().test_random_programs(mock)
    program = random_program(TOKENS, 0)
    rows = run_program(mock, program, 0)
    oracle = alone(mock)
    for contexts, step in zip(program, rows):
        assert all(torch.equal(r, oracle(c)) for c, r in zip(contexts, step))


def test_the_check_fails_on_state_kept_wrongly(mock: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = mock.engine
    real = engine.forward
    kept: dict[tuple[int, ...], torch.Tensor] = {}

    def forgetful(contexts: list[tuple[int, ...]]) -> torch.Tensor:
        """A cache keyed on all but the last token: a sibling's row for a fork."""
        rows = real(contexts)
        out = []
        for c, row in zip(contexts, rows):
            key = tuple(c[:-1]) if len(c) > 1 else tuple(c)
            out.append(kept.setdefault(key, row))
        return torch.stack(out)

    monkeypatch.setattr(engine, "forward", forgetful)
    monkeypatch.setattr(engine, "forward_uncached", real)  # the engine's own computation, as engines keep it
    with pytest.raises(AssertionError, match="program"):
        Kit().test_random_programs(mock)
