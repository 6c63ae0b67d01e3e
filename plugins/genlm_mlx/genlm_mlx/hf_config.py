"""Read a Hugging Face ``config.json`` the way transformers does, for mlx-lm.

transformers 5 ``save_pretrained`` moved keys that mlx-lm 0.32's model argument
classes still read at the top level. mlx-lm drops what its ``ModelArgs`` does not
declare and falls back to defaults, so such a folder silently runs a different
model (SmolLM2 with ``rope_theta`` 10000 instead of 100000: 1.36 max |logprob| off
transformers). Found by saving transformers 5 configs (llama, gpt2, qwen2, mistral,
phi3, gemma2, olmo2) and diffing them with the fields of mlx-lm's ``ModelArgs``:

* ``rope_theta`` -> ``rope_parameters["rope_theta"]``;
* ``rope_scaling`` -> the rest of ``rope_parameters`` (``rope_type``, ``factor``, ...);
* ``partial_rotary_factor`` -> ``rope_parameters["partial_rotary_factor"]``;
* GPT-2's ``n_ctx`` is no longer written (mlx-lm requires it; it equals ``n_positions``).

:func:`mlx_overrides` returns those keys as transformers resolves them (legacy
``rope_scaling`` first, then ``rope_parameters``, then the top-level key), to be
passed as ``mlx_lm.load(..., model_config=...)``: the user's folder is never
written. A field that mlx-lm's model class cannot honour (a RoPE type it does not
implement, per-layer-type RoPE, a partial rotary factor on a model without one)
raises :class:`UnsupportedConfigError` instead of running another model.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

from genlm_core.config import ConfigError

__all__ = ["UnsupportedConfigError", "mlx_overrides", "args_fields"]

#: RoPE types mlx-lm 0.32 implements with transformers' meaning (``initialize_rope``)
SUPPORTED_ROPE_TYPES = frozenset({"default", "linear", "dynamic", "llama3", "yarn", "longrope"})


class UnsupportedConfigError(ConfigError):
    """The model's config asks for something mlx-lm's model class would not do."""


def args_fields(args_class: type) -> set[str]:
    """The config keys an mlx-lm ``ModelArgs`` class reads (its dataclass fields)."""
    if dataclasses.is_dataclass(args_class):
        return {f.name for f in dataclasses.fields(args_class)}
    return set(inspect.signature(args_class).parameters)


def _rope_params(config: dict[str, Any]) -> dict[str, Any] | None:
    """The RoPE dict transformers uses: legacy ``rope_scaling`` wins over ``rope_parameters``."""
    for key in ("rope_scaling", "rope_parameters"):
        value = config.get(key)
        if isinstance(value, dict) and value:
            return value
    return None


def mlx_overrides(config: dict[str, Any], fields: set[str], where: str = "model") -> dict[str, Any]:
    """Top-level keys to give mlx-lm so it builds the model transformers would build.

    ``config`` is the checkpoint's ``config.json``; ``fields`` the keys its mlx-lm
    ``ModelArgs`` reads (:func:`args_fields`); ``where`` names the model in errors.
    """
    out: dict[str, Any] = {}
    if config.get("model_type") == "gpt2" and "n_ctx" in fields and "n_ctx" not in config:
        if isinstance(config.get("n_positions"), int):
            out["n_ctx"] = config["n_positions"]
    params = _rope_params(config)
    if params is None:
        return out
    reads_nested = "rope_parameters" in fields  # newer mlx-lm model files read it themselves
    layer_types = set(config.get("layer_types") or ())
    if any(isinstance(v, dict) for v in params.values()) or (layer_types & set(params)):
        if reads_nested:
            return out
        raise UnsupportedConfigError(
            f"mlx: {where} sets RoPE parameters per layer type ({', '.join(sorted(params))}); "
            "genlm-mlx cannot map those onto this mlx-lm model class. Use the hf or vllm backend"
        )
    theta = params.get("rope_theta", config.get("rope_theta"))
    rope_type = str(params.get("rope_type") or params.get("type") or "default")
    partial = params.get("partial_rotary_factor", config.get("partial_rotary_factor"))

    if theta is not None:
        if "rope_theta" not in fields and not reads_nested:
            raise UnsupportedConfigError(
                f"mlx: {where} sets rope_theta={theta} but mlx-lm's model class has no rope_theta "
                "field, so it would run another model. Use the hf or vllm backend"
            )
        if "rope_theta" in fields:
            out["rope_theta"] = float(theta)
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedConfigError(
            f"mlx: {where} uses rope_type={rope_type!r}, which genlm-mlx does not run "
            f"(supported: {', '.join(sorted(SUPPORTED_ROPE_TYPES))}). Use the hf or vllm backend"
        )
    if rope_type != "default":
        if "rope_scaling" not in fields and not reads_nested:
            raise UnsupportedConfigError(
                f"mlx: {where} uses rope_type={rope_type!r} but mlx-lm's model class reads no "
                "rope_scaling, so it would run unscaled RoPE. Use the hf or vllm backend"
            )
        if "rope_scaling" in fields:
            out["rope_scaling"] = {
                k: v for k, v in params.items() if k not in ("rope_theta", "partial_rotary_factor")
            }
    if partial is not None and float(partial) != 1.0:
        if "partial_rotary_factor" not in fields and not reads_nested:
            raise UnsupportedConfigError(
                f"mlx: {where} sets partial_rotary_factor={partial} but mlx-lm's model class "
                "rotates every dimension. Use the hf or vllm backend"
            )
        if "partial_rotary_factor" in fields:
            out["partial_rotary_factor"] = float(partial)
    return out
