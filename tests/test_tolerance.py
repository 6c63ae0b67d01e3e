"""The derived tolerance (genlm_core.testing.tolerance) against a float64 oracle: it
holds what float32 rounding does to a real model on this machine's SIMD path, and it is
far tighter than what a wrong computation does."""

from __future__ import annotations

import json

import pytest
import torch

from genlm_core.testing.tolerance import (
    ModelShape,
    assert_rows_close,
    assert_within,
    headroom,
    model_shape,
    row_atol,
    row_diff,
    row_magnitude,
    tiny_shape,
)

pytestmark = pytest.mark.numeric


@pytest.fixture(scope="module")
def tiny_rows(tiny_llama_path):
    """The tiny Llama's rows for a few contexts: float64 (the oracle), float32 alone and
    float32 in one padded batch."""
    from transformers import AutoModelForCausalLM

    contexts = [[5, 6, 7], [100, 200, 300, 400, 500, 600, 700, 800, 9, 10, 11], [42]]
    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama_path), dtype=torch.float32).eval()

    def rows(m, dtype, batched: bool) -> torch.Tensor:
        with torch.no_grad():
            if not batched:
                out = [m(torch.tensor([c])).logits[0, -1].to(dtype) for c in contexts]
                return torch.stack(out).log_softmax(-1)
            n = max(map(len, contexts))
            ids = torch.tensor([[0] * (n - len(c)) + c for c in contexts])
            mask = torch.tensor([[0] * (n - len(c)) + [1] * len(c) for c in contexts])
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            return m(ids, attention_mask=mask, position_ids=pos).logits[:, -1].to(dtype).log_softmax(-1)

    f32_alone, f32_batch = rows(model, torch.float32, False), rows(model, torch.float32, True)
    f64 = rows(model.double(), torch.float64, False)
    return contexts, f64, f32_alone, f32_batch


def test_the_shape_is_read_from_the_checkpoint(tiny_llama_path, tiny_gpt2_path) -> None:
    assert model_shape(tiny_llama_path) == tiny_shape() == model_shape(tiny_gpt2_path)
    cfg = json.loads((tiny_llama_path / "config.json").read_text())
    assert tiny_shape() == ModelShape(
        max(cfg["hidden_size"], cfg["intermediate_size"]), cfg["num_hidden_layers"]
    )
    with pytest.raises(ValueError, match="config.json"):
        model_shape(tiny_llama_path / "tokenizer.json")
    with pytest.raises(ValueError, match="unit roundoff"):
        row_atol(tiny_shape(), 10.0, "int8")


def test_each_float32_path_is_within_one_path_bound_of_float64(tiny_rows) -> None:
    """The bound's premise, checked on this machine: one float32 computation is within
    ``one_path`` of the (nearly exact) float64 one, batched or alone."""
    _, f64, f32_alone, f32_batch = tiny_rows
    shape = tiny_shape()
    for f32 in (f32_alone, f32_batch):
        for got, want in zip(f32, f64):
            one = shape.one_path("float32", row_magnitude(want))
            assert_within(row_diff(got, want), one, "a float32 row against the float64 oracle")
    # and so two float32 paths are within the sum of theirs
    for a, b in zip(f32_alone, f32_batch):
        assert_rows_close(a, b, shape, what="batched against alone")


def test_a_wrong_computation_is_far_outside_the_bound(tiny_rows, tiny_llama_path) -> None:
    """The bound can fail: a context missing its first token (a lost KV entry, a wrong
    position) and another context are orders of magnitude beyond it."""
    contexts, f64, *_ = tiny_rows
    bound = row_atol(tiny_shape(), row_magnitude(f64[1]))
    from transformers import AutoModelForCausalLM

    assert bound < 1e-3
    assert row_diff(f64[0], f64[2]) > 100 * bound
    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama_path), dtype=torch.float64).eval()
    with torch.no_grad():
        shifted = model(torch.tensor([contexts[1][1:]])).logits[0, -1].log_softmax(-1)
    assert row_diff(shifted, f64[1]) > 100 * bound
    with pytest.raises(AssertionError, match="differs by"):
        assert_rows_close(shifted, f64[1], tiny_shape(), what="a shifted context")


def test_nan_and_mismatched_infinities_fail() -> None:
    a = torch.tensor([0.0, -1.0, -torch.inf])
    assert row_diff(a, a.clone()) == 0.0
    with pytest.raises(AssertionError, match="-inf at different entries"):
        row_diff(a, torch.tensor([0.0, -1.0, -50.0]))
    with pytest.raises(AssertionError, match="differs by nan"):
        assert_rows_close(torch.tensor([float("nan"), 0.0]), torch.tensor([0.0, 0.0]), tiny_shape())


def test_headroom_tightens_every_comparison(monkeypatch) -> None:
    monkeypatch.setenv("GENLM_TEST_HEADROOM", "4")
    assert headroom() == 4.0
    assert_within(0.2, 1.0, "well inside")
    with pytest.raises(AssertionError, match="headroom 4"):
        assert_within(0.3, 1.0, "inside the bound, not 4x inside")
    monkeypatch.setenv("GENLM_TEST_HEADROOM", "0.5")
    with pytest.raises(ValueError, match="GENLM_TEST_HEADROOM"):
        headroom()
