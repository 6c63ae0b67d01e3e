"""Options of the Hugging Face backend (import-light: pydantic and genlm_core only)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

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
    static_decode: Literal["auto", "on", "off"] = Field(
        "auto",
        description=(
            "a burst's kept decode batches, and the rows of ordinary calls that extend the call "
            "before's by one token (SIS, SMC: genlm_hf.resident), step over static KV buffers, one "
            "per (batch, length) bucket, captured as CUDA graphs on CUDA (docs/gpu.md): 'auto' is on "
            "for CUDA and off elsewhere ('on' pays on the CPU for SIS and SMC over long contexts, not for "
            "the byte beam: docs/gpu.md), 'on' everywhere, 'off' never"
        ),
    )
    fused_decode: bool = Field(
        True,
        description=(
            "the static decode step of a transformers Llama, Mistral, Qwen2 or Qwen3 causal LM runs "
            "genlm-hf's fused step (genlm_hf.fused: about 16 kernels a layer instead of 48, the same "
            "weights, rows equal up to rounding order); False: the model's own forward. Models it "
            "cannot run (other architectures, quantised or adapted layers) use their own forward"
        ),
    )
    fused_attention: Literal["bmm", "sdpa"] = Field(
        "bmm",
        description=(
            "how the fused step attends (genlm_hf.fused.ATTENTION): 'bmm', two batched GEMMs with "
            "softmax in float32 between them, or 'sdpa', torch's scaled_dot_product_attention (one "
            "kernel on CUDA where a backend takes the mask); rows equal up to rounding order"
        ),
    )
    static_decode_bytes: int | None = Field(
        None,
        ge=0,
        description="the most bytes the static decode buffers take together (free buckets are dropped "
        "least recently used first; a batch that finds no room runs on the eager path); None: a quarter "
        "of the device's free memory once the model is loaded, at least 1 GiB, on CUDA, and 1 GiB elsewhere",
    )

    def requested_dtype(self) -> str:
        """``dtype``, or genlm-backend's ``hf_opts={"torch_dtype": ...}`` when dtype is 'auto'."""
        legacy = [(k, self.hf_opts[k]) for k in ("torch_dtype", "dtype") if k in self.hf_opts]
        if not legacy:
            return self.dtype
        key, value = legacy[0]
        name = normalize_dtype(value)
        if name is None:
            raise ValueError(f"hf_opts[{key!r}]={value!r}: expected one of {', '.join(DTYPES[1:])}")
        if self.dtype not in ("auto", name):
            raise ValueError(
                f"hf_opts[{key!r}]={value!r} conflicts with dtype={self.dtype!r}; pass dtype= only"
            )
        return name

    def requested_device(self) -> str | None:
        """``device`` (None: the best device present, :mod:`genlm_core.engine.placement`)."""
        return self.device

    def model_needs(self) -> tuple[str, ...]:
        # a GGUF checkpoint carries its config and tokenizer inside the .gguf file
        return () if self.gguf_file is not None else ("config", "tokenizer")
