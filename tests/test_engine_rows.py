"""Rows that are no distribution (a NaN score, every token -inf) from any engine: the core
refuses them where it normalises every engine's rows (genlm_core.engine.row_checks).

Oracle: engines written here whose forward returns a NaN row for contexts ending in
token 5 and an all -inf row for those ending in 6, and the finite rows of every other
context (their values known: a fixed table). A bad row's caller gets an
EngineOutputError naming the engine and the row; the batch's other callers get their
rows; nothing bad is cached; the backend keeps answering; a burst never hands a bad row
to its control (where an SMC program would turn it into a weight)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from genlm_core.config import BackendConfig
from genlm_core.engine import BaseLogprobBackend, Engine, Token
from genlm_core.engine.row_checks import EngineOutputError, unreadable_rows

V = 8
NAN_TOKEN, MASKED_TOKEN = 5, 6
BAD = {NAN_TOKEN: "NaN score", MASKED_TOKEN: "no finite score"}


class Tok:
    eos_token_id = 7


class BadRowsEngine(Engine):
    """Logits of a fixed table by last token; a NaN row after token 5, all -inf after 6."""

    supports = frozenset({"burst"})

    def __init__(self, returns: str = "logits") -> None:
        self.tokenizer = Tok()
        self.byte_vocab = [Token(i, bytes([97 + i])) for i in range(V)]
        self.table = torch.arange(V * V, dtype=torch.float32).reshape(V, V) % 5
        self.returns = returns  # type: ignore[misc]
        self.calls: list[list[tuple[int, ...]]] = []

    def row(self, ctx: tuple[int, ...]) -> torch.Tensor:
        last = ctx[-1]
        if last == NAN_TOKEN:
            row = self.table[last].clone()
            row[3] = float("nan")
            return row
        if last == MASKED_TOKEN:
            return torch.full((V,), float("-inf"))
        return self.table[last] if self.returns == "logits" else torch.log_softmax(self.table[last], -1)

    def forward(self, contexts: list[tuple[int, ...]]) -> Any:
        self.calls.append(list(contexts))
        rows = [self.row(c) for c in contexts]
        return torch.stack(rows) if self.returns == "logits" else rows  # a batch, or rows of their own


class KeptBadRows(BadRowsEngine):
    """The same rows through a decode step of the engine's own."""

    supports = frozenset({"decode"})

    def decode_step(self, rows, released):
        return self.forward(list(rows.values()))

    def end_burst(self, released):
        pass


def good(llm: BaseLogprobBackend, last: int) -> torch.Tensor:
    return torch.log_softmax(llm.engine.table[last], -1)


ENGINES = [pytest.param("logits", id="logits-batch"), pytest.param("logprobs", id="logprob-rows")]


@pytest.mark.parametrize("returns", ENGINES)
@pytest.mark.parametrize("bad", [NAN_TOKEN, MASKED_TOKEN])
async def test_a_bad_row_is_its_callers_error_and_the_others_are_served(returns: str, bad: int) -> None:
    engine = BadRowsEngine(returns)
    # 'deadline' holds the batch open, so the three callers share one engine call
    llm = BaseLogprobBackend(engine, BackendConfig(batch_policy="deadline", timeout=0.2), name="test")
    try:
        results = await asyncio.wait_for(
            asyncio.gather(
                llm.next_token_logprobs([1, 2]),
                llm.next_token_logprobs([3, bad]),
                llm.next_token_logprobs([4]),
                return_exceptions=True,
            ),
            timeout=30,
        )
        assert engine.calls == [[(1, 2), (3, bad), (4,)]]  # one batch
        assert torch.equal(results[0], good(llm, 2)) and torch.equal(results[2], good(llm, 4))
        error = results[1]
        assert isinstance(error, EngineOutputError)
        message = str(error)
        assert "the engine BadRowsEngine returned" in message and BAD[bad] in message
        assert f"row 1 of its batch (context (3, {bad}))" in message
        assert "BadRowsEngine.forward()" in message and "dtype='float32'" in message  # what to check
        # nothing bad cached: the good rows are, the bad context is computed again (and refused again)
        cache = llm.output_cache
        assert (1, 2) in cache and (4,) in cache and (3, bad) not in cache
        with pytest.raises(EngineOutputError, match=f"context \\(3, {bad}\\)"):
            await llm.next_token_logprobs([3, bad])
        assert engine.calls[-1] == [(3, bad)]
        # every entry point refuses it, and the backend keeps answering
        with pytest.raises(EngineOutputError, match="row 0 of its batch"):
            llm.next_token_logprobs_sync([bad])
        with pytest.raises(EngineOutputError, match="row 1 of its batch"):
            llm.batch_next_token_logprobs_sync([[2], [bad], [3]])
        with pytest.raises(EngineOutputError):
            await llm.batch_next_token_logprobs([[2], [bad]])
        with pytest.raises(EngineOutputError):
            llm.next_token_logprobs_uncached([bad])
        with pytest.raises(EngineOutputError):
            await llm.sample([1, bad], max_tokens=2)
        assert llm.healthy
        assert torch.equal(llm.batch_next_token_logprobs_sync([[2], [3]])[1], good(llm, 3))
        assert torch.equal(await llm.next_token_logprobs([0, 1]), good(llm, 1))
    finally:
        llm.close()


