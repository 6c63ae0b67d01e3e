"""HFBackend: a transformers causal LM behind the genlm-core LogprobBackend surface.

:class:`HFEngine` is the engine: one batched forward pass per batch in which every
context resumes from the deepest KV state cached for one of its prefixes
(:class:`genlm_core.engine.kv_reuse.KVReuse`, LRU under ``kv_cache_bytes``), so a
particle that extends its context by one token costs one token of compute. The sync
path goes through the same ``forward``, so it uses the KV it finds too. The prefix
cache holds KV only: next-token rows are cached once, in the backend's output cache
(one logprob budget, ``cache_bytes``). :class:`HFBackend` is the core's backend holding
it, plus LoRA adapters (peft).
"""

from __future__ import annotations

import gc
import inspect
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import torch

from genlm_core.engine import BaseLogprobBackend, Checkpoint, Engine, KVReuse, LoraAdapters, decode_vocab
from genlm_core.engine.decode_batches import DecodeBatches
from genlm_hf.config import HFConfig
from genlm_hf.decode import HFDecodeOps
from genlm_hf.kv import Row, Workspace, forward_rows, supports_kv_reuse
from genlm_hf.loading import load_model_and_tokenizer, supported_dtypes
from genlm_hf.static import make_static_decoder

__all__ = ["HFBackend", "HFEngine"]


class HFEngine(Engine):
    """A transformers causal LM: batched forward passes with KV prefix reuse. Its rows are
    final: each one normalised straight into a tensor of its own (the core would normalise
    the batch and then copy every row out, one more pass over the rows)."""

    config_class = HFConfig
    returns = "logprobs"
    #: bursts: decode batches kept between steps (genlm_hf.decode)
    supports = frozenset({"decode"})

    def __init__(self, model: Any, tokenizer: Any, config: HFConfig | None = None) -> None:
        config = config if config is not None else HFConfig()
        self.model = model.eval()
        self._device = model.device
        self.tokenizer = tokenizer
        self.byte_vocab, self.str_vocab = decode_vocab(tokenizer)
        self.vocab_size = len(self.byte_vocab)
        self.model_config = model.config.to_dict()
        self.generation_config = _generation_config(model)
        # KV only: next-token rows live in the backend's output cache (one logprob budget)
        self.kv = KVReuse(
            config.kv_cache_bytes,
            enabled=config.prefix_cache and supports_kv_reuse(model),
            impl=config.prefix_cache_impl,
        )
        params = inspect.signature(model.forward).parameters
        self._logits_to_keep = "logits_to_keep" in params
        pad = getattr(tokenizer, "pad_token_id", None)
        self._pad_id = pad if isinstance(pad, int) and 0 <= pad < self.vocab_size else 0
        # on CPU torch's intra-op threads already use every core: a worker thread only
        # adds a hop (the SIS benchmark ran 7% slower with one, benchmarks/bench_sis.py)
        self.forward_in_thread = torch.device(self._device).type != "cpu"
        self._workspace = Workspace()  # the batch KV buffer's memory, kept between passes
        self._batch_size = config.batch_size
        # a burst's rows, KV kept between steps; on static buffers when static_decode is on
        self._static = make_static_decoder(
            model, config, logits_to_keep=self._logits_to_keep, pad_id=self._pad_id
        )
        self._decode = DecodeBatches(HFDecodeOps(self, static=self._static))
        # static buckets run other shapes (padded rows and columns) than a step's fresh pass
        self.decode_same_arithmetic = self._static is None

    @classmethod
    def load(cls, checkpoint: Checkpoint, config: HFConfig) -> "HFEngine":  # type: ignore[override]
        model, tokenizer, _ = load_model_and_tokenizer(checkpoint, config)
        return cls(model, tokenizer, config)

    @classmethod
    def supported_dtypes(cls, config: HFConfig) -> tuple[str, tuple[str, ...]]:  # type: ignore[override]
        return supported_dtypes(config)

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

    def forward(self, contexts: list[tuple[int, ...]]) -> list[torch.Tensor]:
        """Log-probabilities of distinct contexts; the model runs only on the tokens past
        each context's deepest cached prefix, and every context's own KV is kept."""
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
        return self._normalised(logits)

    def decode_step(
        self, rows: Mapping[int, tuple[int, ...]], released: Collection[int]
    ) -> torch.Tensor | None:
        """A burst step (:mod:`genlm_hf.decode`): the rows' distinct contexts in the step
        loop's batches, each batch resuming the kept KV of the step before when its
        contexts extend that batch's by one token. Returns one ``(rows, vocab)`` tensor.
        Without KV reuse (``prefix_cache=False``, or a model whose cache is not plain
        full-attention KV) every step runs :meth:`forward`."""
        with torch.inference_mode():
            return self._decode.decode_step(
                rows,
                batch_size=self._batch_size,
                kv=self.kv,
                forward=lambda contexts: torch.stack(self.forward(contexts)),
                cat=torch.cat,
            )

    def normalised_batch(self, logits: torch.Tensor) -> torch.Tensor:
        """The float32 ``log_softmax`` of each row's first ``vocab_size`` logits, as one
        ``(rows, vocab)`` tensor (the same numbers as :meth:`_normalised`'s rows)."""
        if logits.shape[-1] < self.vocab_size:
            self._normalised(logits[:1])  # raises the error naming the sizes
        return torch.log_softmax(logits[:, : self.vocab_size].to(torch.float32), dim=-1)

    def stats(self) -> dict[str, Any]:
        out = self._decode.stats()
        if self._static is not None:
            out.update(self._static.stats())
        return out

    def _normalised(self, logits: torch.Tensor) -> list[torch.Tensor]:
        """The float32 ``log_softmax`` of each row's first ``vocab_size`` logits, each row
        its own tensor (the kernel normalises a row alike alone or in a batch)."""
        if logits.shape[-1] < self.vocab_size:
            raise RuntimeError(
                f"hf: the model returned {logits.shape[-1]} scores per row, fewer than the "
                f"{self.vocab_size} tokens of its tokenizer"
            )
        return [torch.log_softmax(row[: self.vocab_size].to(torch.float32), dim=-1) for row in logits]

    def forward_uncached(self, contexts: list[tuple[int, ...]]) -> list[torch.Tensor]:
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
        return self._normalised(torch.stack(rows))

    def clear_cache(self) -> None:
        self.kv.clear()
        self._workspace.clear()
        self._decode.clear()
        if self._static is not None:
            self._static.clear()

    def close(self) -> None:
        self.kv.clear()
        self._workspace.clear()
        self._decode.clear()
        if self._static is not None:
            self._static.clear()
            self._static.model = None  # it holds the model for its captures: let it go
        self.model = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


