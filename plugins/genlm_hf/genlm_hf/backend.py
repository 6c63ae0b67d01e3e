"""HFEngine: a transformers causal LM as a genlm-core engine.

One batched forward pass per batch in which every context resumes from the deepest KV
state cached for one of its prefixes (capability ``"kv"``: the core's
:class:`~genlm_core.engine.kv_reuse.KVReuse`, LRU under ``kv_cache_bytes``), so a
particle that extends its context by one token costs one token of compute. The prefix
cache holds KV only: next-token rows are cached once, in the backend's output cache.
LoRA adapters (peft) are the capability ``"lora"``; bursts keep decode batches between
steps (:mod:`genlm_hf.decode`).

Importing this module imports torch; ``genlm_core.load("hf", ...)`` loads it. Around a
model and tokenizer loaded by hand: ``BaseLogprobBackend(HFEngine(model, tokenizer, config), config)``.
"""

from __future__ import annotations

import gc
import inspect
from collections.abc import Collection, Mapping
from typing import Any

import torch

from genlm_core.engine import Checkpoint, Engine, EngineServices
from genlm_core.engine.decode_batches import DecodeBatches
from genlm_hf.config import HFConfig
from genlm_hf.decode import HFDecodeOps
from genlm_hf.kv import Row, Slots, Workspace, forward_rows, run_rows, supports_kv_reuse
from genlm_hf.loading import dtypes_on, load_model_and_tokenizer
from genlm_hf.passes import pass_groups
from genlm_hf.resident import ResidentBlocks
from genlm_hf.static_setup import make_static_decoder

__all__ = ["HFEngine"]


