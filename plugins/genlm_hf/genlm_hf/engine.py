"""HFEngine: a transformers causal LM as a genlm-core engine.

Every context's KV lives in one pool of pages (:mod:`genlm_hf.pool`). A call's contexts
each fork the deepest kept prefix the prefix cache holds (its pages, no copy) and run
only the tokens past it; their KV stays in the pool, kept by the prefix cache, so a
particle that extends its context by one token costs one token of compute and one
column of memory, and a prompt that many particles share is held once. Each pass reads
the columns a group of its rows holds in the same pages once for all of them
(:mod:`genlm_hf.attention`).

A call whose every row runs one new token (a step of SIS, SMC, a burst, the byte beam)
runs as the decode step (:mod:`genlm_hf.step`) when ``static_decode`` is on (on CUDA by
default): a fixed shape per bucket, captured as a CUDA graph; any other call runs one
eager pass (:mod:`genlm_hf.passes`), or several when its rows' new tokens differ widely in
number. Bursts are ordinary calls (capability ``"burst"``: the core's decode step). On
the CPU the linear layers run through oneDNN over weights packed at load
(:mod:`genlm_hf.cpu_linear`). LoRA adapters (peft) are the capability ``"lora"``.

A model whose cache is not plain full-attention KV (sliding windows, recurrent state),
or whose attention does not go through transformers' attention interface, runs every
context whole in padded batches of the model's own forward, with no KV kept.

Importing this module imports torch; ``genlm_core.load("hf", ...)`` loads it. Around a
model and tokenizer loaded by hand: ``BaseLogprobBackend(HFEngine(model, tokenizer, config), config)``.
"""

from __future__ import annotations

import gc
import inspect
import os
from typing import Any

import torch

from genlm_core.engine import Checkpoint, Engine, EngineServices, note
from genlm_hf.config import HFConfig
from genlm_hf.cpu_linear import pack_linears, packing_problem, unpack_linears
from genlm_hf.fused import FusedLlama, fused_reason
from genlm_hf.loading import dtypes_on, load_model_and_tokenizer
from genlm_hf.passes import (
    PASS_COST,
    PassRow,
    common_prefixes,
    extend_rows,
    lay_out,
    pages_needed,
    pass_groups,
    pool_problem,
    probe_layout,
    run_pass,
    run_plain,
)
from genlm_hf.pool import KVPool, KVSeq
from genlm_hf.step import DecodeStep

__all__ = ["HFEngine", "kv_pool_bytes"]

#: the least the pool's bound resolves to under kv_cache_bytes="auto"
MIN_POOL_BYTES = 2**30