class HFBackend(BaseLogprobBackend):
    """Hugging Face transformers LogprobBackend with KV prefix reuse and LoRA adapters
    (a :class:`~genlm_core.protocols.LoraBackend`). Around a model and tokenizer loaded by
    hand: ``HFBackend(HFEngine(model, tokenizer, config), config)``."""

    config_class = HFConfig
    backend_name = "hf"
    engine_class = HFEngine
    engine: HFEngine

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.adapters = LoraAdapters()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint, config: HFConfig, **kwargs: Any) -> "HFBackend":  # type: ignore[override]
        backend = super().from_checkpoint(checkpoint, config, **kwargs)
        if config.lora_path is not None:
            backend.load_lora(config.lora_path, config.lora_name)
            backend.set_lora(config.lora_name)
        return backend  # type: ignore[return-value]

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
        with self.engine_lock:
            self.model.load_adapter(folder, adapter_name=name)
            self.adapters.add(folder, name)
            if self.adapters.active is not None:
                self.model.set_adapter(self.adapters.active)
            else:  # loading may activate the new adapter: keep the base model
                self.model.disable_adapters()

    def set_lora(self, name: str = "default") -> None:
        """Activate the loaded adapter ``name`` (drops the output cache and the KV cache)."""
        self.adapters.require(name)
        with self.engine_lock:
            self.model.set_adapter(name)
            self.model.enable_adapters()
            self.adapters.active = name
            self.clear_cache()

    def clear_lora(self) -> None:
        """Run the base model again, without any adapter (drops the output and KV caches)."""
        with self.engine_lock:
            if self.adapters.paths:
                self.model.disable_adapters()
            self.adapters.active = None
            self.clear_cache()

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["engine"]["active_lora"] = self.active_lora
        return out


def _generation_config(model: Any) -> dict[str, Any]:
    """The loaded model's generation config (a GGUF checkpoint has no file for it)."""
    gen = getattr(model, "generation_config", None)
    return gen.to_dict() if gen is not None and hasattr(gen, "to_dict") else {}
