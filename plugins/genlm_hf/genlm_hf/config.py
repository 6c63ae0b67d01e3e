"""Options of the Hugging Face backend (import-light: pydantic and genlm_core only)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from genlm_core.engine import DTYPES, BackendConfig, KVCacheOptions, normalize_dtype

__all__ = ["HFConfig", "DTYPES"]


class HFConfig(KVCacheOptions, BackendConfig):
    """Options of ``genlm_core.load("hf", ...)``.

    ``model`` is a hub id or a local folder, loaded with transformers'
    ``AutoModelForCausalLM.from_pretrained`` (no download happens for a local folder);
    ``None`` is the embedded SmolLM2-135M-Instruct (:mod:`genlm_core.engine.checkpoint`).
    ``prefix_cache`` and ``kv_cache_bytes`` come from :class:`~genlm_core.engine.kv_reuse.KVCacheOptions`.
    """

    component = "hf"

    gguf_file: str | None = Field(
        None, description="GGUF file inside `model` to load (needs the `gguf` package)"
    )
    device: str | None = Field(
        None, description="'cuda', 'cuda:1', 'mps' or 'cpu'; None picks the best device present"
    )
    device_map: str | dict[str, Any] | None = Field(
        None, description="passed to from_pretrained (e.g. 'auto'); the model is then not moved"
    )
    hf_opts: dict[str, Any] = Field(
        default_factory=dict, description="extra keyword arguments for from_pretrained"
    )
    bitsandbytes_opts: dict[str, Any] | None = Field(
        None, description="BitsAndBytesConfig options (CUDA only), e.g. {'load_in_8bit': True}"
    )
    trust_remote_code: bool = Field(False, description="allow model code shipped with the checkpoint")
    lora_path: str | None = Field(None, description="LoRA adapter folder loaded (and activated) at start")
    lora_name: str = Field("default", description="name of the adapter given by `lora_path`")
    kv_cache_bytes: int | Literal["auto"] | None = Field(  # type: ignore[assignment]
        "auto",
        description=(
            "bytes of KV the engine's pool holds: every kept context's and the running call's, a "
            "prefix many contexts share held once (genlm_hf.pool; kept contexts are released least "
            "recently used first at the bound). 'auto': a quarter of the memory of the model's device "
            "(the machine's RAM, or its cgroup limit, on the CPU; the GPU's free memory once the model "
            "is loaded on CUDA), at least 1 GiB; bytes: at least 4 pages of the model's KV (64 tokens) and at "
            "most the device's memory, and a context longer than the bound holds alone is refused; 0: no KV "
            "kept between calls (the pool holds the running call's KV under the 'auto' bound and gives its "
            "memory back after each call); None: no bound"
        ),
    )
    kv_pool: Literal["auto", "required"] = Field(
        "auto",
        description=(
            "whether every call must run over the KV pool (genlm_hf.pool). 'auto': a model whose cache is "
            "not plain KV (sliding windows, recurrent state), or on which the pool's self-check at load fails, "
            "runs every call whole without KV reuse (a failed self-check is logged as a WARNING, shown in "
            "stats and `genlm doctor`); 'required': either is a load error"
        ),
    )
    static_decode: Literal["auto", "on", "off"] = Field(
        "auto",
        description=(
            "calls whose every row runs one new token (a step of SIS, SMC, a burst, the byte beam) "
            "run as the decode step (genlm_hf.step): a fixed shape per (rows, columns) bucket, captured "
            "as a CUDA graph on CUDA (docs/gpu.md). 'auto': on for CUDA, off elsewhere (on the CPU the "
            "eager pass over the pool costs no more); 'on': everywhere; 'off': never"
        ),
    )
    fused_decode: bool = Field(
        True,
        description=(
            "the decode step of a transformers Llama, Mistral, Qwen2 or Qwen3 causal LM runs "
            "genlm-hf's fused step (genlm_hf.fused: fewer kernels a layer, the same weights, rows "
            "equal up to rounding order); False: the model's own forward. Models it cannot run "
            "(other architectures, quantised or adapted layers) use their own forward"
        ),
    )
    cpu_packed_linears: bool = Field(
        True,
        description=(
            "on the CPU, a float32 or bfloat16 model's linear layers run through oneDNN over weights "
            "packed once at load (genlm_hf.cpu_linear: 2-4x MKL's float32 product at the shapes of a "
            "step and a prompt; the same weights, rows equal up to float32 rounding order); off while "
            "a LoRA adapter is loaded and beside the fused decode step"
        ),
    )
    static_decode_bytes: int | None = Field(
        None,
        ge=0,
        description="deprecated, ignored (genlm-hf 0.3 removes it): kv_cache_bytes bounds every KV column",
    )
    fused_attention: str | None = Field(
        None,
        description="deprecated, ignored (genlm-hf 0.3 removes it): the decode step attends over the KV pool",
    )

    @field_validator("kv_cache_bytes", mode="before")
    @classmethod
    def _bytes(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError(
                f"kv_cache_bytes={value} is a bool, not a number of bytes: pass bytes (e.g. 2**30), 'auto', "
                "0 (keep no KV between calls) or None (no bound); prefix_cache=False turns reuse off"
            )
        if isinstance(value, int) and value < 0:
            raise ValueError(f"kv_cache_bytes={value}: expected bytes >= 0, 'auto' or None")
        return value

    @model_validator(mode="before")
    @classmethod
    def _hf_opts_dtype(cls, data: Any) -> Any:
        """genlm-backend's ``hf_opts={"torch_dtype": ...}`` (or ``"dtype"``) is ``dtype=``: the
        one place it is read. It moves to ``dtype`` (any spelling ``dtype`` takes), out of
        ``hf_opts``; with a ``dtype=`` naming another dtype it is refused."""
        opts = data.get("hf_opts") if isinstance(data, dict) else None
        legacy = (
            [(k, opts[k]) for k in ("torch_dtype", "dtype") if k in opts] if isinstance(opts, dict) else []
        )
        if not legacy:
            return data
        key, value = legacy[0]
        name = normalize_dtype(value)
        if name is None:
            raise ValueError(f"hf_opts[{key!r}]={value!r}: expected one of {', '.join(DTYPES[1:])}")
        given = data.get("dtype", data.get("torch_dtype", "auto"))
        given = "auto" if given in (None, "auto") else normalize_dtype(given) or given
        if given not in ("auto", name):
            raise ValueError(f"hf_opts[{key!r}]={value!r} conflicts with dtype={given!r}; pass dtype= only")
        rest = {k: v for k, v in data.items() if k != "torch_dtype"}
        return {
            **rest,
            "dtype": name,
            "hf_opts": {k: v for k, v in opts.items() if k not in ("torch_dtype", "dtype")},
        }

    @model_validator(mode="after")
    def _deprecated(self) -> "HFConfig":
        from genlm_hf._deprecated import warn_deprecated_options

        warn_deprecated_options(self)
        return self

    def requested_device(self) -> str | None:
        """``device`` (None: the best device present, :mod:`genlm_core.engine.placement`)."""
        return self.device

    def model_needs(self) -> tuple[str, ...]:
        # a GGUF checkpoint carries its config and tokenizer inside the .gguf file
        return () if self.gguf_file is not None else ("config", "tokenizer")