class Recorder:
    """A control drawing token ``pick`` for every row; records every row it was shown."""

    def __init__(self, prompts: dict[int, list[int]], pick: int) -> None:
        self.adds = [(h, p, None) for h, p in prompts.items()]
        self.pick = pick
        self.seen: list[torch.Tensor] = []

    def draw(self, logprobs: torch.Tensor, handles: list[int]) -> list[int]:
        self.seen.append(logprobs.clone())
        return [self.pick] * len(handles)

    def drain_adds(self):
        out, self.adds = self.adds, []
        return out

    def drain_aborts(self):
        return []

    def on_burst_end(self) -> None:
        pass


@pytest.mark.parametrize("own_decode_step", [False, True], ids=["core-decode-step", "engine-decode-step"])
@pytest.mark.parametrize("bad", [NAN_TOKEN, MASKED_TOKEN])
def test_a_burst_never_hands_a_bad_row_to_its_control(own_decode_step: bool, bad: int) -> None:
    """The step after a row draws the bad token fails with the error naming it; the control
    (whose draws become SMC weights) only ever saw finite rows; the backend serves on."""
    llm = BaseLogprobBackend((KeptBadRows if own_decode_step else BadRowsEngine)(), name="test")
    try:
        control = Recorder({0: [1], 1: [2, 3]}, pick=bad)
        call = "decode_step" if own_decode_step else "forward"
        with pytest.raises(
            EngineOutputError, match=f"row 0 of its batch \\(context \\(1, {bad}\\)\\).*{call}"
        ):
            llm.run_burst(control, max_steps=3)
        assert len(control.seen) == 1 and all(bool(torch.isfinite(rows).all()) for rows in control.seen)
        report = llm.run_burst(Recorder({0: [1], 1: [2, 3]}, pick=2), max_steps=3)
        assert report.rows_drawn == 6 and llm.healthy
    finally:
        llm.close()


def test_the_check_is_one_reduction_over_the_batch_or_the_rows() -> None:
    """unreadable_rows: a (rows, vocab) batch or a list of rows alike; finite rows pass,
    a NaN, a +inf or a row with no finite score is named by its index."""
    rows = [torch.log_softmax(torch.arange(4.0), -1) for _ in range(5)]
    rows[1] = torch.tensor([0.0, float("nan"), -1.0, -2.0])
    rows[3] = torch.full((4,), float("-inf"))
    rows[4] = torch.tensor([float("inf"), 0.0, 0.0, 0.0])
    partly_masked = torch.tensor([0.0, float("-inf"), float("-inf"), float("-inf")])
    for scores in (rows, torch.stack(rows)):
        assert unreadable_rows(scores) == [1, 3, 4]
    assert unreadable_rows([partly_masked, rows[0]]) == [] and unreadable_rows([]) == []


class PaddedRowsEngine(Engine):
    """Logits wider than the tokenizer's vocabulary (an embedding padded to a multiple of 64,
    as many checkpoints have): ``PAD`` extra columns the core cuts off. Contexts ending in
    token 1: every real token -inf, the padded columns finite (a row no caller may read);
    ending in 2: NaN in the padded columns only (a readable row: the cut row is finite).
    ``as_rows``: a list of rows (genlm-hf's eager path), else one batch."""

    PAD = 3
    supports = frozenset({"burst"})

    def __init__(self, as_rows: bool) -> None:
        self.tokenizer = Tok()
        self.byte_vocab = [Token(i, bytes([97 + i])) for i in range(V)]
        self.as_rows = as_rows
        self.masked = True  # token 1's row masked (False: the engine recovered)

    def row(self, ctx: tuple[int, ...]) -> torch.Tensor:
        row = torch.cat([torch.arange(V, dtype=torch.float32) % 3, torch.zeros(self.PAD)])
        if ctx[-1] == 1 and self.masked:
            row[:V] = float("-inf")
        if ctx[-1] == 2:
            row[V:] = float("nan")
        return row

    def forward(self, contexts: list[tuple[int, ...]]) -> Any:
        rows = [self.row(c) for c in contexts]
        return rows if self.as_rows else torch.stack(rows)


@pytest.mark.parametrize("as_rows", [True, False], ids=["rows", "batch"])
def test_rows_are_checked_as_cut_to_the_vocabulary(as_rows: bool) -> None:
    """What a caller reads is the row cut to the tokenizer's vocabulary, so that is what is
    checked, whether the engine hands back one batch or a list of rows: every real token
    -inf (finite padded columns) is refused and never cached, and NaN in the padded
    columns only is served as the batch path serves it."""
    engine = PaddedRowsEngine(as_rows)
    llm = BaseLogprobBackend(engine, BackendConfig(), name="test")
    try:
        with pytest.raises(EngineOutputError, match="no finite score"):
            llm.next_token_logprobs_sync([3, 1])
        engine.masked = False  # the engine recovers: the context's row is computed again
        row = llm.next_token_logprobs_sync([3, 1])
        assert torch.isfinite(row).all() and row.shape == (V,)
        served = llm.next_token_logprobs_sync([3, 2])
        want = torch.log_softmax(torch.arange(V, dtype=torch.float32) % 3, -1)
        assert torch.equal(served, want)
        assert torch.equal(llm.batch_next_token_logprobs_sync([[4], [2]])[1], want)
    finally:
        llm.close()
