"""``genlm compare`` with genlm-llamacpp: hf on a model folder, llamacpp on a GGUF of it.

The GGUF's path is a per-backend option (``--opt llamacpp:model=FILE.gguf``); the
other backends read ``--model``. compare passes ``dtype="float32"`` to every backend,
which llamacpp honours with an f32 KV cache (and no f16 flash attention), so an f32
GGUF computes in float32 throughout.

Tolerances: ``TIGHT`` on the tiny Llama's f32 GGUF against transformers on its folder:
the same float32 network through other kernels, the bound derived from that arithmetic
(:func:`genlm_core.testing.tolerance.row_atol` for the tiny models' shape over rows of up
to 30 nats: theirs reach ~20), 9.4e-4; measured 1.7e-5 over
compare's default prompts (the longest cut to the model's 256 positions). A
different network (the tiny GPT-2's GGUF, same tokenizer) is several nats off, and
an f16 KV cache (``dtype="float16"``) is ~1e-2 off: both must fail it.
"""

from __future__ import annotations

import json

import genlm_core
from genlm_core.testing.tolerance import row_atol, tiny_shape
from genlm_core.tools.cli import main
from genlm_core.tools.compare import DEFAULT_PROMPTS, compare_loaded

TIGHT = row_atol(tiny_shape(), magnitude=30.0)


def _compare(capsys, folder, gguf, *extra: str) -> tuple[int, dict]:
    capsys.readouterr()
    rc = main(
        [
            "compare",
            "--backends",
            "hf,llamacpp",
            "--model",
            str(folder),
            "--opt",
            f"llamacpp:model={gguf}",
            "--opt",
            "llamacpp:n_threads=2",
            "--json",
            *extra,
        ]
    )
    return rc, json.loads(capsys.readouterr().out)


def test_cli_compare_f32_gguf_matches_hf_tightly(capsys, tiny_llama_path, tiny_gguf):
    rc, out = _compare(capsys, tiny_llama_path, tiny_gguf, "--tolerance", str(TIGHT))
    (pair,) = out["pairs"]
    assert rc == 0 and out["ok"], pair
    assert pair["max_abs"] <= TIGHT and pair["top1_agree"] == pair["n_contexts"] == len(DEFAULT_PROMPTS)
    assert out["backends"]["llamacpp"] == {
        "dtype": "float32",
        "device": "cpu",
        "model": str(tiny_gguf),
        "weights": "F32",
    }
    assert out["backends"]["hf"]["dtype"] == "float32"
    assert max(c["tokens"] for c in out["contexts"]) == 255  # the long prompt, cut to 256 - 1


def test_cli_compare_different_model_fails(capsys, tiny_llama_path, tiny_gpt2_gguf):
    """The tiny GPT-2's GGUF has the tiny Llama's tokenizer (same ids, same vocabulary
    size), so only the distributions can tell them apart: compare must."""
    rc, out = _compare(capsys, tiny_llama_path, tiny_gpt2_gguf)
    (pair,) = out["pairs"]
    assert rc == 1 and not out["ok"]
    assert pair["max_abs"] > 1.0 and pair["max_kl"] > 0.1, pair


def test_dtype_sets_the_kv_cache_precision(tiny_llama_path, tiny_gguf):
    """dtype="float16" gives llamacpp an f16 KV cache: compare sees it beyond TIGHT,
    yet close (rounding, not another network)."""
    hf = genlm_core.load("hf", model=str(tiny_llama_path), dtype="float32", device="cpu")
    half = genlm_core.load("llamacpp", model=str(tiny_gguf), dtype="float16", n_threads=2)
    auto = genlm_core.load("llamacpp", model=str(tiny_gguf), n_threads=2)
    try:
        assert half.stats()["engine"]["kv_cache_type"] == "f16" and half.dtype == "float16"
        # "auto" is the checkpoint's precision: an all-F32 GGUF gets an f32 cache
        assert auto.stats()["engine"]["kv_cache_type"] == "f32" and auto.dtype == "float32"
        result = compare_loaded({"hf": hf, "f16kv": half, "auto": auto}, DEFAULT_PROMPTS[:4])
        by_pair = {(p.a, p.b): p for p in result.pairs}
        assert TIGHT < by_pair["hf", "f16kv"].max_abs < 0.1, by_pair["hf", "f16kv"]
        assert by_pair["hf", "auto"].max_abs <= TIGHT
        assert "F32 weights" in result.table()
    finally:
        for llm in (hf, half, auto):
            llm.close()


def test_explicit_kv_cache_type_wins_over_dtype(tiny_gguf):
    llm = genlm_core.load("llamacpp", model=str(tiny_gguf), dtype="float32", kv_cache_type="f16", n_threads=2)
    try:
        assert llm.stats()["engine"]["kv_cache_type"] == "f16" and llm.dtype == "float16"
    finally:
        llm.close()
