"""Decode batches (genlm_hf.decode): a burst's KV kept between its steps, checked against
the step loop (exact), the uncached model (every row a burst drew from) and the counters."""

from __future__ import annotations

import pytest
import torch
from hf_helpers import ATOL, load_hf, max_diff

from genlm_core.testing.burst import ProgramControl, SMCProgram, check_parity, run_burst, run_steps


@pytest.fixture(scope="module")
def small_batches(tiny_llama_path):
    """Batches of 4: ten particles make three batches, which rows ending and resampling
    reshuffle."""
    llm = load_hf(tiny_llama_path, batch_size=4)
    yield llm
    llm.close()


def _prompt(llm, n: int = 7) -> list[int]:
    g = torch.Generator().manual_seed(11)
    return torch.randint(3, llm.vocab_size, (n,), generator=g).tolist()


def _engine(llm) -> dict:
    return dict(llm.stats()["engine"])


def test_burst_resumes_kept_batches_and_matches_steps_exactly(small_batches) -> None:
    llm = small_batches
    before = _engine(llm)
    out = check_parity(llm, _prompt(llm), atol=ATOL, seeds=(0, 1, 2), n=10, max_tokens=9)
    after = _engine(llm)
    assert out == {"exact": 3, "statistical": 0}
    assert after["decode_batches_resumed"] > before["decode_batches_resumed"]
    assert after["decode_batches"] == 0  # flushed when each burst ended


def test_a_burst_computes_each_token_once(small_batches) -> None:
    """The burst runs exactly the tokens the step loop runs (one per distinct context a
    step, the prompt once), though its steps never go through the prefix cache."""
    llm = small_batches
    prompt = _prompt(llm)
    computed = []
    for run in (run_steps, run_burst):
        llm.clear_cache()
        before = _engine(llm)["tokens_computed"]
        run(llm, SMCProgram(prompt, llm.eos_token_ids, n=10, max_tokens=9, seed=4))
        computed.append(_engine(llm)["tokens_computed"] - before)
    assert computed[0] == computed[1]


def test_the_kept_rows_reach_the_prefix_cache_when_the_burst_ends(small_batches) -> None:
    llm = small_batches
    llm.clear_cache()
    program = SMCProgram(_prompt(llm), llm.eos_token_ids, n=10, max_tokens=9, seed=5)
    result = run_burst(llm, program)
    # each particle's last token was drawn, never run: its context minus that token is cached
    ends = {tuple(program.prompt + t) for t in result.tokens}
    before = _engine(llm)
    rows = llm.batch_next_token_logprobs_sync([list(c) for c in ends])
    after = _engine(llm)
    assert after["tokens_computed"] - before["tokens_computed"] == len(ends)
    ref = torch.stack([llm.next_token_logprobs_uncached(list(c)) for c in ends])
    assert max_diff(rows, ref) <= ATOL


class RecordingControl(ProgramControl):
    """The program's control, recording every row it is handed with its context, and
    doing what a program may do between steps: ask the backend for other rows (another
    caller), clear the caches, or fail."""

    def __init__(self, llm, program: SMCProgram, *, clear_at: int = -1, fail_at: int = -1) -> None:
        super().__init__(program)
        self.llm, self.clear_at, self.fail_at = llm, clear_at, fail_at
        self.seen: list[tuple[tuple[int, ...], torch.Tensor]] = []
        self.other: list[tuple[list[int], torch.Tensor]] = []
        self.calls = 0

    def draw(self, logits, handles):
        contexts = [tuple(self.program.context(self.particle[h])) for h in handles]
        self.seen += list(zip(contexts, logits.clone()))
        other = self.program.prompt[:3] + [self.calls + 5]
        self.other.append((other, self.llm.next_token_logprobs_sync(other)))
        if self.calls == self.clear_at:
            self.llm.clear_cache()
        if self.calls == self.fail_at:
            raise RuntimeError("the control failed")
        self.calls += 1
        return super().draw(logits, handles)


def test_every_row_of_a_burst_is_the_models_under_interleaved_calls_and_a_cache_clear(small_batches) -> None:
    """Another caller's rows between steps, and a cache clear in the middle of the burst
    (what a LoRA switch does): every row the control drew from is the uncached model's
    row of its context, and so is every row the other caller got."""
    llm = small_batches
    llm.clear_cache()
    control = RecordingControl(
        llm, SMCProgram(_prompt(llm), llm.eos_token_ids, n=10, max_tokens=9, seed=6), clear_at=4
    )
    llm.run_burst(control, max_steps=20)
    assert control.calls > 6 and len(control.seen) > 40
    contexts = list(dict.fromkeys(c for c, _ in control.seen))
    ref = dict(zip(contexts, (llm.next_token_logprobs_uncached(list(c)) for c in contexts)))
    assert max(max_diff(row, ref[c]) for c, row in control.seen) <= ATOL
    assert max(max_diff(row, llm.next_token_logprobs_uncached(c)) for c, row in control.other) <= ATOL


def test_a_failing_control_leaves_no_kept_batch(small_batches) -> None:
    llm = small_batches
    llm.clear_cache()
    control = RecordingControl(
        llm, SMCProgram(_prompt(llm), llm.eos_token_ids, n=10, max_tokens=9, seed=7), fail_at=3
    )
    with pytest.raises(RuntimeError, match="the control failed"):
        llm.run_burst(control, max_steps=20)
    assert _engine(llm)["decode_batches"] == 0
    # and the backend answers as before
    ctx = _prompt(llm) + [9]
    assert max_diff(llm.next_token_logprobs_sync(ctx), llm.next_token_logprobs_uncached(ctx)) <= ATOL
