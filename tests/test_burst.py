"""The burst loop's protocol (genlm_core.engine.burst) on the mock engine: what a control
sees, how rows end, and that bad controls get clear errors and leave the backend usable."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np
import pytest
import torch
from genlm_mock.engine import MockEngine

import genlm_core
from genlm_core.engine import BaseLogprobBackend, Engine
from genlm_core.engine.burst import EngineControl


class Scripted:
    """A control that records what it is shown and draws ``pick(handle, row)``."""

    def __init__(self, adds: list[tuple[int, list[int], Any]], pick=None) -> None:
        self.adds, self.aborts = list(adds), []
        self.pick = pick or (lambda h, row: int(torch.argmax(row)))
        self.seen: list[tuple[list[int], torch.Tensor]] = []
        self.ends = 0
        self.after_step = lambda step, handles: None

    def draw(self, logprobs, handles):
        self.seen.append((list(handles), logprobs.clone()))
        out = [self.pick(h, logprobs[i]) for i, h in enumerate(handles)]
        self.after_step(len(self.seen), list(handles))
        return out

    def drain_adds(self):
        out, self.adds = self.adds, []
        return out

    def drain_aborts(self):
        out, self.aborts = self.aborts, []
        return out

    def on_burst_end(self):
        self.ends += 1


@pytest.fixture
def llm():
    backend = genlm_core.load("mock")
    yield backend
    backend.close()


def test_rows_are_the_contexts_next_token_logprobs(llm) -> None:
    """Every row a draw sees is the backend's own row for the row's context (prompt plus
    the tokens drawn so far), computed independently afterwards one context at a time."""
    control = Scripted([(7, [1, 2, 3], None), (9, [4], None)], pick=lambda h, row: 10 + h)
    assert isinstance(control, EngineControl)
    report = llm.run_burst(control, max_steps=4)
    assert report.steps == 4 and report.rows_drawn == 8 and report.capped == [7, 9]
    assert report.tokens == {7: [17] * 4, 9: [19] * 4} and control.ends == 1
    contexts = {7: [1, 2, 3], 9: [4]}
    for handles, rows in control.seen:
        for h, row in zip(handles, rows):
            assert torch.equal(row, llm.next_token_logprobs_uncached(contexts[h]))
            contexts[h].append(10 + h)


def test_aborts_adds_and_max_steps_per_row(llm) -> None:
    control = Scripted([(0, [1], None), (1, [2], None)], pick=lambda h, row: 5)

    def after(step: int, handles: list[int]) -> None:
        if step == 1:
            control.aborts.append(0)
            control.adds.append((2, [3, 3], None))
        if step == 2:
            control.aborts.append(0)  # already gone: ignored

    control.after_step = after
    report = llm.run_burst(control, max_steps=3)
    assert [h for h, _ in control.seen] == [[0, 1], [1, 2], [1, 2], [2]]
    assert report.tokens == {0: [5], 1: [5, 5, 5], 2: [5, 5, 5]}
    assert report.aborted == 1 and report.added == 3 and report.capped == [1, 2]


def test_context_limit_ends_a_row() -> None:
    llm = genlm_core.load("mock", max_context_length=5)
    try:
        report = llm.run_burst(Scripted([(0, [1, 2, 3], None)], pick=lambda h, r: 4), max_steps=50)
        assert report.tokens[0] == [4, 4, 4] and report.capped == [0]  # contexts of 3, 4, 5 tokens
    finally:
        llm.close()


def test_adds_after_the_loop_are_reported_not_run(llm) -> None:
    control = Scripted([(0, [1], None)])
    control.on_burst_end = lambda: control.adds.append((1, [2], None))
    report = llm.run_burst(control, max_steps=1)
    assert report.not_run == [1] and list(report.tokens) == [0]
    assert llm.run_burst(Scripted([(0, [1], None)]), max_steps=0).not_run == [0]


@pytest.mark.parametrize(
    ("adds", "pick", "match"),
    [
        ([(0, [1], None)], lambda h, r: [1, 2], "2 token ids for 1 rows"),
        ([(0, [1], None)], lambda h, r: [10**9], "row 0 token id 1000000000, outside the vocabulary"),
        ([(0, [1], None)], lambda h, r: [1.5], "must be integers"),
        # the documented shape and dtype only: one int64/int32 id per row
        (
            [(0, [1], None)],
            lambda h, r: np.array([[1]]),
            r"returned shape \(1, 1\) for 1 rows; expected .*\(1,\)",
        ),
        ([(0, [1], None)], lambda h, r: 1, r"returned shape \(\) for 1 rows; expected .*\(1,\)"),
        (
            [(0, [1], None)],
            lambda h, r: np.array([1], dtype=np.uint8),
            "torch.uint8 values; .* int64 or int32",
        ),
        ([(0, [1], None)], lambda h, r: torch.tensor([1], dtype=torch.int16), "torch.int16 values"),
        ([(0, [1], None)], lambda h, r: [True], "torch.bool values"),
        ([(0, [1], None), (0, [2], None)], None, "row 0 was added while live"),
        ([(0, [1], "adapter")], None, "LoRA adapter 'adapter'"),
        ([(0, [10**9], None)], None, "the prompt of row 0"),
        ([("a", [1], None)], None, "handles are ints"),
        ([(0, [1])], None, r"each add is \(handle, prompt_token_ids, lora_name\)"),
    ],
)
def test_bad_controls_get_clear_errors_and_the_backend_stays_usable(llm, adds, pick, match) -> None:
    control = Scripted(adds)
    if pick is not None:
        control.draw = lambda logits, handles: pick(handles[0], logits[0])
    with pytest.raises(ValueError, match=match):
        llm.run_burst(control, max_steps=3)
    assert llm.run_burst(Scripted([(0, [1], None)]), max_steps=2).rows_drawn == 2
    with pytest.raises(ValueError, match="max_steps must be a non-negative int"):
        llm.run_burst(Scripted([]), max_steps=-1)


@pytest.mark.parametrize("when", ["before the first step", "after a step"])
def test_an_abort_of_a_handle_never_added_is_an_error_naming_it(llm, when: str) -> None:
    """A handle this burst never added (a typo, another burst's, one aborted before its add
    was applied) is named; a handle whose row ended meanwhile is not an error; the
    backend stays exact after."""
    control = Scripted([(0, [1], None), (1, [2], None)])
    if when == "before the first step":
        control.aborts.append(999)
    else:
        control.after_step = lambda step, handles: control.aborts.extend([0, 999])
    with pytest.raises(ValueError, match="drain_aborts\\(\\) gave handle 999, which no row of this burst"):
        llm.run_burst(control, max_steps=3)
    capped = Scripted([(0, [1], None)])
    capped.after_step = lambda step, handles: capped.aborts.append(0)  # the row ends by max_steps first
    assert llm.run_burst(capped, max_steps=1).capped == [0]
    control = Scripted([(0, [1, 2], None)])
    report = llm.run_burst(control, max_steps=2)
    assert report.rows_drawn == 2
    assert torch.equal(control.seen[1][1][0], llm.next_token_logprobs_uncached([1, 2, report.tokens[0][0]]))


def test_async_burst_with_draws_on_the_event_loop(llm) -> None:
    """``await llm.burst(...)`` runs in a worker thread: a draw may wait on a coroutine of
    the caller's loop (genlm-control's pattern) and the loop keeps serving other calls."""

    async def main() -> tuple[Any, list[torch.Tensor]]:
        loop = asyncio.get_running_loop()
        control = Scripted([(0, [1, 2], None), (1, [3], None)])
        plain = control.draw

        async def on_loop(logits, handles):
            return plain(logits, handles)

        control.draw = lambda logits, handles: asyncio.run_coroutine_threadsafe(
            on_loop(logits, handles), loop
        ).result()
        report, other = await asyncio.gather(
            llm.burst(control, max_steps=5), llm.batch_next_token_logprobs([[5], [6, 7]])
        )
        return report, other

    report, other = asyncio.run(main())
    assert report.rows_drawn == 10 and other.shape == (2, llm.vocab_size)


class KeptRows(MockEngine):
    """An engine with a decode step of its own (as one keeping a decode batch would)."""

    supports = frozenset({"decode"})

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[dict[int, tuple[int, ...]], set[int]]] = []
        self.ended: list[set[int]] = []

    def decode_step(self, rows, released):
        self.calls.append((dict(rows), set(released)))
        return self.forward(list(rows.values()))

    def end_burst(self, released):
        self.ended.append(set(released))


def test_an_engine_decode_step_gets_rows_and_releases() -> None:
    """Every step has rows; the burst's end is one end_burst with the handles still held."""
    engine = KeptRows()
    llm = BaseLogprobBackend(engine)
    try:
        control = Scripted([(0, [1], None), (1, [1], None)], pick=lambda h, r: 3)
        control.after_step = lambda step, handles: control.aborts.append(0) if step == 1 else None
        llm.run_burst(control, max_steps=3)
        assert [set(rows) for rows, _ in engine.calls] == [{0, 1}, {1}, {1}]
        assert [released for _, released in engine.calls] == [set(), {0}, set()]
        assert engine.ended == [{1}]
        assert engine.calls[1][0][1] == (1, 3)  # duplicate contexts are each handle's own row
        # a failing control: the burst still ends once, with every handle it held
        engine.ended.clear()
        control = Scripted([(0, [1], None), (1, [2], None)])

        def fail(step: int, handles: list[int]) -> None:
            raise RuntimeError("control")

        control.after_step = fail
        with pytest.raises(RuntimeError, match="control"):
            llm.run_burst(control, max_steps=3)
        assert engine.ended == [{0, 1}]
    finally:
        llm.close()


