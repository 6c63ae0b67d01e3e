"""HFBackend: a transformers causal LM behind the genlm-core LogprobBackend surface.

The base class provides validation, the AutoBatcher (which merges identical
*whole* contexts only), the output cache, the sync/async/batch entry points and
seeded sampling. This class adds the engine: one batched forward pass per batch in
which every context reuses the deepest KV state cached for one of its prefixes
(:class:`genlm_core.prefix_cache.PrefixCache`, LRU under ``kv_cache_bytes``), so a
particle that extends its context by one token costs one token of compute. The
sync path goes through the same ``_forward``, so it uses the KV it finds too. The
prefix cache holds KV only: next-token rows are cached once, in the base's output
cache (one logprob budget, ``cache_bytes``).
"""

from __future__ import annotations

import gc
import inspect
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from genlm_core.backend import BaseLogprobBackend
from genlm_core.prefix_cache import PrefixCache
from genlm_hf.config import HFConfig
from genlm_hf.kv import Row, forward_rows, supports_kv_reuse
from genlm_hf.loading import load_model_and_tokenizer

__all__ = ["HFBackend"]


class HFBackend(BaseLogprobBackend):
    """Hugging Face transformers LogprobBackend with KV prefix reuse and LoRA adapters."""

    config_class = HFConfig
    backend_name = "hf"

    def __init__(self, model: Any, tokenizer: Any, config: HFConfig | None = None) -> None:
        config = config if config is not None else HFConfig()
        self.model = model.eval()
        self._device = model.device
        super().__init__(tokenizer, config)
        self.config: HFConfig = config
        # KV only: next-token rows live in the base's output cache (one logprob budget)
        self.prefix_cache = PrefixCache(kv_budget_bytes=config.kv_cache_bytes)
        self.kv_reuse = bool(config.prefix_cache) and supports_kv_reuse(model)
        params = inspect.signature(model.forward).parameters
        self._logits_to_keep = "logits_to_keep" in params
        self._max_len = _max_positions(model.config)
        pad = getattr(tokenizer, "pad_token_id", None)
        self._pad_id = pad if isinstance(pad, int) and 0 <= pad < self.vocab_size else 0
        self.active_lora: str | None = None
        self.loras: dict[str, str] = {}
        self.tokens_computed = 0
        self.tokens_reused = 0
        self.forward_calls = 0

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, config: HFConfig) -> "HFBackend":
        model, tokenizer, _ = load_model_and_tokenizer(config)
        backend = cls(model, tokenizer, config)
        if config.lora_path is not None:
            backend.load_lora(config.lora_path, config.lora_name)
            backend.set_lora(config.lora_name)
        return backend

    @property
    def max_context_length(self) -> int | None:
        return self._max_len

    @property
    def device(self) -> Any:
        return self._device

    @property
    def dtype(self) -> str:
        """The dtype of the model's floating weights (what its matmuls run in)."""
        for param in self.model.parameters():
            if param.is_floating_point():
                return str(param.dtype).removeprefix("torch.")
        return "float32"

    # ------------------------------------------------------------------ engine
    def _forward_in_thread(self) -> bool:
        # on CPU torch's intra-op threads already use every core: a worker thread only
        # adds a hop (the SIS benchmark ran 7% slower with one, benchmarks/bench_sis.py)
        return torch.device(self._device).type != "cpu"

    def _forward(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        with torch.inference_mode():
            if not self.kv_reuse:
                logits, _ = forward_rows(
                    self.model,
                    [Row(c) for c in contexts],
                    want_kv=False,
                    logits_to_keep=self._logits_to_keep,
                    pad_id=self._pad_id,
                )
                self._count(len(contexts), sum(map(len, contexts)), 0)
                return logits
            return self._forward_reusing(contexts)

    def _forward_reusing(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        """Rows of normalised logprobs; runs the model only on tokens past each cached prefix.

        Every context's own KV is cached afterwards (within ``kv_cache_bytes``).
        """
        V = self.vocab_size
        if not contexts:
            return torch.empty((0, V))
        todo: dict[tuple[int, ...], Row] = {}  # whole contexts: duplicates run once
        for ctx in contexts:
            if ctx not in todo:
                depth, kv = self.prefix_cache.deepest_kv(ctx, max_depth=len(ctx) - 1)
                todo[ctx] = Row(ctx, depth, kv)
        rows = list(todo.values())
        logits, kvs = forward_rows(
            self.model, rows, want_kv=True, logits_to_keep=self._logits_to_keep, pad_id=self._pad_id
        )
        logprobs = torch.log_softmax(logits[:, :V].float(), dim=-1)
        self._count(len(rows), sum(len(r.ctx) - r.depth for r in rows), sum(r.depth for r in rows))
        for row, kv in zip(rows, kvs or []):
            self.prefix_cache.insert(row.ctx, kv=kv)
        if len(todo) == len(contexts):
            return logprobs
        index = {ctx: i for i, ctx in enumerate(todo)}
        return logprobs[[index[c] for c in contexts]]

    def _forward_uncached(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        """One full forward pass per context, no padding, no cache: the reference."""
        rows = []
        with torch.inference_mode():
            for ctx in contexts:
                kwargs: dict[str, Any] = {"use_cache": False}
                if self._logits_to_keep:
                    kwargs["logits_to_keep"] = 1
                ids = torch.tensor([ctx], dtype=torch.long, device=self._device)
                rows.append(self.model(ids, **kwargs).logits[0, -1])
        self._count(len(contexts), sum(map(len, contexts)), 0)
        return torch.stack(rows)

    def _count(self, rows: int, computed: int, reused: int) -> None:
        self.forward_calls += 1
        self.tokens_computed += computed
        self.tokens_reused += reused

    def _clear_engine_cache(self) -> None:
        self.prefix_cache.clear()

    # ------------------------------------------------------------------ cache controls
    def cache_kv(self, prompt_tokens: Sequence[int]) -> None:
        """Compute and keep the KV state of ``prompt_tokens`` (and its next-token logprobs).

        Later contexts that extend the prompt run the model on their new tokens only
        (while the KV stays within ``kv_cache_bytes``).
        """
        ctx = self.validate(prompt_tokens)
        if not self.kv_reuse or self.prefix_cache.deepest_kv(ctx)[0] == len(ctx):
            return
        self.batcher.run_sync([ctx])  # the shared path: KV into the prefix cache, row into the output cache

    def clear_kv_cache(self) -> None:
        """Drop every cached KV state (the output cache's rows stay)."""
        self.prefix_cache.clear_kv()

    # ------------------------------------------------------------------ LoRA (peft)
    def load_lora(self, path: str | Path, name: str = "default") -> None:
        """Load a LoRA adapter folder under ``name``; the active adapter does not change."""
        try:
            import peft  # noqa: F401
        except ImportError as exc:
            raise ImportError("LoRA adapters need peft: pip install genlm-hf[lora]") from exc
        if not Path(path).exists():
            raise ValueError(f"LoRA adapter folder {str(path)!r} does not exist")
        if name in self.loras:
            raise ValueError(f"a LoRA adapter named {name!r} is already loaded (from {self.loras[name]})")
        with self.batcher.model_lock:
            self.model.load_adapter(str(path), adapter_name=name)
            self.loras[name] = str(path)
            if self.active_lora is not None:
                self.model.set_adapter(self.active_lora)
            else:  # loading may activate the new adapter: keep the base model
                self.model.disable_adapters()
            self.clear_cache()

    def set_lora(self, name: str) -> None:
        """Activate the loaded adapter ``name`` (clears the output and KV caches)."""
        if name not in self.loras:
            loaded = ", ".join(self.loras) or "none"
            raise ValueError(
                f"no LoRA adapter named {name!r} is loaded (loaded: {loaded}); call load_lora first"
            )
        with self.batcher.model_lock:
            self.model.set_adapter(name)
            self.model.enable_adapters()
            self.active_lora = name
            self.clear_cache()

    def clear_lora(self) -> None:
        """Run the base model again, without any adapter (clears the output and KV caches)."""
        with self.batcher.model_lock:
            if self.loras:
                self.model.disable_adapters()
            self.active_lora = None
            self.clear_cache()

    # ------------------------------------------------------------------ housekeeping
    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["prefix_cache"] = self.prefix_cache.stats()
        out["engine"] = {
            "forward_calls": self.forward_calls,
            "tokens_computed": self.tokens_computed,
            "tokens_reused": self.tokens_reused,
            "kv_reuse": self.kv_reuse,
            "active_lora": self.active_lora,
        }
        return out

    def _close_engine(self) -> None:
        self.prefix_cache.clear()
        self.model = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _max_positions(config: Any) -> int | None:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for attr in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(text, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
