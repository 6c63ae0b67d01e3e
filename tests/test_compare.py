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


PROMPTS = ["The", "The capital of France is", "The capital of France is Paris. The capital of Italy is"]


@pytest.mark.numeric
def test_paths_compare_one_backend_with_itself_and_the_rows_are_the_backends(
    tiny_llama_path, tmp_path
) -> None:
    """`--paths`: each path's rows are what the backend's own calls give (recomputed here
    on a backend of its own: CPU kernels are deterministic for the same shapes, so equal
    calls give equal bits and the statistics must match exactly). In float32 the paths
    agree to reduction order: the bound derived from that arithmetic for the tiny model and
    the rows' magnitude (genlm_core.testing.tolerance), checked once the rows are at hand."""
    import genlm_core
    from genlm_core.testing.tolerance import assert_within, row_atol, row_magnitude, tiny_shape
    from genlm_core.tools.compare import PATHS, compare_paths, compare_rows, tokenize_prompts

    result = compare_paths("hf", model=str(tiny_llama_path), prompts=PROMPTS, options={"device": "cpu"})
    assert list(result.backends) == [f"hf:{p}" for p in PATHS]
    assert all(b["dtype"] == "float32" for b in result.backends.values())  # compare's default
    reused = {name: b["tokens_reused"] for name, b in result.backends.items()}
    assert reused["hf:alone"] == reused["hf:batched"] == 0 and reused["hf:extended"] > 0, reused

    llm = genlm_core.load("hf", model=str(tiny_llama_path), dtype="float32", device="cpu")
    try:
        contexts = tokenize_prompts(llm, PROMPTS)
        alone = torch.stack([llm.next_token_logprobs_uncached(c) for c in contexts])
        llm.clear_cache()
        batched = llm.batch_next_token_logprobs_sync(contexts)
        extended = []
        for c in contexts:
            llm.clear_cache()
            if len(c) > 1:
                llm.next_token_logprobs_sync(c[: len(c) // 2])
            extended.append(llm.next_token_logprobs_sync(c))
    finally:
        llm.close()
    bound = row_atol(tiny_shape(), row_magnitude(alone))
    for p in result.pairs:
        assert_within(p.max_abs, bound, f"compare --paths {p.a} vs {p.b}")
    want = compare_rows({"alone": alone, "batched": batched, "extended": torch.stack(extended)})
    got = result.pairs
    assert [(p.max_abs, p.top_k_max_abs, p.max_kl) for p in got] == [
        (p.max_abs, p.top_k_max_abs, p.max_kl) for p in want
    ]
    assert result.contexts == contexts


def test_top_k_difference_is_over_the_first_rows_most_likely_tokens() -> None:
    a = torch.tensor([[0.6, 0.3, 0.05, 0.05]]).log()
    b = torch.tensor([[0.55, 0.3, 0.1, 0.05]]).log()
    (pair,) = compare_rows({"a": a, "b": b}, top_k=2)
    assert pair.top_k == 2
    assert pair.top_k_max_abs == pytest.approx(math.log(0.6 / 0.55), abs=1e-6)  # tokens 0 and 1 only
    assert pair.max_abs == pytest.approx(math.log(0.1 / 0.05), abs=1e-6)  # token 2, outside the top 2


def test_paths_cli_bfloat16_and_float32_default(tiny_llama_path, capsys) -> None:
    """bfloat16 through the CLI (what the numerics docs show on SmolLM2), and float32
    stays what the CPU computes in by default: `load` without dtype on a float32
    checkpoint, and `genlm compare` without --dtype."""
    import genlm_core

    llm = genlm_core.load("hf", model=str(tiny_llama_path), device="cpu")
    try:
        assert llm.dtype == "float32"
    finally:
        llm.close()
    args = ["compare", "--backends", "hf", "--model", str(tiny_llama_path), "--opt", "device=cpu"]
    assert main([*args, "--paths", "alone,batched", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [b["dtype"] for b in report["backends"].values()] == ["float32", "float32"]
    code = main(
        [*args, "--paths", "alone,batched,extended", "--dtype", "bfloat16", "--json", "--tolerance", "10"]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and {b["dtype"] for b in report["backends"].values()} == {"bfloat16"}
    assert [(p["a"], p["b"]) for p in report["pairs"]] == [
        ("hf:alone", "hf:batched"), ("hf:alone", "hf:extended"), ("hf:batched", "hf:extended"),
    ]  # fmt: skip
    assert main([*args, "--paths", "alone"]) == 2
    assert "at least two of alone, batched, extended" in capsys.readouterr().err
    assert main(["compare", "--backends", "hf,mlx", "--paths", "alone,batched"]) == 2
    assert "one backend with itself" in capsys.readouterr().err