class DeclaresBurst(KeptRows):
    """Writes a decode step but declares "burst": the core's path, chosen from supports alone."""

    supports = frozenset({"burst"})


def test_the_path_is_chosen_from_supports_alone() -> None:
    """ "burst" runs the core's decode step (forward, never the engine's decode_step or
    end_burst); "decode" runs the engine's; both give the mock's rows, the uncached model's."""
    for cls, own in ((DeclaresBurst, False), (KeptRows, True)):
        engine = cls()
        llm = BaseLogprobBackend(engine)
        try:
            assert llm.supports_burst
            control = Scripted([(0, [1, 2], None), (1, [4], None)])
            llm.run_burst(control, max_steps=3)
            assert bool(engine.calls) is own and bool(engine.ended) is own
            contexts = {0: [1, 2], 1: [4]}
            for handles, rows in control.seen:
                for h, row in zip(handles, rows):
                    want = llm.next_token_logprobs_uncached(contexts[h])
                    assert torch.equal(row, want)
                    contexts[h].append(int(torch.argmax(row)))
        finally:
            llm.close()


def test_decode_needs_both_methods_and_the_error_says_what_to_write() -> None:
    class StepOnly(MockEngine):
        supports = frozenset({"decode"})

        def decode_step(self, rows, released):
            return self.forward(list(rows.values()))

    class Nothing(MockEngine):
        supports = frozenset({"decode"})

    for cls, missing in ((StepOnly, "end_burst"), (Nothing, "decode_step")):
        with pytest.raises(
            TypeError, match=f"declares 'decode' but does not define {missing}\\(\\).*'burst'"
        ):
            BaseLogprobBackend(cls())


