"""HFEngine: a transformers causal LM as a genlm-core engine.

Every context's KV lives in one pool of pages (:mod:`genlm_hf.pool`). The core hands a
call's rows with the deepest kept prefix of each (capability ``"resume"``:
:mod:`genlm_core.engine.kv_calls`); each row forks that prefix's pages (no copy) and runs
only the tokens past it; the engine hands its page table back and the core keeps it, so a
particle that extends its context by one token costs one token of compute and one
column of memory, and a prompt that many particles share is held once.

A call's path (:meth:`HFEngine.forward_rows`), one module a stage:

1. each row forks its kept prefix (:class:`~genlm_hf.pass_layout.PassRow`);
2. rows of very different new-token counts go to passes of their own
   (:mod:`genlm_hf.pass_groups`);
3. per pass, each row takes room for its new columns and the pass is laid out: which
   columns a group of rows reads once as a shared span, which each row gathers
   (:mod:`genlm_hf.pass_layout`);
4. the pass runs: the static step (:mod:`genlm_hf.step`: a fixed shape per bucket,
   captured as a CUDA graph) when every row runs one new token and ``static_decode`` is
   on (on CUDA by default), else one eager pass (:mod:`genlm_hf.eager_pass`); both
   attend through :mod:`genlm_hf.attention`, which reads the span once for its group;
5. the rows' page tables go back to the core.

Bursts are ordinary calls (capability ``"burst"``: the core's decode step). On the CPU
the linear layers run through oneDNN over weights packed at load
(:mod:`genlm_hf.cpu_linear`). LoRA adapters (peft) are the capability ``"lora"``.

A model whose cache is not plain full-attention KV (sliding windows, recurrent state),
or whose attention does not go through transformers' attention interface
(:mod:`genlm_hf.pool_probe`), runs every context whole in padded batches of the model's
own forward, with no KV kept (:mod:`genlm_hf.plain_pass`).

Importing this module imports torch; ``genlm_core.load("hf", ...)`` loads it. Around a
model and tokenizer loaded by hand: ``BaseLogprobBackend(HFEngine(model, tokenizer, config), config)``.
"""

from __future__ import annotations

import gc
import inspect
from typing import Any

import torch

from genlm_core.engine import Checkpoint, Engine, EngineServices
from genlm_core.engine.call_plan import MIN_COMMON
from genlm_core.engine.kv_rows import KVPolicy, ResumeRow, RowsOut
from genlm_hf.config import HFConfig
from genlm_hf.cpu_linear import pack_linears, packing_problem, unpack_linears
from genlm_hf.eager_pass import run_pass
from genlm_hf.fused import FusedLlama, fused_reason
from genlm_hf.loading import dtypes_on, load_model_and_tokenizer
from genlm_hf.pass_groups import PASS_COST, pass_groups
from genlm_hf.pass_layout import PassRow, extend_rows, lay_out
from genlm_hf.plain_pass import run_plain
from genlm_hf.pool import KVPool, KVSeq
from genlm_hf.pool_budget import new_pool, pool_bound, too_long_for_pool
from genlm_hf.pool_check import record_pool_check, self_check_failed
from genlm_hf.pool_probe import kv_layout_problem, pool_self_check, probe_layout
from genlm_hf.step import StaticStep

__all__ = ["HFEngine"]


