"""`genlm compare` / genlm_core.tools.compare: pairwise statistics and the exit status.

The statistics are checked against a hand computation; the end-to-end checks run
hf and mlx (no vLLM here: see plugins/genlm_vllm/tests/test_vllm_compare.py) on the
real SmolLM2 folder and on a copy whose rope_theta is wrong.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from genlm_core.tools.cli import main
from genlm_core.tools.compare import DEFAULT_PROMPTS, compare_rows, read_prompts


def test_pair_statistics_match_a_hand_computation() -> None:
    pa = [[0.5, 0.25, 0.25], [0.1, 0.2, 0.7]]
    pb = [[0.5, 0.25, 0.25], [0.4, 0.4, 0.2]]
    a = torch.tensor(pa).log()
    b = torch.tensor(pb).log()
    (pair,) = compare_rows({"x": a, "y": b})
    kl1 = sum(p * math.log(p / q) for p, q in zip(pa[1], pb[1]))
    dmax = max(abs(math.log(p) - math.log(q)) for p, q in zip(pa[1], pb[1]))
    assert (pair.a, pair.b, pair.n_contexts, pair.worst_context) == ("x", "y", 2, 1)
    assert pair.per_context_max_abs[0] == 0.0
    # inputs pass through float32 logs: relative rounding 6e-8 of values <= 2.3
    assert pair.max_abs == pytest.approx(dmax, abs=1e-6)
    assert pair.max_kl == pytest.approx(kl1, abs=1e-6)
    assert pair.mean_kl == pytest.approx(kl1 / 2, abs=1e-6)
    assert pair.top1_agree == 1  # argmax 0 == 0, then 2 != 0 (ties go to the first)
    assert not pair.ok(0.1) and pair.ok(dmax + 1e-6)


def test_shapes_must_match() -> None:
    with pytest.raises(ValueError, match="different shapes"):
        compare_rows({"x": torch.zeros(2, 3), "y": torch.zeros(2, 4)})


def test_prompt_files(tmp_path) -> None:
    (tmp_path / "p.txt").write_text("one\n\ntwo words\n")
    assert read_prompts(tmp_path / "p.txt") == ["one", "two words"]
    (tmp_path / "p.json").write_text(json.dumps(["a\nb", "c"]))
    assert read_prompts(tmp_path / "p.json") == ["a\nb", "c"]
    (tmp_path / "e.txt").write_text("\n")
    with pytest.raises(ValueError, match="no prompts"):
        read_prompts(tmp_path / "e.txt")


def test_default_prompts_share_prefixes_and_include_a_long_context() -> None:
    assert any(p != q and q.startswith(p) for p in DEFAULT_PROMPTS for q in DEFAULT_PROMPTS)
    assert max(map(len, DEFAULT_PROMPTS)) > 1000 and min(map(len, DEFAULT_PROMPTS)) < 5


@pytest.fixture(scope="module")
def smol_path():
    import model_paths

    return model_paths.smollm2()


@pytest.mark.slow
def test_compare_passes_on_smollm2_and_fails_on_a_wrong_rope_theta(smol_path, tmp_path, capsys) -> None:
    assert main(["compare", "--backends", "hf,mlx", "--model", str(smol_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["backends"]["mlx"]["dtype"] == "float32"
    assert len(report["contexts"]) == len(DEFAULT_PROMPTS)

    # the wrong model on short prompts (cheap on mlx's CPU BLAS): rope_theta shows at once
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The capital of France is\nOnce upon a time, in a small village by the sea,\n")
    wrong = tmp_path / "wrong"
    shutil.copytree(smol_path, wrong)
    cfg = json.loads((wrong / "config.json").read_text())
    cfg["rope_theta"] = cfg["rope_parameters"]["rope_theta"] = 10000.0  # SmolLM2 uses 100000
    (wrong / "config.json").write_text(json.dumps(cfg))
    args = ["compare", "--backends", "hf,mlx", "--model", str(smol_path), "--prompts", str(prompts)]
    args += ["--opt", f"mlx:model={wrong}"]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "hf vs mlx" in out


def test_bad_arguments_are_one_line_errors(capsys) -> None:
    assert main(["compare", "--backends", "mock"]) == 2
    assert "at least two" in capsys.readouterr().err
    assert main(["compare", "--backends", "mock,hf", "--opt", "vllm:x=1"]) == 2
    assert "not in --backends" in capsys.readouterr().err
