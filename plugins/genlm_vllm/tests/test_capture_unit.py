"""Row-to-request mapping of the capture processor, driven by synthetic BatchUpdates
(the same sequences vLLM emits for chunked prefill, preemption, swaps and moves)."""

from __future__ import annotations

import pytest
import torch
from genlm_vllm.capture import TAG_KEY, CaptureLogitsProcessor, discard, pop_captured
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality


def _params(tag: str | None) -> SamplingParams:
    return SamplingParams(max_tokens=1, extra_args=None if tag is None else {TAG_KEY: tag})


def _logits(n: int, V: int = 5) -> torch.Tensor:
    # row i, step s -> all entries equal 100*s + i: identifies which row was captured
    return torch.arange(n, dtype=torch.float32)[:, None].repeat(1, V)


def _step(proc: CaptureLogitsProcessor, n: int, step: int) -> torch.Tensor:
    logits = _logits(n) + 100 * step
    out = proc.apply(logits)
    assert out is logits  # unchanged, same tensor
    return logits


def test_add_move_swap_remove_and_last_write_wins() -> None:
    proc = CaptureLogitsProcessor(None, torch.device("cpu"), False)  # type: ignore[arg-type]
    outs = {t: [] for t in "abc"}
    tags = ["u:a", "u:b", "u:c"]
    discard(tags)
    proc.update_state(
        BatchUpdate(
            batch_size=4,
            removed=[],
            added=[
                (0, _params("u:a"), [1], outs["a"]),
                (1, _params(None), [1], []),
                (2, _params("u:b"), [1], outs["b"]),
                (3, _params("u:c"), [1], outs["c"]),
            ],
            moved=[],
        )
    )
    _step(proc, 4, 1)  # partial prefill of everyone
    # untagged row 1 leaves; row 3 (c) moves into it; a and b swap
    proc.update_state(
        BatchUpdate(
            batch_size=3,
            removed=[1],
            added=[],
            moved=[(3, 1, MoveDirectionality.UNIDIRECTIONAL), (0, 2, MoveDirectionality.SWAP)],
        )
    )
    assert {i: t for i, (t, _) in proc.rows.items()} == {1: "u:c", 0: "u:b", 2: "u:a"}
    _step(proc, 3, 2)  # final chunk for all three: last write wins
    outs["a"].append(7)  # a's token was kept
    _step(proc, 3, 3)  # a later step must not overwrite a's row
    a, b, c = pop_captured(tags)
    assert float(a[0]) == 200 + 2  # step 2, row 2
    assert float(b[0]) == 300 + 0  # b still had no output token at step 3
    assert float(c[0]) == 300 + 1
    assert pop_captured(tags) == [None, None, None]


def test_preempted_request_is_recaptured_on_readmission() -> None:
    proc = CaptureLogitsProcessor(None, torch.device("cpu"), False)  # type: ignore[arg-type]
    out: list[int] = []
    proc.update_state(BatchUpdate(batch_size=1, removed=[], added=[(0, _params("p:x"), [1], out)], moved=[]))
    _step(proc, 1, 1)  # first chunk
    proc.update_state(BatchUpdate(batch_size=0, removed=[0], added=[], moved=[]))  # preempted
    assert proc.rows == {}
    _step(proc, 1, 2)  # another request runs in row 0: not captured for x
    proc.update_state(BatchUpdate(batch_size=2, removed=[], added=[(1, _params("p:x"), [1], out)], moved=[]))
    _step(proc, 2, 3)  # recomputed, completes
    (x,) = pop_captured(["p:x"])
    assert float(x[0]) == 300 + 1


def test_untagged_request_replacing_a_row_clears_it() -> None:
    proc = CaptureLogitsProcessor(None, torch.device("cpu"), False)  # type: ignore[arg-type]
    proc.update_state(BatchUpdate(batch_size=1, removed=[], added=[(0, _params("q:y"), [1], [])], moved=[]))
    proc.update_state(BatchUpdate(batch_size=1, removed=[], added=[(0, _params(None), [1], [])], moved=[]))
    _step(proc, 1, 1)
    assert pop_captured(["q:y"]) == [None]


def test_validate_params_rejects_non_string_tags() -> None:
    with pytest.raises(ValueError):
        CaptureLogitsProcessor.validate_params(SamplingParams(extra_args={TAG_KEY: 3}))
    CaptureLogitsProcessor.validate_params(SamplingParams(extra_args={TAG_KEY: "ok"}))
    CaptureLogitsProcessor.validate_params(SamplingParams())