def test_drive_takes_its_old_keyword_names_with_a_warning(llm) -> None:
    from genlm_core.engine.burst import drive

    ended: list[frozenset[int]] = []
    with pytest.warns(DeprecationWarning, match="next_logprobs"):
        report = drive(
            Scripted([(0, [1], None)]),
            2,
            validate=llm.validate,
            step=llm.bursts.step_logprobs,
            release=ended.append,
            vocab_size=llm.vocab_size,
            max_context_length=None,
        )
    assert report.rows_drawn == 2 and ended == [frozenset({0})]
    with pytest.raises(TypeError, match="unexpected keyword arguments stride"):
        drive(Scripted([]), 1, validate=llm.validate, next_logprobs=None, end_burst=None,
              vocab_size=4, max_context_length=None, stride=1)  # fmt: skip


def test_backends_without_the_capability_say_so() -> None:
    class Plain(Engine):
        def __init__(self) -> None:
            self.inner = MockEngine()
            self.tokenizer, self.byte_vocab = self.inner.tokenizer, self.inner.byte_vocab

        def forward(self, contexts):
            return self.inner.forward(contexts)

    llm = BaseLogprobBackend(Plain())
    try:
        assert llm.supports_burst is False
        with pytest.raises(NotImplementedError, match="supports_burst is False"):
            llm.run_burst(Scripted([(0, [1], None)]), max_steps=1)
    finally:
        llm.close()