class HFEngine(Engine[HFConfig]):
    """A transformers causal LM over a KV pool (see the module doc)."""

    config_class = HFConfig
    supports = frozenset({"burst", "lora", "resume"})

    def __init__(self, model: Any, tokenizer: Any, config: HFConfig | None = None) -> None:
        config = config if config is not None else HFConfig()
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
        self.pool_off_reason = kv_layout_problem(model)
        #: the pool's self-check at load: "passed", "failed: <why>", or "not run: <why>"
        self.pool_check = f"not run: {self.pool_off_reason}" if self.pool_off_reason else "passed"
        if self.pool_off_reason is None:
            failed = pool_self_check(model, self.pad_id)
            if failed is not None:
                self.pool_off_reason = self.pool_check = f"failed: {failed}"
            record_pool_check(model, self.pool_check)
            if failed is not None:
                self_check_failed(failed, config.kv_pool == "required")
        elif config.kv_pool == "required":
            raise ValueError(
                f"hf: kv_pool='required' but this model cannot hold its KV in the pool ({self.pool_off_reason}); "
                "pass kv_pool='auto' to run every call whole, without KV reuse"
            )
        #: every context's KV (genlm_hf.pool); None when the model's KV cannot be kept
        self.pool: KVPool | None = None
        #: the static one-token step (genlm_hf.step), when static_decode is on
        self.step: StaticStep | None = None
        self.pool_bound: int | None = None
        reuse = bool(config.prefix_cache) and config.kv_cache_bytes != 0
        if self.pool_off_reason is None:
            device = torch.device(model.device)
            layout = probe_layout(model, self.pad_id)
            # without reuse the pool holds only the running call's KV, under the auto bound
            option = config.kv_cache_bytes if reuse else "auto"
            bound = pool_bound(option, device, layout.page_bytes)
            #: the pool's bound in bytes (None: none)
            self.pool_bound = bound
            self.pool = new_pool(layout, bound)
            self.step = _static_step(model, config, self.pool, self.pad_id)
            capacity = self.pool.capacity()
            if capacity is not None:  # the longest context the bound holds: the core refuses longer
                self.max_positions = capacity + 1
        #: whether the config asks to keep contexts between calls, and whether they are
        #: (their page tables, in the core's prefix cache)
        self.reuse_asked = reuse
        self.reuse = reuse and self.pool_off_reason is None
        #: linear layers packed for oneDNN on the CPU (genlm_hf.cpu_linear), and why not
        self.packed_linears = 0
        self.packed_off_reason: str | None = "cpu_packed_linears=False"
        if config.cpu_packed_linears:
            self.packed_off_reason = packing_problem(model)
            if self.packed_off_reason is None and self.step is not None and self.step.fused is not None:
                self.packed_off_reason = "the fused decode step reads the dense weights"
            if self.packed_off_reason is None:
                self.packed_linears = pack_linears(model)
        #: the cost of one more eager pass, in token positions (genlm_hf.pass_groups)
        self.pass_cost = PASS_COST
        #: passes and what they read: rows, span columns read once for a group, private columns
        self.counts = {
            "pool_passes": 0,
            "span_rows": 0,
            "span_columns": 0,
            "private_columns": 0,
        }

    @classmethod
    def load(cls, checkpoint: Checkpoint, config: HFConfig, services: EngineServices) -> "HFEngine":
        model, tokenizer, _ = load_model_and_tokenizer(checkpoint, config, services.placement)
        return cls(model, tokenizer, config)

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

    # ------------------------------------------------------------------ KV reuse ("resume")
    def kv_policy(self) -> KVPolicy:
        """Kept contexts are page tables over the pool (they cost the cache nothing: the
        pool bounds the KV); past the pool's bound the core keeps the prompt and a fixed
        subset of particles (release ``"resident"``: leaves go, a prompt particles share
        stays while they do, releasing it would free nothing), reads nested contexts off a
        row's logits, and runs a long prefix several contexts share once, first."""
        return KVPolicy(
            problem=self.pool_off_reason,
            budget=None if self.reuse_asked else 0,
            release="resident",
            read_off=self.pool is not None,  # a model run whole hands back last positions only
            branch_tokens=MIN_COMMON,
        )

    def kv_size(self, payload: Any) -> int:
        return 0  # a kept context's pages are the pool's (kv_pool_bytes_in_use)

    def kv_owner(self, payload: Any) -> Any:
        return payload  # each kept context holds its pages until it is released

    def release_kv(self, owner: Any) -> None:
        owner.release()

    def kv_shortfall(self, rows: list[ResumeRow]) -> int:
        """Pages the rows' new columns take that the pool's bound does not hold free (a
        row writing on where its kept context stopped copies no page:
        :meth:`~genlm_hf.pool.KVPool.pages_to_extend`)."""
        pool = self.pool
        if pool is None:
            return 0
        return pool.shortfall(pool.pages_to_extend((r.payload, r.depth, len(r.context)) for r in rows))

    # ------------------------------------------------------------------ model calls
    def forward_rows(self, rows: list[ResumeRow]) -> RowsOut:
        """The rows' logits (each row's read-off prefixes first), each resuming from its
        kept prefix (its pages forked, no copy) and running its new tokens only; hands back
        every context computed as a page table (the row's, and each read-off prefix's: the
        first columns of the row's). Rows of very different new-token counts run in passes
        of their own (:func:`~genlm_hf.pass_groups.pass_groups`)."""
        with torch.inference_mode():
            if self.pool is None:
                contexts = [r.context for r in rows]
                return RowsOut(
                    run_plain(self.model, contexts, pad_id=self.pad_id, logits_to_keep=self.logits_to_keep)
                )
            return self._run_passes(rows)

    def _run_passes(self, rows: list[ResumeRow]) -> RowsOut:
        pool = self.pool
        assert pool is not None
        runs = [PassRow(r.context, r.depth, None, read_off=list(r.read_off), wanted=r.wanted) for r in rows]
        try:
            for run, r in zip(runs, rows):
                run.seq = r.payload.fork(r.depth) if r.payload is not None else KVSeq(pool)
            groups = pass_groups([r.new_tokens for r in rows], self.pass_cost)
            if len(groups) == 1:
                logits = self._pass(runs)
            else:  # each row's logits (its read-offs, then its own) back in the rows' order
                pieces: list[torch.Tensor] = [None] * len(runs)  # type: ignore[list-item]
                for group in groups:
                    out = self._pass([runs[i] for i in group])
                    n = 0
                    for i in group:
                        k = len(runs[i].read_off) + 1
                        pieces[i] = out[n : n + k]
                        n += k
                logits = torch.cat(pieces)
        except BaseException:
            for run in runs:
                run.release_fork()
            raise
        if not self.reuse:  # nothing is kept between calls: the pages and their memory go back
            for run in runs:
                run.release_fork()
            pool.trim()
            return RowsOut(logits)
        kept: list[tuple[tuple[int, ...], Any]] = []
        for run in runs:
            kept += [(run.ctx[:n], run.seq.fork(n)) for n in run.read_off]  # the first columns of the row's
            kept.append((run.ctx, run.seq))
        return RowsOut(logits, kept)

    def _pass(self, rows: list[PassRow]) -> torch.Tensor:
        """One pass over ``rows`` (forked; the core made room): their logits, each row's
        read-off prefixes first."""
        pool = self.pool
        assert pool is not None
        new = extend_rows(rows)
        logits = None
        if self.step is not None and all(r.suffix == 1 for r in rows):
            layout = lay_out(rows, new, max_spans=1)
            logits = self.step.run(rows, layout)
        if logits is None:
            layout = lay_out(rows, new)
            logits = run_pass(
                self.model, pool, rows, layout, pad_id=self.pad_id, logits_to_keep=self.logits_to_keep
            )
        counts = self.counts
        counts["pool_passes"] += 1
        for members, length in layout.spans:
            counts["span_rows"] += len(members)
            counts["span_columns"] += length
        counts["private_columns"] += sum(map(len, layout.private))
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
            out["kv_pool_off"] = self.pool_off_reason
        if self.step is not None:
            out.update(self.step.stats())
        out.update(cpu_packed_linears=self.packed_linears, cpu_packed_linears_off=self.packed_off_reason)
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
            self.packed_linears, self.packed_off_reason = 0, f"LoRA adapter {name!r} loaded"
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
        """Drop every kept context (their pages go back to the pool). The static step's
        buckets stay, with their captured graphs: they hold no KV and no result a later call
        reads, and capturing them again would cost a program that clears its caches between
        runs an uncaptured step per bucket. :meth:`close` frees them. On the CPU the
        memory of the pages released goes back to the OS (:meth:`~genlm_hf.pool.KVPool.trim`).
        The core released every kept context first."""
        if self.pool is not None:
            self.pool.trim()

    def close(self) -> None:
        if self.step is not None:
            self.step.clear()
            self.step.model = None
        self.step = None
        self.pool = None
        self.model = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _static_step(model: Any, config: HFConfig, pool: KVPool, pad_id: int) -> StaticStep | None:
    """The engine's static one-token step per ``static_decode`` ("auto": on CUDA only, captured,
    without graphs if a capture fails; "on": everywhere, captured on CUDA, a failed capture
    raises; "off": none)."""
    mode = config.static_decode
    device = torch.device(model.device)
    if mode == "off" or (mode == "auto" and device.type != "cuda"):
        return None
    limit = getattr(model.config, "max_position_embeddings", None) or getattr(
        model.config, "n_positions", None
    )
    fused, fused_off_reason = None, "fused_decode=False"
    if config.fused_decode:
        fused_off_reason = fused_reason(model)
        if fused_off_reason is None:
            fused = FusedLlama.build(model)
    return StaticStep(
        model,
        pool,
        batch_size=config.batch_size,
        graph=device.type == "cuda",
        pad_id=pad_id,
        max_columns=int(limit) if limit else None,
        strict=mode == "on",
        fused=fused,
        fused_off_reason=fused_off_reason,
    )


def _generation_config(model: Any) -> dict[str, Any]:
    """The loaded model's generation config (a GGUF checkpoint has no file for it)."""
    gen = getattr(model, "generation_config", None)
    return gen.to_dict() if gen is not None and hasattr(gen, "to_dict") else {}
