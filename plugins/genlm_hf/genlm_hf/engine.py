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
from collections.abc import Iterator
from typing import Any

import torch

from genlm_core.engine import Checkpoint, Engine, EngineServices
from genlm_hf.call_plan import MIN_COMMON, plan_round
from genlm_hf.config import HFConfig
from genlm_hf.cpu_linear import pack_linears, packing_problem, unpack_linears
from genlm_hf.fused import FusedLlama, fused_reason
from genlm_hf.loading import dtypes_on, load_model_and_tokenizer
from genlm_hf.passes import (
    PASS_COST,
    PassRow,
    extend_rows,
    kv_layout_problem,
    lay_out,
    pages_needed,
    pass_groups,
    pool_self_check,
    probe_layout,
    run_pass,
    run_plain,
)
from genlm_hf.pool import PAGE, KVPool, KVSeq, PoolFullError
from genlm_hf.pool_budget import new_pool, pool_bound, too_long_for_pool
from genlm_hf.pool_check import record_pool_check, self_check_failed
from genlm_hf.step import DecodeStep

__all__ = ["HFEngine"]

#: rounds of a call that may run branch points (genlm_hf.call_plan); the rest run every context
MAX_BRANCH_ROUNDS = 16


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
        limit = getattr(model.config, "max_position_embeddings", None) or getattr(
            model.config, "n_positions", None
        )
        #: the model's own token positions (None: it states none)
        self.model_positions: int | None = int(limit) if limit else None
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
        #: why the pool cannot hold this model's KV (None: it does): the model's cache is
        #: not plain KV, or the pool's self-check failed on it (``pool_check``)
        self.pool_off = kv_layout_problem(model)
        #: the pool's self-check at load: "passed", "failed: <why>", or "not run: <why>"
        self.pool_check = f"not run: {self.pool_off}" if self.pool_off else "passed"
        if self.pool_off is None:
            failed = pool_self_check(model, self.pad_id)
            if failed is not None:
                self.pool_off = self.pool_check = f"failed: {failed}"
            record_pool_check(model, self.pool_check)
            if failed is not None:
                self_check_failed(failed, config.kv_pool == "required")
        elif config.kv_pool == "required":
            raise ValueError(
                f"hf: kv_pool='required' but this model cannot hold its KV in the pool ({self.pool_off}); "
                "pass kv_pool='auto' to run every call whole, without KV reuse"
            )
        #: every context's KV (genlm_hf.pool); None when the model's KV cannot be kept
        self.pool: KVPool | None = None
        #: the decode step (genlm_hf.step), when static_decode is on
        self.step: DecodeStep | None = None
        self.pool_bound: int | None = None
        reuse = bool(config.prefix_cache) and config.kv_cache_bytes != 0
        if self.pool_off is None:
            device = torch.device(model.device)
            layout = probe_layout(model, self.pad_id)
            # without reuse the pool holds only the running call's KV, under the auto bound
            option = config.kv_cache_bytes if reuse else "auto"
            bound = pool_bound(option, device, layout.column_bytes * PAGE)
            #: the pool's bound in bytes (None: none)
            self.pool_bound = bound
            self.pool = new_pool(layout, bound)
            self.pool.reclaim = self._reclaim
            self.step = _decode_step(model, config, self.pool, self.pad_id)
            capacity = self.pool.capacity()
            if capacity is not None:  # the longest context the bound holds: the core refuses longer
                self.max_positions = capacity + 1
        #: KV prefix reuse (the prefix cache keeps page tables; the pool bounds the KV)
        self.kv = self.services.kv_reuse(
            problem=self.pool_off,
            sizeof=lambda seq: 0,  # a kept context's pages are the pool's (kv_pool_bytes_in_use)
            budget=None if reuse else 0,
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
        #: the call's last lookup (context -> (depth, kept KV)) until a pass keeps KV
        self._looked: dict[tuple[int, ...], Any] | None = None
        #: pages the running pass reads (see :meth:`_reserve`)
        self._protected: set[int] = set()
        #: the cost of one more eager pass, in token positions (genlm_hf.passes.pass_groups)
        self.pass_cost = PASS_COST
        #: passes and what they read: rows, span columns read once for a group, private columns
        self.counts = {
            "pool_passes": 0,
            "call_rounds": 0,
            "span_rows": 0,
            "span_columns": 0,
            "private_columns": 0,
        }

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
        left (the pass then runs in parts; the pool never passes its bound)."""
        cache = self.kv.cache if self.kv is not None else None
        if cache is None:
            return False
        held = self._protected
        keep = (lambda seq: all(p in held for p in seq.pages)) if held else None
        self._looked = None  # a lookup's kept KV may be released now
        try:
            return cache.evict_lru_kv(keep, leaves_only=True) is not None
        except TypeError:  # a registered prefix cache without leaves_only
            return cache.evict_lru_kv(keep) is not None

    # ------------------------------------------------------------------ model calls
    def forward(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        """The logits of distinct contexts, one row each. Each context resumes from the
        deepest kept prefix (its pages forked) and runs its new tokens only; its KV is kept
        in the prefix cache (its pages). A call runs in rounds (:mod:`genlm_hf.call_plan`):
        contexts nested in another of the call are read off its row, and a long uncached
        prefix several contexts share runs once, in a round before them. Rows of very
        different suffix lengths run in passes of their own
        (:func:`~genlm_hf.passes.pass_groups`); a pass the pool cannot hold runs in parts."""
        with torch.inference_mode():
            if self.pool is None:
                return run_plain(self.model, contexts, pad_id=self.pad_id, logits_to_keep=self.logits_to_keep)
            try:
                return self._forward_rounds(contexts)
            finally:
                if not self.kv.enabled:  # nothing is kept between calls: the memory goes back
                    self.pool.trim()

    def _forward_rounds(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        kv = self.kv
        out: dict[tuple[int, ...], torch.Tensor] = {}
        pending = list(contexts)
        whole: torch.Tensor | None = None
        rounds = 0
        while pending:
            rounds += 1
            looked = kv.lookup(pending)
            depths = [d for d, _ in looked]
            # the first part's rows fork what this lookup found, unless a pass keeps KV first
            self._looked = dict(zip(pending, looked))
            # a call whose branch points the budget keeps releasing runs every context at last
            # (and without reuse a branch point would never be kept: no branch points)
            branching = kv.enabled and rounds <= MAX_BRANCH_ROUNDS
            plan = plan_round(pending, depths, MIN_COMMON if branching else None)
            rows = [
                PassRow(p.ctx, p.depth, None, read_off=[len(c) for c in p.read_off], wanted=p.wanted)
                for p in plan.rows
            ]
            late: list[tuple[int, ...]] = []
            for group in pass_groups([len(p.ctx) - p.depth for p in plan.rows], self.pass_cost):
                for part in self._run_parts([rows[i] for i in group]):
                    run_rows, logits = part
                    if (
                        whole is None
                        and not out
                        and len(run_rows) == len(contexts)
                        and all(r.wanted and not r.read_off for r in run_rows)
                        and [r.ctx for r in run_rows] == list(contexts)
                    ):
                        whole = logits  # the call's rows in its order: one tensor, normalised as a batch
                    n = 0
                    for r in run_rows:
                        for length in r.read_off:
                            out[r.ctx[:length]] = logits[n]
                            n += 1
                        if r.wanted:
                            out[r.ctx] = logits[n]
                        n += 1
                    late += [r.ctx[:length] for r in run_rows for length in r.missed]
            pending = plan.deferred + late
        self.counts["call_rounds"] += rounds
        if whole is not None:
            return whole
        return torch.stack([out[c] for c in contexts])

    def _run_parts(self, rows: list[PassRow]) -> Iterator[tuple[list[PassRow], torch.Tensor]]:
        """Run ``rows`` in one pass, or in parts when the pool cannot hold their new columns
        at once (no recursion: a stack of parts, each looked up and forked when its pass
        comes, so no part holds pages while another runs). Yields each part's rows and its
        logits (each row's read-off prefixes, then the row)."""
        todo = [rows]
        while todo:
            part = todo.pop()
            self._fork(part)
            try:
                if not self._reserve(part):
                    half = len(part) // 2
                    for r in part:  # given back: the part that runs first may need the pages
                        r.release_fork()
                    todo += [part[half:], part[:half]]
                    continue
                yield part, self._pass(part)
            finally:
                for r in part:  # rows not kept (no reuse, or a failed pass) give their pages back
                    if not r.kept:
                        r.release_fork()

    def _fork(self, rows: list[PassRow]) -> None:
        """Each row forks the deepest kept prefix of its context (its pages, no copy); a
        context read off the row that the row no longer runs (a deeper prefix was kept
        meanwhile) is left for a later round (``row.missed``)."""
        pool = self.pool
        assert pool is not None
        found = self._looked
        if found is not None and all(r.ctx in found for r in rows):
            looked = [found[r.ctx] for r in rows]
        else:
            looked = self.kv.lookup([r.ctx for r in rows]) if self.kv.enabled else [(0, None)] * len(rows)
        for r, (depth, seq) in zip(rows, looked):
            r.depth, r.seq = depth, seq.fork(depth) if seq is not None else KVSeq(pool)
            r.missed += [n for n in r.read_off if n <= depth]
            r.read_off = [n for n in r.read_off if n > depth]

    def _reserve(self, rows: list[PassRow]) -> bool:
        """Room in the pool for the rows' new columns, releasing kept contexts the pass does
        not read; False when a part of several rows does not fit (it runs in two). A
        single row always fits: the context limit (:attr:`max_positions`) is what an empty
        pool holds, so a row that does not is a bug, never a silent overflow."""
        pool = self.pool
        assert pool is not None
        need = pages_needed(rows, pool.page)
        # what the pass reads is the pass's: the prefix cache's entries wholly within it (its
        # rows' prompt) are not released for it, as that would free nothing now and lose them
        self._protected = {p for r in rows for p in r.seq.pages}
        try:
            fits = pool.reserve(need)
        finally:
            self._protected = set()
        if not fits and len(rows) == 1:
            raise PoolFullError(
                f"hf: a context of {len(rows[0].ctx)} tokens does not fit in the KV pool "
                f"({pool.max_pages} pages of {pool.page} tokens; kv_cache_bytes) beside what it reads"
            )
        return fits

    def _pass(self, rows: list[PassRow]) -> torch.Tensor:
        """One pass over ``rows`` (forked, room reserved): their logits, each row's read-off
        prefixes first; each row's context is kept (its read-off prefixes too, as forks)."""
        pool = self.pool
        assert pool is not None
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
        self._looked = None  # what the cache holds changes now: later parts look up again
        for r in rows:
            for n in r.read_off:  # a nested context's KV: the first columns of the row's
                fork = r.seq.fork(n)
                if not self.kv.store(r.ctx[:n], fork):
                    fork.release()
            r.kept = self.kv.store(r.ctx, r.seq)
        return logits

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

    def context_limit_error(self, tokens: int) -> str | None:
        """The pool's bound, when it is what refuses a context of ``tokens`` tokens."""
        pool = self.pool
        window = self.model_positions
        if pool is None or pool.max_pages is None or (window is not None and tokens > window - 1):
            return None
        return too_long_for_pool(pool, tokens, self.pool_bound)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.counts)
        out["kv_pool_check"] = self.pool_check
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
        runs an uncaptured step per bucket. :meth:`close` frees them. On the CPU the
        memory of the pages released goes back to the OS (:meth:`~genlm_hf.pool.KVPool.trim`)."""
        self.kv.clear()
        if self.pool is not None:
            self.pool.trim()

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
