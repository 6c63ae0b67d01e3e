"""hf, vllm and mlx agree on SmolLM2-135M in float32 (genlm_core.tools.compare), on both
folder styles: our converted folder (top-level rope_theta) and a transformers-5
save_pretrained copy (rope_theta only under rope_parameters). One vLLM engine per
folder style."""

from __future__ import annotations

import pytest

import genlm_core
from genlm_core.testing.tolerance import assert_within, model_shape, row_atol, row_magnitude
from genlm_core.tools.compare import DEFAULT_PROMPTS, DEFAULT_TOLERANCE, compare_loaded

# starts and closes SmolLM2 engines of its own: a process of its own (scripts/test.sh)
pytestmark = [pytest.mark.slow, pytest.mark.own_process]

VLLM_OPTS = {"enforce_eager": True, "max_model_len": 1024}


@pytest.fixture(scope="module", params=["converted", "transformers5"])
def smol_folder(request, tmp_path_factory) -> str:
    from genlm_core.testing import models as model_paths

    if request.param == "converted":
        return str(model_paths.smollm2())
    return str(model_paths.transformers5_copy(model_paths.smollm2(), tmp_path_factory.mktemp("t5")))


@pytest.fixture(scope="module")
def three(smol_folder):
    llms = {
        "hf": genlm_core.load("hf", model=smol_folder, dtype="float32", device="cpu"),
        "vllm": genlm_core.load("vllm", model=smol_folder, dtype="float32", **VLLM_OPTS),
        "mlx": genlm_core.load("mlx", model=smol_folder, dtype="float32"),
    }
    yield llms
    for llm in llms.values():
        llm.close()


def test_engines_agree_on_every_context(three) -> None:
    result = compare_loaded(three, DEFAULT_PROMPTS)
    print("\n" + result.table(DEFAULT_TOLERANCE))
    assert {b["dtype"] for b in result.backends.values()} == {"float32"}
    assert max(len(c) for c in result.contexts) > 200  # the long context is long
    # float32 through 30 layers: engines differ by summation order only (~1e-4 measured),
    # held to the bound derived from that arithmetic for SmolLM2's shape and the rows'
    # magnitude (~5e-3); a misread rope_theta (1.4) or a bfloat16 engine (0.35) is far off
    rows = three["hf"].batch_next_token_logprobs_sync([list(c) for c in result.contexts])
    bound = row_atol(model_shape(three["hf"]), row_magnitude(rows))
    for pair in result.pairs:
        assert_within(max(pair.per_context_max_abs), bound, f"compare {pair.a} vs {pair.b}")
        assert pair.top1_agree == pair.n_contexts, (pair.a, pair.b)
