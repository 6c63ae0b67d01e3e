"""Options of the llama.cpp backend (import-light: pydantic and genlm_core only)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from genlm_core.engine import BackendConfig


class LlamaCppConfig(BackendConfig):
    """Options of :class:`genlm_llamacpp.engine.LlamaCppEngine` (``genlm_core.load("llamacpp", ...)``).

    ``model`` is a ``.gguf`` file, a local folder holding one (name it with
    ``gguf_file`` when there are several), or a hub id with ``gguf_file``. The GGUF is
    read directly (weights, tokenizer and metadata): nothing is converted.

    ``dtype`` keeps its meaning of every backend where llama.cpp has a choice: the
    weights are the file's (F32, F16 or quantised), activations are float32, and
    ``dtype`` picks the KV cache (and so attention) precision unless
    ``kv_cache_type`` names one. So ``dtype="float32"`` on an F32 GGUF computes in
    float32 throughout (what ``genlm compare`` asks for).
    """

    component = "llamacpp"
    #: ``dtype="auto"`` on a GGUF whose file type names no float dtype (quantised weights):
    #: an f16 KV cache, llama.cpp's own choice there
    default_dtype = "float16"

    gguf_file: str | None = Field(
        None, description="the .gguf file inside the folder or hub repository named by model"
    )
    n_ctx: int | None = Field(
        None,
        ge=1,
        description="token positions of a context (the longest context accepted is n_ctx - 1; None: the model's training context, at most 4096)",
    )
    kv_cells: int | None = Field(
        None,
        ge=1,
        description=(
            "KV cells shared by all sequences: the cached prefixes and the contexts computing, a prefix "
            "sequences share held once (None: 256 per sequence, n_seq_max * 256 = 65,536 by default - "
            "256 particles extending a 4,096-token prompt by 200 tokens each - at least n_ctx and at most "
            "a quarter of the machine's memory, since llama.cpp makes its whole KV buffer resident at load; "
            "n_ctx when batch_invariant; rounded up to a multiple of 256). Too few cells for the particles "
            "in flight make the core release and recompute kept prefixes (stats: call_parts_split, "
            "rows_from_start)"
        ),
    )
    n_seq_max: int = Field(
        256,
        ge=2,
        le=256,
        description=(
            "KV sequences (live contexts: cached prefixes and the batch computing; llama.cpp's most, "
            "256, by default: a sequence per particle for up to 256 particles, each particle extending "
            "its own in place while they share the prompt's cells)"
        ),
    )
    n_batch: int = Field(512, ge=1, description="most tokens per llama_decode call")
    n_threads: int | None = Field(None, ge=1, description="CPU threads (None: every core)")
    n_gpu_layers: int = Field(
        0, ge=-1, description="layers offloaded to a GPU when the build has one (-1: all)"
    )
    kv_cache_type: Literal["f32", "f16", "bf16", "q8_0"] | None = Field(
        None,
        description=(
            "type of the KV cache entries (f32: exact agreement with float32 engines); None: from "
            "dtype (float32 -> f32, bfloat16 -> bf16, float16 -> f16; auto -> f32 for an all-F32 "
            "GGUF, bf16 for a BF16 one, f16 otherwise). The weights are always the GGUF's own"
        ),
    )
    flash_attn: bool | None = Field(
        None,
        description=(
            "flash attention (None: off with an f32 KV cache, since llama.cpp's CPU flash attention "
            "rounds to f16; llama.cpp's choice otherwise)"
        ),
    )
    batch_invariant: bool = Field(
        False,
        description=(
            "compute every context alone from position 0 in an emptied KV cache, so its row is the "
            "same bits whatever shares its batch or was computed before; costs batching and prefix "
            "reuse (SmolLM2 Q4_1: SIS ~9x fewer calls/s, byte beam ~24x fewer bytes/s; "
            "benchmarks/results/llamacpp.md). "
            "Off: batches and prefix reuse; on quantised GGUFs a row then moves with its batch-mates "
            "(the kernels re-quantise activations to 8 bits, turning llama.cpp's float32 rounding "
            "differences into up to ~1 on tail logprobs; F16 ~0.03, F32 ~1e-5; docs/numerics.md)"
        ),
    )
    cpu_extra_buffers: bool | None = Field(
        None,
        description=(
            "let llama.cpp put weights into its extra CPU buffer types (AMX, REPACK: "
            "use_extra_bufts). None: off where llama.cpp's system info reports AMX_INT8 = 1 (its AMX "
            "matmul crashes on Q4_0/Q4_1 weights on some Xeons), on elsewhere"
        ),
    )
    kv_cache_tokens: int | None = Field(
        None,
        ge=0,
        description=(
            "KV cells (tokens) the kept prefixes and the rows computing may hold, a prompt that "
            "sequences share counted once; past it the prompt and a fixed subset of particles stay "
            "(0: no prefix reuse; None: bounded only by kv_cells and n_seq_max)"
        ),
    )

    def requested_dtype(self) -> str:
        """The dtype ``kv_cache_type`` means when it is given (it wins over ``dtype``; a q8_0
        cache reads as float16), else ``dtype``."""
        if self.kv_cache_type is not None:
            return {"f32": "float32", "bf16": "bfloat16"}.get(self.kv_cache_type, "float16")
        return self.dtype

    def model_needs(self) -> tuple[str, ...]:
        return ()  # a GGUF file holds the tokenizer and the config
