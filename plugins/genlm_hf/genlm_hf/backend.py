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
``HFBackend`` is deprecated (``genlm_core.load("hf", ...)``).
"""

from __future__ import annotations

import gc
import inspect
from collections.abc import Collection, Mapping
from typing import Any

import torch

from genlm_core.engine import Checkpoint, Engine, note
from genlm_core.engine.backend import backend_class
from genlm_core.engine.contexts import run_distinct
from genlm_core.engine.decode_batches import DecodeBatches
from genlm_hf.config import HFConfig
from genlm_hf.cpu_linear import pack_linears, packing_problem, unpack_linears
from genlm_hf.decode import HFDecodeOps
from genlm_hf.kv import Row, Slots, Workspace, forward_rows, run_rows, supports_kv_reuse
from genlm_hf.loading import load_model_and_tokenizer, supported_dtypes
from genlm_hf.passes import pass_groups
from genlm_hf.pool import KVPool, KVSeq
from genlm_hf.pool_pass import PassRow, pages_needed, probe_layout, run_pass
from genlm_hf.resident import ResidentBlocks
from genlm_hf.static_setup import make_static_decoder

__all__ = ["HFBackend", "HFEngine"]


class HFEngine(Engine):
    """A transformers causal LM: batched forward passes with KV prefix reuse, LoRA
    adapters and kept decode batches."""

    config_class = HFConfig
    supports = frozenset({"decode", "kv", "lora"})

    def __init__(self, model: Any, tokenizer: Any, config: HFConfig | None = None) -> None:
        config = config if config is not None else HFConfig()
        self.model = model.eval()
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
        #: linear layers packed for oneDNN on the CPU (genlm_hf.cpu_linear), and why not
        self.packed_linears = 0
        self.packed_off: str | None = "cpu_packed_linears=False"
        if config.cpu_packed_linears:
            self.packed_off = (
                packing_problem(model) if self.static is None else "the static decode path is on"
            )
            if self.packed_off is None:
                self.packed_linears = pack_linears(model)
        #: every context's KV in one pool of pages (genlm_hf.pool), shared prefixes held and
        #: read once; None on the static path (its own buffers) or for a model whose cache
        #: is not plain full-attention KV
        self.pool: KVPool | None = None
        if self.static is None and supports_kv_reuse(model):
            budget = config.kv_cache_bytes if config.prefix_cache and config.kv_cache_bytes else None
            self.pool = KVPool(probe_layout(model, self.pad_id), budget)
            self.pool.reclaim = self._reclaim
            # a burst's steps are ordinary calls over the pool: the core's decode step
            self.supports = frozenset({"burst", "kv", "lora"})
        # static buckets run other shapes (padded rows and columns) than a step's fresh pass
        self.decode_same_arithmetic = self.static is None
        self._adapters_loaded = False
        self._active_adapter: str | None = None

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

    def kv_budget(self, config: HFConfig) -> int | None:  # type: ignore[override]
        """On the pool, ``kv_cache_bytes`` bounds the pool (every context's KV, kept or
        running), not the prefix cache's entries: the cache keeps what the pool holds."""
        if self.pool is not None:
            return None if config.kv_cache_bytes != 0 else 0
        return config.kv_cache_bytes

    def kv_sizeof(self, payload: Any) -> int:
        if isinstance(payload, KVSeq):
            return 0  # its pages are the pool's (stats: kv_pool_bytes_in_use)
        return super().kv_sizeof(payload)

    def kv_owner(self, payload: Any) -> Any:
        return payload if isinstance(payload, KVSeq) else None

    def release_kv(self, owner: Any) -> None:
        owner.release()  # the prefix cache dropped a context: its pages go back to the pool

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
        if self.pool is not None:
            with torch.inference_mode():
                return self._forward_pool(contexts)
        return self._forward_eager(contexts)

    def _forward_pool(self, contexts: list[tuple[int, ...]]) -> list[torch.Tensor]:
        """:meth:`forward` over the KV pool: each context forks the deepest kept prefix's
        pages and runs its tokens past them; its KV is kept in the prefix cache (its pages,
        no copy). Rows of very different suffix lengths run in passes of their own
        (genlm_hf.passes); a pass the pool cannot hold runs in halves."""
        kv = self.kv
        reuse = kv.enabled
        looked = kv.lookup(contexts) if reuse else [(0, None)] * len(contexts)
        pool = self.pool
        assert pool is not None
        rows = [
            PassRow(c, depth, seq.fork(depth) if seq is not None else KVSeq(pool))
            for c, (depth, seq) in zip(contexts, looked)
        ]
        out: list[torch.Tensor] = [None] * len(rows)  # type: ignore[list-item]
        try:
            for group in pass_groups([r.suffix for r in rows]):
                self._pool_passes([rows[i] for i in group], group, out)
        finally:
            for r in rows:  # the rows not kept (a failed pass, or no reuse) give their pages back
                if not r.kept:
                    r.seq.release()
        return out

    def _pool_passes(self, rows: list[PassRow], index: list[int], out: list[torch.Tensor]) -> None:
        """Run ``rows`` (positions ``index`` of ``out``) in one pass, or in halves when the
        pool cannot hold their new columns at once."""
        pool = self.pool
        assert pool is not None
        need = pages_needed(rows, pool.page)
        if not pool.reserve(need):
            if len(rows) == 1:  # it must run: past the bound, said once
                if not pool.overflows:
                    note(
                        f"hf: the KV pool passed its bound (kv_cache_bytes: {pool.max_pages} pages of "
                        f"{pool.page} tokens, {pool.page_bytes} bytes each) to run a context of "
                        f"{len(rows[0].ctx)} tokens beside the contexts this call holds; raise "
                        "kv_cache_bytes in load()",
                        advice=True,
                    )
                pool.reserve(need, force=True)
            else:
                half = len(rows) // 2
                self._pool_passes(rows[:half], index[:half], out)
                self._pool_passes(rows[half:], index[half:], out)
                return
        logits = run_pass(
            self.model,
            pool,
            rows,
            layers=pool.layout.layers,
            pad_id=self.pad_id,
            logits_to_keep=self.logits_to_keep,
        )
        self.kv.count(sum(r.suffix for r in rows), sum(r.depth for r in rows))
        for n, (i, r) in enumerate(zip(index, rows)):
            out[i] = logits[n]
            r.kept = self.kv.store(r.ctx, r.seq)

    def _reclaim(self) -> bool:
        """The pool needs a page: the prefix cache releases its least recently used
        context (False when it keeps none)."""
        cache = self.kv.cache if self.kv is not None else None
        return cache is not None and cache.evict_lru_kv() is not None

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
        if self.pool is not None:  # every row resumes from the pool: the step loop's calls
            contexts = list(rows.values())
            return torch.stack(run_distinct(contexts, self._batch_size, self._chunks))
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

    def _chunks(self, chunks: list[list[tuple[int, ...]]]) -> list[torch.Tensor]:
        return [row for chunk in chunks for row in self.forward(chunk)]

    def end_burst(self, released: Collection[int]) -> None:
        """The burst ended: every kept row's KV to the prefix cache, the buffers freed
        (on the pool every row's KV is in the prefix cache already)."""
        if self.pool is not None:
            return
        with torch.inference_mode():
            self._decode.end_burst(released, self.kv)

    def stats(self) -> dict[str, Any]:
        out = self._decode.stats()
        if self.static is not None:
            out.update(self.static.stats())
        if self.resident is not None:
            out.update(self.resident.stats())
        if self.pool is not None:
            out.update(self.pool.stats())
        out.update(cpu_packed_linears=self.packed_linears, cpu_packed_linears_off=self.packed_off)
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
        if self.packed_linears:  # peft injects itself into nn.Linear layers only
            unpack_linears(self.model)
            self.packed_linears, self.packed_off = 0, f"LoRA adapter {name!r} loaded"
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
        self.pool = None
        self.model = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


#: deprecated (genlm-core 0.3 removes it): ``genlm_core.load("hf", ...)``
HFBackend = backend_class("hf", HFEngine, deprecated="genlm_hf.HFBackend")


def _generation_config(model: Any) -> dict[str, Any]:
    """The loaded model's generation config (a GGUF checkpoint has no file for it)."""
    gen = getattr(model, "generation_config", None)
    return gen.to_dict() if gen is not None and hasattr(gen, "to_dict") else {}
