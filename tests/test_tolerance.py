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


def test_the_logit_scale_is_recovered_and_pooled_over_distinct_rows() -> None:
    """``logit_scale`` finds the scale a row was computed at (a temperature), weighs rows
    by their spread, counts a repeated row once and gives masked tokens no mass."""
    from genlm_core.testing.tolerance import logit_scale

    gen = torch.Generator().manual_seed(0)
    want = torch.log_softmax(2.0 * torch.randn(5, 300, generator=gen, dtype=torch.float64), -1)
    got = torch.log_softmax(1.03 * want, -1)
    t, n = logit_scale(got, want)
    assert abs(t - 0.03) < 1e-9 and 1 < n <= 5
    assert logit_scale(torch.cat([got, got]), torch.cat([want, want])) == (t, n)  # repeats count once
    masked = want.clone()
    masked[:, :10] = -torch.inf
    masked = torch.log_softmax(masked, -1)
    t_masked, _ = logit_scale(torch.log_softmax(1.03 * masked, -1), masked)
    assert abs(t_masked - 0.03) < 1e-9
    assert logit_scale(torch.zeros(3, 4), torch.zeros(3, 4)) == (0.0, 0.0)  # flat rows: no spread


def test_the_scale_bound_shrinks_with_the_rows_and_resolves_a_3_percent_scale() -> None:
    """Independent zero-mean errors: ``lam (e1 + e2) / sqrt(n)``. The tiny models need 66
    rows for a 1.03 scale to be twice the bound in bfloat16, 2 in float16, 1 in float32."""
    from genlm_core.testing.tolerance import rows_to_resolve, scale_bound

    shape = tiny_shape()
    one = scale_bound(shape, 1, "bfloat16")
    assert one == pytest.approx(4 * 2 * shape.relative_error("bfloat16"))
    assert scale_bound(shape, 100, "bfloat16") == pytest.approx(one / 10)
    assert [rows_to_resolve(shape, d) for d in ("bfloat16", "float16", "float32")] == [66, 2, 1]
    assert scale_bound(shape, 66, "bfloat16") * 2 <= 0.03


def test_assert_rows_close_fails_a_scale_every_row_shares() -> None:
    """A 1.03 logit scale on 100 rows of the tiny models' spread (logits of standard
    deviation 2 over 1024 tokens): every entry is inside the bfloat16 tail bound, the rows'
    common scale is twice its pooled bound."""
    from genlm_core.testing.tolerance import RECORDED, BoundExceeded, logit_scale, row_atol, scale_bound

    gen = torch.Generator().manual_seed(1)
    rows = torch.log_softmax(2.0 * torch.randn(100, 1024, generator=gen, dtype=torch.float64), -1)
    scaled = torch.log_softmax(1.03 * rows, -1)
    assert row_diff(scaled, rows) < row_atol(tiny_shape(), row_magnitude(rows), "bfloat16") / 2
    held = len(RECORDED)
    with pytest.raises(BoundExceeded, match="logit scale 1\\+0.03, 9") as exc:
        assert_rows_close(scaled, rows, tiny_shape(), dtype="bfloat16")
    del RECORDED[held:]  # a wrong row's passing tail says nothing of correct paths
    assert exc.value.ratio > 2
    t, n = logit_scale(scaled[:3], rows[:3])  # 3 rows cannot resolve it
    assert t == pytest.approx(0.03) and t < scale_bound(tiny_shape(), n, "bfloat16")


def test_measuring_records_instead_of_failing() -> None:
    from genlm_core.testing.tolerance import RowComparisons, measuring

    with measuring() as seen:
        assert_within(2.0, 1.0, "over")
        rows = RowComparisons(lambda g, w, what: assert_within(float((g - w).abs().max()), 1.0, what), "all")
        for i in range(9):
            rows.add(torch.tensor([float(i)]), torch.tensor([0.0]), f"row {i}")
    assert seen[0] == ("over", 2.0, 1.0)
    assert [w for w, *_ in seen].count("all (the first 8)") == 1  # pooled at 8 rows
