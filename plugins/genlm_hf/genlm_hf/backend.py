"""HFBackend: a transformers causal LM behind the genlm-core LogprobBackend surface.

The base class provides validation, the AutoBatcher (which merges identical
*whole* contexts: ``_forward`` gets distinct ones), the output cache, the
sync/async/batch entry points and seeded sampling. This class adds the engine: one
batched forward pass per batch in which every context resumes from the deepest KV
state cached for one of its prefixes (:class:`genlm_core.engine.kv_reuse.KVReuse`, LRU under
``kv_cache_bytes``), so a particle that extends its context by one token costs one
token of compute. The sync path goes through the same ``_forward``, so it uses the
KV it finds too. The prefix cache holds KV only: next-token rows are cached once, in
the base's output cache (one logprob budget, ``cache_bytes``).
"""

from __future__ import annotations

import gc
import inspect
from pathlib import Path
from typing import Any

import torch

from genlm_core.engine import BaseLogprobBackend, KVReuse, KVReuseBackend, LoraAdapters, checkpoint
from genlm_hf.config import HFConfig
from genlm_hf.kv import Row, Workspace, forward_rows, supports_kv_reuse
from genlm_hf.loading import load_model_and_tokenizer, with_model

__all__ = ["HFBackend"]


class HFBackend(KVReuseBackend, BaseLogprobBackend):
    """Hugging Face transformers LogprobBackend with KV prefix reuse and LoRA adapters
    (a :class:`~genlm_core.protocols.LoraBackend`)."""

    config_class = HFConfig
    backend_name = "hf"

    def __init__(self, model: Any, tokenizer: Any, config: HFConfig | None = None) -> None:
        config = config if config is not None else HFConfig()
        self.model = model.eval()
        self._device = model.device
        super().__init__(tokenizer, config)
        self.config: HFConfig = config
        # the checkpoint policy (genlm_core.engine.checkpoint): config.json, else the loaded config
        model_config = checkpoint.read_config(config.model) or model.config.to_dict()
        self.eos_token_ids = checkpoint.default_eos_ids(
            checkpoint.read_generation_config(config.model) or _generation_config(model),
            model_config,
            getattr(tokenizer, "eos_token_id", None),
            self.vocab_size,
        )
        self._max_len = checkpoint.context_limit(model_config)
        # KV only: next-token rows live in the base's output cache (one logprob budget)
        self.kv = KVReuse(config.kv_cache_bytes, enabled=config.prefix_cache and supports_kv_reuse(model))
        params = inspect.signature(model.forward).parameters
        self._logits_to_keep = "logits_to_keep" in params
        pad = getattr(tokenizer, "pad_token_id", None)
        self._pad_id = pad if isinstance(pad, int) and 0 <= pad < self.vocab_size else 0
        self.adapters = LoraAdapters()
        self._workspace = Workspace()  # the batch KV buffer's memory, kept between passes

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, config: HFConfig) -> "HFBackend":
        config = with_model(config)  # model=None: the checkpoint policy's default model
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
        """Logits of distinct contexts; the model runs only on the tokens past each
        context's deepest cached prefix, and every context's own KV is kept."""
        if not contexts:
            return torch.empty((0, self.vocab_size))
        rows = [Row(c, depth, kv) for c, (depth, kv) in zip(contexts, self.kv.lookup(contexts))]
        with torch.inference_mode():
            logits, kvs = forward_rows(
                self.model,
                rows,
                want_kv=self.kv.enabled,
                logits_to_keep=self._logits_to_keep,
                pad_id=self._pad_id,
                workspace=self._workspace,
            )
        self.kv.count(sum(len(r.ctx) - r.depth for r in rows), sum(r.depth for r in rows))
        for row, kv in zip(rows, kvs or []):
            self.kv.store(row.ctx, kv)
        return logits

    def _forward_rows(self, contexts: list[tuple[int, ...]]) -> list[torch.Tensor]:
        """Each row normalised straight into a tensor of its own: the base normalises the
        batch and then copies every row out (``compact``), one more pass over the rows.
        The same float32 ``log_softmax`` of each row's first ``vocab_size`` logits (the
        kernel normalises a row alike alone or in a batch)."""
        logits = self._forward(contexts)
        if logits.shape[-1] < self.vocab_size:
            self._finalize(logits)  # raises the base's error: fewer scores than tokens
        return [torch.log_softmax(row[: self.vocab_size].to(torch.float32), dim=-1) for row in logits]

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
        self.kv.count(sum(map(len, contexts)), 0)
        return torch.stack(rows)

    # ------------------------------------------------------------------ LoRA (peft)
    @property
    def active_lora(self) -> str | None:
        return self.adapters.active

    @property
    def loras(self) -> dict[str, str]:
        """Loaded adapters: name -> folder."""
        return dict(self.adapters.paths)

    def load_lora(self, path: str | Path, name: str = "default") -> None:
        """Load the LoRA adapter folder ``path`` under ``name``; the active adapter does not
        change (no result changes, no cache is dropped)."""
        try:
            import peft  # noqa: F401
        except ImportError as exc:
            raise ImportError("LoRA adapters need peft: pip install genlm-hf[lora]") from exc
        folder = self.adapters.check_new(path, name)
        with self.batcher.model_lock:
            self.model.load_adapter(folder, adapter_name=name)
            self.adapters.add(folder, name)
            if self.adapters.active is not None:
                self.model.set_adapter(self.adapters.active)
            else:  # loading may activate the new adapter: keep the base model
                self.model.disable_adapters()

    def set_lora(self, name: str = "default") -> None:
        """Activate the loaded adapter ``name`` (drops the output cache and the KV cache)."""
        self.adapters.require(name)
        with self.batcher.model_lock:
            self.model.set_adapter(name)
            self.model.enable_adapters()
            self.adapters.active = name
            self.clear_cache()

    def clear_lora(self) -> None:
        """Run the base model again, without any adapter (drops the output and KV caches)."""
        with self.batcher.model_lock:
            if self.adapters.paths:
                self.model.disable_adapters()
            self.adapters.active = None
            self.clear_cache()

    # ------------------------------------------------------------------ housekeeping
    def _engine_stats(self) -> dict[str, Any]:
        return {"active_lora": self.active_lora}

    def _clear_engine_cache(self) -> None:
        self.kv.clear()
        self._workspace.clear()

    def _close_engine(self) -> None:
        self.kv.clear()
        self._workspace.clear()
        self.model = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _generation_config(model: Any) -> dict[str, Any]:
    """The loaded model's generation config (a GGUF checkpoint has no file for it)."""
    gen = getattr(model, "generation_config", None)
    return gen.to_dict() if gen is not None and hasattr(gen, "to_dict") else {}