def test_the_documented_smc_program_runs_as_a_burst() -> None:
    """docs/bursts.md's complete example, its SMC class run on the tiny Llama (hf): the
    particles it keeps are the report's drawn tokens (re-adds replay a resampled prefix)."""
    import re
    from pathlib import Path

    from genlm_core.testing import models

    text = (Path(__file__).parents[1] / "docs" / "bursts.md").read_text()
    code = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "class SMC" in b)
    namespace: dict[str, Any] = {}
    exec(code.split("\nllm = genlm_core.load")[0], namespace)
    llm = genlm_core.load("hf", model=str(models.tiny_llama()), dtype="float32")
    try:
        smc = namespace["SMC"](llm, [1, 45, 496], n=6, max_tokens=7, seed=3)
        report = llm.run_burst(smc, max_steps=8)
        assert all(smc.done) and report.aborted >= 6 and report.added > 6
        assert all(len(t) <= 7 for t in smc.tokens) and all(map(math.isfinite, smc.log_w))
        # two steps, so no resampling: each weight is the sum over its draws of log p - log q,
        # q the model at temperature 1.3 normalised here in float64 (not by draw_rows)
        smc = namespace["SMC"](llm, [1, 45, 496], n=6, max_tokens=2, seed=4)
        expected = [0.0] * 6
        draw = smc.draw

        M = [1.0]

        def checked(logits, handles):
            M[0] = max(M[0], float(logits[torch.isfinite(logits)].abs().max()))
            particles = [smc.particle_of[h] for h in handles]
            drawn = draw(logits, handles)
            log_q = torch.log_softmax(logits.double() / 1.3, dim=-1)
            for r, (i, tok) in enumerate(zip(particles, drawn.tolist())):
                expected[i] += float(logits[r, tok].double() - log_q[r, tok])
            return drawn

        smc.draw = checked
        report = llm.run_burst(smc, max_steps=3)
        assert smc.steps <= 2 and report.rows_drawn >= 6
        # per draw, the example's log q (float32 logits / 1.3, draw_rows' float32 exp and
        # 256-token float32 block sums) against the float64 one: the division moves each
        # value by u |x| (u = 2^-24, |x| <= M, the rows' largest finite |logit|) in log q and
        # in its normaliser, 2 u M; exp is within 2 u relative; a block sum of 256 terms
        # within 4 sqrt(256) u relative (probabilistic bound). Two draws per weight.
        bound = 2 * (2 * M[0] + 2 + 64) * 2**-24
        assert max(abs(a - b) for a, b in zip(smc.log_w, expected)) <= bound, (smc.log_w, expected)
    finally:
        llm.close()


def test_the_programs_step_is_advance_and_the_old_name_warns(llm) -> None:
    from genlm_core.testing.smc_program import SMCProgram

    rows = llm.batch_next_token_logprobs_sync([[1, 2]] * 3)
    a, b = SMCProgram([1, 2], [], n=3, seed=5), SMCProgram([1, 2], [], n=3, seed=5)
    with pytest.warns(DeprecationWarning, match="advance"):
        old = b.step(rows, [0, 1, 2])
    assert a.advance(rows, [0, 1, 2]) == old and a.log_w == b.log_w