def kv_pool_bytes(option: int | str | None, device: torch.device) -> int | None:
    """The pool's bound: ``option`` as given, or under ``"auto"`` a quarter of the memory the
    model's device has (the GPU's free memory once the model is loaded; the machine's RAM,
    or its cgroup limit, on the CPU), at least :data:`MIN_POOL_BYTES`."""
    if option != "auto":
        return option  # type: ignore[return-value]
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return max(MIN_POOL_BYTES, free // 4)
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:  # a container's limit, where it has one
        with open("/sys/fs/cgroup/memory.max") as f:
            raw = f.read().strip()
        if raw.isdigit():
            total = min(total, int(raw))
    except OSError:
        pass
    return max(MIN_POOL_BYTES, total // 4)


class HFEngine(Engine):
    """A transformers causal LM over a KV pool (see the module doc)."""

    config_class = HFConfig
    supports = frozenset({"burst", "lora"})

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
        # batches run on the event loop's thread (docs/gpu.md: a worker thread's hand-back
        # cost more than it saved on the CPU and on the GPU); forward_thread=True asks for one
        self.forward_in_thread = False
        self._batch_size = config.batch_size
        self._adapters_loaded = False
        self._active_adapter: str | None = None
        #: why the pool cannot hold this model's KV (None: it does)
        self.pool_off = pool_problem(model, self.pad_id)
        #: every context's KV (genlm_hf.pool); None when the model's KV cannot be kept
        self.pool: KVPool | None = None
        #: the decode step (genlm_hf.step), when static_decode is on
        self.step: DecodeStep | None = None
        if self.pool_off is None:
            device = torch.device(model.device)
            bound = kv_pool_bytes(config.kv_cache_bytes, device) if config.prefix_cache else None
            self.pool = KVPool(probe_layout(model, self.pad_id), bound or None)
            self.pool.reclaim = self._reclaim
            self.step = _decode_step(model, config, self.pool, self.pad_id)
        #: KV prefix reuse (the prefix cache keeps page tables; the pool bounds the KV)
        self.kv = self.services.kv_reuse(
            problem=self.pool_off,
            sizeof=lambda seq: 0,  # a kept context's pages are the pool's (kv_pool_bytes_in_use)
            budget=0 if config.kv_cache_bytes == 0 else None,
            owner=lambda seq: seq,  # each kept context holds its pages until the cache drops it
            release=lambda seq: seq.release(),
        )
        #: linear layers packed for oneDNN on the CPU (genlm_hf.cpu_linear), and why not
        self.packed_linears = 0
        self.packed_off: str | None = "cpu_packed_linears=False"
        if config.cpu_packed_linears:
            self.packed_off = packing_problem(model)
            if self.packed_off is None and self.step is not None and self.step.fused is not None:
                self.packed_off = "the fused decode step reads the dense weights"
            if self.packed_off is None:
                self.packed_linears = pack_linears(model)
        self._last_logits: torch.Tensor | None = None
        #: pages the running pass reads (see :meth:`_passes`)
        self._protected: set[int] = set()
        #: the cost of one more eager pass, in token positions (genlm_hf.passes.pass_groups)
        self.pass_cost = PASS_COST
        #: passes and what they read: rows, span columns read once for a group, private columns
        self.counts = {"pool_passes": 0, "span_rows": 0, "span_columns": 0, "private_columns": 0}

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

    # ------------------------------------------------------------------ KV reuse
    def _reclaim(self) -> bool:
        """The pool needs a page: the prefix cache releases its least recently used
        context that no kept context extends (a leaf: its pages are the only ones a
        release can free; a prompt that particles share stays while they do, so a particle
        released computes its own tokens again, not the prompt's), never one whose pages
        the running pass holds, and never a context others extend (it would free at most
        its last partial page, and lose the prompt for all of them); False when no leaf is
        left (the pass then runs in halves, or past the bound for one row)."""
        cache = self.kv.cache if self.kv is not None else None
        if cache is None:
            return False
        held = self._protected
        keep = (lambda seq: all(p in held for p in seq.pages)) if held else None
        try:
            return cache.evict_lru_kv(keep, leaves_only=True) is not None
        except TypeError:  # a registered prefix cache without leaves_only
            return cache.evict_lru_kv(keep) is not None

    # ------------------------------------------------------------------ model calls
    def forward(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        """The logits of distinct contexts, one row each. Each context resumes from the
        deepest kept prefix (its pages forked) and runs its new tokens only; its KV is kept
        in the prefix cache (its pages). Rows of very different suffix lengths run in
        passes of their own (:func:`~genlm_hf.passes.pass_groups`); a pass the pool cannot
        hold runs in halves."""
        with torch.inference_mode():
            if self.pool is None:
                return run_plain(self.model, contexts, pad_id=self.pad_id, logits_to_keep=self.logits_to_keep)
            kv = self.kv
            looked = kv.lookup(contexts) if kv.enabled else [(0, None)] * len(contexts)
            if kv.enabled:  # prefixes several new contexts share: computed (and kept) once
                shared = common_prefixes(contexts, [d for d, _ in looked])
                if shared:
                    self.forward(shared)
                    looked = kv.lookup(contexts)
            rows = [
                PassRow(c, depth, seq.fork(depth) if seq is not None else KVSeq(self.pool))
                for c, (depth, seq) in zip(contexts, looked)
            ]
            out: list[torch.Tensor] = [None] * len(rows)  # type: ignore[list-item]
            try:
                for group in pass_groups([r.suffix for r in rows], self.pass_cost):
                    self._passes([rows[i] for i in group], group, out)
            finally:
                for r in rows:  # rows not kept (no reuse, or a failed pass) give their pages back
                    if not r.kept and r.seq is not None:
                        r.seq.release()
            whole = self._last_logits
            self._last_logits = None
            if whole is not None and whole.shape[0] == len(out):
                return whole  # one pass in the call's order: its logits, normalised as a batch
            return torch.stack(out)

    def _passes(self, rows: list[PassRow], index: list[int], out: list[torch.Tensor]) -> None:
        """Run ``rows`` (positions ``index`` of ``out``) in one pass, or in halves when the
        pool cannot hold their new columns at once."""
        pool = self.pool
        assert pool is not None
        for r in rows:  # a row whose fork was given back (the pass before ran in halves)
            if r.seq is None:
                depth, seq = self.kv.lookup([r.ctx])[0] if self.kv.enabled else (0, None)
                r.depth, r.seq = depth, seq.fork(depth) if seq is not None else KVSeq(pool)
        need = pages_needed(rows, pool.page)
        # what the pass reads is the pass's: the prefix cache's entries wholly within it (its
        # rows' prompt) are not released for it, as that would free nothing now and lose them
        self._protected = {p for r in rows for p in r.seq.pages}
        try:
            fits = pool.reserve(need)
        finally:
            self._protected = set()
        if not fits:
            if len(rows) > 1:
                # the second half gives its forks back (their pages may go to the first
                # half) and finds its prefixes again when its pass comes: what the pool let
                # go, it computes again, a row's own tokens when its prompt is still kept
                half = len(rows) // 2
                for r in rows[half:]:
                    r.seq.release()
                    r.seq = None  # type: ignore[assignment]
                self._passes(rows[:half], index[:half], out)
                self._passes(rows[half:], index[half:], out)
                return
            if not pool.overflows:  # it must run: past the bound, said once
                note(
                    f"hf: the KV pool passed its bound (kv_cache_bytes: {pool.max_pages} pages of "
                    f"{pool.page} tokens, {pool.page_bytes} bytes each) to run a context of "
                    f"{len(rows[0].ctx)} tokens beside the contexts this call holds; raise "
                    "kv_cache_bytes in load()",
                    advice=True,
                )
            pool.reserve(need, force=True)
        extend_rows(rows)
        logits = None
        if self.step is not None and all(r.suffix == 1 for r in rows):
            layout = lay_out(rows, pool.page, max_spans=1)
            logits = self.step.run(rows, layout)
        if logits is None:
            layout = lay_out(rows, pool.page)
            logits = run_pass(
                self.model, pool, rows, layout, pad_id=self.pad_id, logits_to_keep=self.logits_to_keep
            )
        counts = self.counts
        counts["pool_passes"] += 1
        for members, length in layout.spans:
            counts["span_rows"] += len(members)
            counts["span_columns"] += length
        counts["private_columns"] += sum(map(len, layout.private))
        self.kv.count(sum(r.suffix for r in rows), sum(r.depth for r in rows))
        for n, (i, r) in enumerate(zip(index, rows)):
            out[i] = logits[n]
            r.kept = self.kv.store(r.ctx, r.seq)
        # the call's logits when this pass ran every row of it in order (the usual call)
        self._last_logits = logits if index == list(range(len(out))) else None

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

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.counts)
        if self.pool is not None:
            out.update(self.pool.stats())
        else:
            out["kv_pool_off"] = self.pool_off
        if self.step is not None:
            out.update(self.step.stats())
        out.update(cpu_packed_linears=self.packed_linears, cpu_packed_linears_off=self.packed_off)
        return out

    # ------------------------------------------------------------------ LoRA (peft)
    def load_adapter(self, name: str, folder: str) -> None:
        try:
            import peft  # noqa: F401
        except ImportError as exc:
            raise ImportError("LoRA adapters need peft: pip install genlm-hf[lora]") from exc
        active = self._active_adapter
        if self.step is not None:  # the fused step reads the base weights only
            self.step.unfuse(f"LoRA adapter {name!r} loaded")
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

    # ------------------------------------------------------------------ housekeeping
    def clear_cache(self) -> None:
        """Drop every kept context (their pages go back to the pool). The decode step's
        buckets stay, with their captured graphs: they hold no KV and no result a later call
        reads, and capturing them again would cost a program that clears its caches between
        runs an uncaptured step per bucket. :meth:`close` frees them."""
        self.kv.clear()

    def close(self) -> None:
        if self.kv is not None:
            self.kv.clear()
        if self.step is not None:
            self.step.clear()
            self.step.model = None
        self.step = None
        self.pool = None
        self.model = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _decode_step(model: Any, config: HFConfig, pool: KVPool, pad_id: int) -> DecodeStep | None:
    """The engine's decode step per ``static_decode`` ("auto": on CUDA only, captured,
    without graphs if a capture fails; "on": everywhere, captured on CUDA, a failed capture
    raises; "off": none)."""
    mode = config.static_decode
    device = torch.device(model.device)
    if mode == "off" or (mode == "auto" and device.type != "cuda"):
        return None
    limit = getattr(model.config, "max_position_embeddings", None) or getattr(
        model.config, "n_positions", None
    )
    fused, fused_off = None, "fused_decode=False"
    if config.fused_decode:
        fused_off = fused_reason(model)
        if fused_off is None:
            fused = FusedLlama.build(model)
    return DecodeStep(
        model,
        pool,
        batch_size=config.batch_size,
        graph=device.type == "cuda",
        pad_id=pad_id,
        max_columns=int(limit) if limit else None,
        strict=mode == "on",
        fused=fused,
        fused_off=fused_off,
    )


def _generation_config(model: Any) -> dict[str, Any]:
    """The loaded model's generation config (a GGUF checkpoint has no file for it)."""
    gen = getattr(model, "generation_config", None)
    return gen.to_dict() if gen is not None and hasattr(gen, "to_dict") else {}
