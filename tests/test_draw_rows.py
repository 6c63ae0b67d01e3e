"""draw_rows: one draw per row, in proportion to exp(row), checked against the exact
probabilities (a chi-square bound) and on the edges of the mass."""

from __future__ import annotations

import math

import pytest
import torch

from genlm_core.engine.sampling import draw_rows


def test_frequencies_follow_the_rows_unnormalised_and_masked() -> None:
    probs = torch.tensor([[0.5, 0.25, 0.125, 0.125, 0.0], [0.0, 0.1, 0.0, 0.3, 0.6]], dtype=torch.float64)
    n = 40_000
    # unnormalised (a constant added) and masked (-inf): drawn as the normalised row
    rows = (probs.log() + torch.tensor([[3.0], [-7.0]], dtype=torch.float64)).float()
    batch = rows.repeat_interleave(n, dim=0)
    drawn = draw_rows(batch, torch.Generator().manual_seed(0)).view(2, n)
    for r in range(2):
        counts = torch.bincount(drawn[r], minlength=5).double()
        assert counts[probs[r] == 0].sum() == 0  # masked tokens are never drawn
        support = probs[r] > 0
        expected = n * probs[r][support]
        chi2 = float(((counts[support] - expected) ** 2 / expected).sum())
        # df <= 3: P(chi2 > 25) < 2e-5
        assert chi2 < 25, (r, counts, expected)


def test_edges_of_the_mass() -> None:
    V = 49_152
    g = torch.Generator().manual_seed(1)
    only_last = torch.full((V,), -math.inf)
    only_last[-1] = 0.0
    only_first = torch.full((V,), -math.inf)
    only_first[0] = 0.0
    big = torch.zeros(V)
    big[1234] = 80.0  # exp(80) against 49k tokens of weight 1: token 1234 every time
    out = draw_rows(torch.stack([only_last, only_first, big]).repeat(200, 1), g).view(200, 3)
    assert (out[:, 0] == V - 1).all() and (out[:, 1] == 0).all() and (out[:, 2] == 1234).all()
    assert out.dtype == torch.int64
    assert draw_rows(only_last, g).tolist() == [V - 1]  # one row, shape (vocab,)


def test_the_generator_decides_the_draws() -> None:
    rows = torch.log_softmax(torch.randn(8, 1000, generator=torch.Generator().manual_seed(2)), dim=-1)
    a = draw_rows(rows, torch.Generator().manual_seed(5))
    b = draw_rows(rows, torch.Generator().manual_seed(5))
    assert torch.equal(a, b)


@pytest.mark.parametrize(
    "bad, match",
    [
        (torch.full((2, 4), -math.inf), "row 0 has no finite score"),
        (torch.tensor([[0.0, 1.0], [float("nan"), 0.0]]), "row 1 has no finite score"),  # NaN anywhere
        (torch.zeros(2, 3, 4), r"expected \(rows, vocab\)"),
    ],
)
def test_bad_rows_are_refused(bad: torch.Tensor, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        draw_rows(bad)


def test_the_log_mass_is_the_rows_logsumexp() -> None:
    rows = torch.randn(5, 70_001, generator=torch.Generator().manual_seed(3)) * 4
    rows[1, ::3] = -math.inf
    ids, log_mass = draw_rows(rows, torch.Generator().manual_seed(0), with_log_mass=True)
    ref = torch.logsumexp(rows.double(), dim=-1)
    assert ids.shape == (5,) and log_mass.dtype == torch.float64
    # float32 exp (2 u relative, u = 2^-24) and 256-token float32 block sums (4 sqrt(256) u
    # relative, probabilistic bound), summed over blocks in float64: the log of the mass
    # is off by at most (2 + 64) u absolute; ~1e-7 measured
    assert torch.allclose(log_mass, ref, rtol=0, atol=(2 + 4 * math.sqrt(256)) * 2**-24)
    assert torch.isfinite(rows[torch.arange(5), ids]).all()


def test_a_vocabulary_not_a_multiple_of_the_block() -> None:
    """The padding past the last token is never drawn, the last tokens are."""
    V = 1000  # 3 full blocks of 256 and 232 tokens
    rows = torch.full((3, V), -math.inf)
    rows[0, V - 1] = 0.0
    rows[1, V - 232] = 0.0
    rows[2, [0, V - 1]] = 0.0
    out = draw_rows(rows.repeat(300, 1), torch.Generator().manual_seed(4)).view(300, 3)
    assert (out[:, 0] == V - 1).all() and (out[:, 1] == V - 232).all()
    counts = torch.bincount(out[:, 2], minlength=V)
    assert counts[0] + counts[V - 1] == 300 and 100 < counts[0] < 200