class HFEngine(Engine):
    """A transformers causal LM: batched forward passes with KV prefix reuse, LoRA
    adapters and kept decode batches."""

    config_class = HFConfig
    supports = frozenset({"decode", "lora"})

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        config: HFConfig | None = None,
        services: EngineServices | None = None,
    ) -> None:
        config = config if config is not None else HFConfig()
        #: what the core lent at load (built by hand: its own; its device and dtype the model's)
        self.services = services if services is not None else EngineServices(config)
        self.model = model.eval()
        self.kv = self.services.kv_reuse(problem=self.kv_problem())
        self._device = model.device
        self.tokenizer = tokenizer
        self.model_config = model.config.to_dict()
        self.generation_config = _generation_config(model)
        #: whether the model's forward takes ``logits_to_keep`` (logits of the last position only)
        self.logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        pad = getattr(tokenizer, "pad_token_id", None)
        embeddings = model.get_input_embeddings().num_embeddings
        #: the id written in padding positions (masked: any id the embedding has)
        self.pad_id = pad if isinstance(pad, int) and 0 <= pad < embeddings else 0
        # batches on the event loop's thread, on every device. On the CPU torch's intra-op
        # threads already use every core: a worker thread only adds a hop (SIS 7% slower
        # with one). On a GPU the hop is the step's largest host cost: the H200 check of
        # d0aafca ran SmolLM2-135M's 64-row step in 4.95 ms on the loop against 8.68 with
        # the thread (the host's hand-back 0.29 ms against 0.93), and SIS on the 1.7B ran
        # 546 calls/s against 521 (docs/gpu.md). `forward_thread=True` brings it back.
        self.forward_in_thread = False
        #: the batch KV buffer's memory, kept between passes
        self.workspace = Workspace()
        self._batch_size = config.batch_size
        # a burst's rows, KV kept between steps; on static buffers when static_decode is on
        self.static = make_static_decoder(
            model, config, logits_to_keep=self.logits_to_keep, pad_id=self.pad_id
        )
        self._decode = DecodeBatches(HFDecodeOps(self, static=self.static))
        #: ordinary calls' rows continued in place on the static buffers (genlm_hf.resident),
        #: when the static path is on and KV is reused
        self.resident = ResidentBlocks(self, self.static) if self.static is not None else None
        # static buckets run other shapes (padded rows and columns) than a step's fresh pass
        self.decode_same_arithmetic = self.static is None
        self._adapters_loaded = False
        self._active_adapter: str | None = None

    @classmethod
    def load(cls, checkpoint: Checkpoint, config: HFConfig, services: EngineServices) -> "HFEngine":  # type: ignore[override]
        model, tokenizer, _ = load_model_and_tokenizer(checkpoint, config, services.placement)
        return cls(model, tokenizer, config, services)

    @classmethod
    def dtypes_on(cls, device: str) -> tuple[str, ...]:
        return dtypes_on(device)

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

    def kv_problem(self) -> str | None:
        if supports_kv_reuse(self.model):
            return None
        return "its cache is not plain full-attention KV (sliding window, recurrent state or encoder-decoder)"

    def forward(self, contexts: list[tuple[int, ...]]) -> list[torch.Tensor] | torch.Tensor:
        """The logits of distinct contexts, one row each; the model runs only on the tokens
        past each context's deepest cached prefix, and every context's own KV is kept.
        On the static path (``static_decode``, with KV reuse on) the contexts that extend
        live rows by one token run as one static step (:mod:`genlm_hf.resident`)."""
        if self.resident is not None and self.kv.enabled:
            with torch.inference_mode():
                return self.resident.forward(contexts, self._active_adapter)
        return self._forward_eager(contexts)

    def _forward_eager(self, contexts: list[tuple[int, ...]]) -> list[torch.Tensor]:
        """:meth:`forward` on the eager path: one pass from the prefix cache, every row's KV
        stored there."""
        rows = [Row(c, depth, kv) for c, (depth, kv) in zip(contexts, self.kv.lookup(contexts))]
        out: list[torch.Tensor] = [None] * len(rows)  # type: ignore[list-item]
        # rows of very different suffix lengths in passes of their own (genlm_hf.passes)
        for group in pass_groups([len(r.ctx) - r.depth for r in rows]):
            part = [rows[i] for i in group]
            with torch.inference_mode():
                logits, kvs = forward_rows(
                    self.model,
                    part,
                    want_kv=self.kv.enabled,
                    logits_to_keep=self.logits_to_keep,
                    pad_id=self.pad_id,
                    workspace=self.workspace,
                )
            self.kv.count(sum(len(r.ctx) - r.depth for r in part), sum(r.depth for r in part))
            for row, kv in zip(part, kvs or []):
                self.kv.store(row.ctx, kv)
            for i, row_logits in zip(group, logits):
                out[i] = row_logits
        return out  # normalised row by row by the core, each a tensor of its own

    def run_rows(self, rows: list[Row], **room: Any) -> tuple[torch.Tensor, Slots]:
        """One :func:`~genlm_hf.kv.run_rows` pass keeping every row's KV in its buffer
        (``room``: the ``workspace`` it is carved from, or the ``headroom`` it leaves)."""
        logits, slots = run_rows(
            self.model, rows, use_cache=True, logits_to_keep=self.logits_to_keep, pad_id=self.pad_id, **room
        )
        assert slots is not None and slots.buf is not None
        return logits, slots

    def decode_step(self, rows: Mapping[int, tuple[int, ...]], released: Collection[int]) -> torch.Tensor:
        """A burst step (:mod:`genlm_hf.decode`): the rows' distinct contexts in the step
        loop's batches, each batch resuming the kept KV of the step before when its rows
        (by handle) continue that batch's by one token. Returns one ``(rows, vocab)``
        tensor of logits. Without KV reuse (``prefix_cache=False``, or a model whose cache is not
        plain full-attention KV) every step runs the eager :meth:`forward`. The ordinary
        calls' resident rows leave the static buffers first (their KV to the prefix cache)."""
        with torch.inference_mode():
            if self.resident is not None and len(self.resident.blocks):
                self.resident.flush()
            return self._decode.decode_step(
                rows,
                released,
                batch_size=self._batch_size,
                kv=self.kv,
                forward=lambda contexts: torch.stack(self._forward_eager(contexts)),
                cat=torch.cat,
            )

    def end_burst(self, released: Collection[int]) -> None:
        """The burst ended: every kept row's KV to the prefix cache, the buffers freed."""
        with torch.inference_mode():
            self._decode.end_burst(released, self.kv)

    def stats(self) -> dict[str, Any]:
        out = self._decode.stats()
        if self.static is not None:
            out.update(self.static.stats())
        if self.resident is not None:
            out.update(self.resident.stats())
        return out

    def forward_uncached(self, contexts: list[tuple[int, ...]]) -> list[torch.Tensor]:
        """One full forward pass per context, no padding, no cache: the reference."""
        rows = []
        with torch.inference_mode():
            for ctx in contexts:
                kwargs: dict[str, Any] = {"use_cache": False}
                if self.logits_to_keep:
                    kwargs["logits_to_keep"] = 1
                ids = torch.tensor([ctx], dtype=torch.long, device=self._device)
                rows.append(self.model(ids, **kwargs).logits[0, -1])
        self.kv.count(sum(map(len, contexts)), 0)
        return rows

    # ------------------------------------------------------------------ LoRA (peft)
    def load_adapter(self, name: str, folder: str) -> None:
        try:
            import peft  # noqa: F401
        except ImportError as exc:
            raise ImportError("LoRA adapters need peft: pip install genlm-hf[lora]") from exc
        active = self._active_adapter
        if self.static is not None:  # the fused step reads the base weights only
            self.static.unfuse(f"LoRA adapter {name!r} loaded")
        self.model.load_adapter(folder, adapter_name=name)
        self._adapters_loaded = True
        if active is not None:
            self.model.set_adapter(active)
        else:  # loading may activate the new adapter: keep the base model
            self.model.disable_adapters()

    def use_adapter(self, name: str | None) -> None:
        if name is not None:
            self.model.set_adapter(name)
            self.model.enable_adapters()
        elif self._adapters_loaded:
            self.model.disable_adapters()
        self._active_adapter = name

    def clear_cache(self) -> None:
        """Drop every kept context (the prefix cache, resident rows, decode batches). The
        static decode step's pooled slots stay, with their captured graphs: they hold no
        result a later call reads (a slot's stale columns are masked), they are bounded by
        ``static_decode_bytes``, and capturing them again costs a program that clears its
        caches between runs three uncaptured steps per bucket (on the H100, a 64-particle
        burst of 20 tokens spent most of its time so). :meth:`close` frees them."""
        if self.resident is not None:
            self.resident.flush(store=False)
        self.kv.clear()
        self.workspace.clear()
        self._decode.clear()

    def close(self) -> None:
        if self.resident is not None:
            self.resident.flush(store=False)
            self.resident = None
        self.kv.clear()
        self.workspace.clear()
        self._decode.clear()
        if self.static is not None:
            self.static.clear()
            self.static.model = None  # it holds the model for its captures: let it go
        self.model = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _generation_config(model: Any) -> dict[str, Any]:
    """The loaded model's generation config (a GGUF checkpoint has no file for it)."""
    gen = getattr(model, "generation_config", None)
    return gen.to_dict() if gen is not None and hasattr(gen, "to_dict") else {}
