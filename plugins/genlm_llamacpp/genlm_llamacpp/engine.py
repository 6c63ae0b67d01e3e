"""LlamaCppEngine: llama.cpp as a genlm-core engine, reading GGUF files directly.

Importing this module does not import llama_cpp; creating an engine does.

* ``forward`` computes many contexts per engine call: every context gets a KV
  sequence of its own, its new tokens go into one ``llama_decode`` batch (split in
  ``n_batch``-token decodes when longer) and the logits of its last position are read
  copied out of llama.cpp's output buffer into a row of its own (no batch tensor); the
  core normalises each row.
* KV prefix reuse: each computed context keeps its sequence, recorded in the
  :class:`~genlm_core.engine.kv_reuse.KVReuse` the core lends at load (``services.kv_reuse``:
  the payload names the sequence and how many of its positions the context covers; its
  size is that token count, bounded by ``kv_cache_tokens``). The sequence is the payload's
  owner: the core counts the cached prefixes and running calls reading it and frees it
  (:meth:`LlamaCppEngine._free_kv`) when none is left. A later context extends the sequence of its deepest cached
  proper prefix in place when that prefix is where the sequence ends (a particle's
  one-token step: one token computed, no new sequence, the shorter prefix still
  cached), or copies the prefix into a sequence of its own (``llama_memory_seq_cp``:
  the unified KV cache shares the cells) and computes only its remaining tokens.
* Every group of contexts is planned before it decodes: the sequences and KV cells it
  needs are counted (:mod:`genlm_llamacpp.kv_cells`) and least recently used entries it
  does not read are evicted once, enough for the group; an entry's sequence is removed
  from llama.cpp (``seq_rm``) when no entry reads it any more.
* The byte vocabulary comes from the GGUF's tokenizer (:mod:`genlm_llamacpp.tokenizer`);
  the checkpoint (the GGUF file, its context length and EOS id) is the core's reading.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from genlm_core.engine import Checkpoint, Engine, EngineServices, note
from genlm_llamacpp.config import LlamaCppConfig
from genlm_llamacpp.kv_cells import CellLedger

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import torch

    from genlm_llamacpp.llama_context import LlamaContext

__all__ = ["LlamaCppEngine"]


@dataclass(eq=False)
class KVSequence:
    """A KV sequence of the llama.cpp context: ``length`` positions decoded."""

    seq_id: int
    length: int = 0


@dataclass(eq=False)
class CachedPrefix:
    """What the prefix cache holds for a context: the first ``n_tokens`` positions of a
    sequence. A particle's sequence extended in place keeps serving its shorter prefixes."""

    kv: KVSequence
    n_tokens: int


class LlamaCppEngine(Engine):
    """Batched, prefix-reusing next-token log-probabilities from a GGUF model on llama.cpp."""

    config_class = LlamaCppConfig
    #: bursts: the core's decode step over forward; each row resumes its sequence
    supports = frozenset({"burst"})
    forward_in_thread = False  # llama.cpp computes on every core already

    def __init__(
        self,
        context: "LlamaContext",
        config: LlamaCppConfig | None = None,
        services: EngineServices | None = None,
    ) -> None:
        from genlm_llamacpp.tokenizer import GGUFTokenizer, byte_vocab

        config = config or LlamaCppConfig()
        self.services = services if services is not None else EngineServices(config)
        self.context = context
        self.byte_vocab, self.str_vocab = byte_vocab(context)
        self.tokenizer = GGUFTokenizer(context, self.byte_vocab)
        self.max_positions = context.max_context
        self.free_sequences: list[int] = list(range(context.n_seq_max))
        self.ledger = CellLedger(context.n_ctx)
        #: every context computed alone in an emptied KV cache (see LlamaCppConfig.batch_invariant)
        self.batch_invariant: bool = context.batch_invariant
        self.decode_calls = 0
        # the prefix cache counts tokens (kv_cache_tokens); no reuse when every context is
        # computed alone; a payload's sequence is freed when no cached prefix reads it
        self.kv = self.services.kv_reuse(
            budget=0 if self.batch_invariant else config.kv_cache_tokens,
            budget_option="kv_cache_tokens",
            sizeof=lambda payload: payload.n_tokens,
            owner=lambda payload: payload.kv,
            release=self._free_kv,
        )

    @classmethod
    def load(
        cls, checkpoint: Checkpoint, config: LlamaCppConfig, services: EngineServices
    ) -> "LlamaCppEngine":  # type: ignore[override]
        note(f"llamacpp: loading {checkpoint.path}")
        from genlm_llamacpp.llama_context import LlamaContext

        context = LlamaContext(
            checkpoint.path,  # type: ignore[arg-type]
            n_ctx=config.n_ctx,
            n_seq_max=config.n_seq_max,
            kv_cells=config.kv_cells,
            batch_invariant=config.batch_invariant,
            n_batch=config.n_batch,
            n_threads=config.n_threads,
            n_gpu_layers=config.n_gpu_layers,
            kv_cache_type=config.kv_cache_type,
            dtype=str(services.dtype),
            flash_attn=config.flash_attn,
            extra_buffers=config.cpu_extra_buffers,
        )
        return cls(context, config, services)

    @property
    def dtype(self) -> str:  # type: ignore[override]
        """The precision of the KV cache and attention (activations are float32; the
        weights are the GGUF's own, :attr:`weights_type`). A q8_0 cache reads as float16.
        Read where the core did not place the engine (built by hand)."""
        return {"f32": "float32", "bf16": "bfloat16"}.get(self.context.kv_cache_type, "float16")

    @property
    def weights_type(self) -> str:
        """The GGUF's weight type as llama.cpp names it: ``"F32"``, ``"F16"``, ``"Q4_1"``..."""
        return self.context.weights_type

    # ------------------------------------------------------------------ model calls
    def forward(self, contexts: list[tuple[int, ...]]) -> "list[torch.Tensor]":
        """Each context's logits copied out of llama.cpp's output buffer into a row of its
        own (the core normalises each). ``contexts`` are distinct."""
        return self._compute(contexts, self.kv.enabled, _row)

    def forward_uncached(self, contexts: list[tuple[int, ...]]) -> "list[torch.Tensor]":
        """Each context alone in an emptied KV cache (see :meth:`_alone`): the reference
        computation, the same bits whatever was cached before (the KV cache is dropped)."""
        self.kv.count(0, 0)
        return [self._alone(c, _row) for c in contexts]

    def logits(self, contexts: list[tuple[int, ...]]) -> "torch.Tensor":
        """Raw logits (float32, ``(len(contexts), model vocabulary)``), copied out of llama.cpp."""
        import numpy as np
        import torch

        rows = self._compute(contexts, self.kv.enabled, lambda logits: logits.copy())
        return torch.from_numpy(np.stack(rows))

    def _compute(
        self, contexts: list[tuple[int, ...]], reuse: bool, convert: "Callable[[np.ndarray], Any]"
    ) -> list:
        """Compute contexts in groups; ``convert`` turns each one's logits (a view of
        llama.cpp's buffer, valid only during the call) into what is returned, in order."""
        self.kv.count(0, 0)  # one engine call; its tokens are counted as they decode
        if self.batch_invariant:
            return [self._alone(c, convert) for c in contexts]
        out: list = []
        for chunk in self._chunks(contexts):
            out += self._run_chunk(chunk, reuse, convert)
        return out

    def _alone(self, context: tuple[int, ...], convert: "Callable[[np.ndarray], Any]") -> Any:
        """``context`` decoded from position 0 in an emptied KV cache: its cells are
        0..len-1 whatever ran before, so its row is a function of the context alone.

        Why it is needed on quantised weights: llama.cpp's attention sums over the
        cells of the shared KV cache in SIMD lanes chosen by cell index, so where a
        context's cells lie (which depends on its batch-mates and on what is cached)
        moves its float32 attention output by ~1e-7; the quantised matmuls then round
        their inputs to 8 bits per 32-value block, and a 1e-7 change that crosses a
        rounding boundary becomes a whole quantisation step (~1e-3), which grows through
        the layers (SmolLM2 Q4_1: up to 0.8 on tail logprobs, KL up to 0.01, measured
        with llama.cpp's tensor callbacks: identical up to the first attention output,
        then the first flipped step). F32 weights keep the ~1e-7 (about 1e-6 on logprobs).
        """
        self._drop_all_kv()
        kv = KVSequence(self.free_sequences.pop())
        try:
            return self._decode_plan([context], [(0, kv)], convert)[0]
        finally:
            self._drop_all_kv()

    def _chunks(self, contexts: list[tuple[int, ...]]) -> list[list[tuple[int, ...]]]:
        """Groups computed together: at most half the sequences (the other half can hold
        their cached sources) and at most ``n_ctx`` cells' worth of tokens counted in
        full, so a group always fits an emptied cache."""
        most = max(1, self.context.n_seq_max // 2)
        chunks: list[list[tuple[int, ...]]] = []
        tokens = 0
        for c in contexts:
            if not chunks or len(chunks[-1]) >= most or tokens + len(c) > self.context.n_ctx:
                chunks.append([])
                tokens = 0
            chunks[-1].append(c)
            tokens += len(c)
        return chunks

    def _run_chunk(
        self, chunk: list[tuple[int, ...]], reuse: bool, convert: "Callable[[np.ndarray], Any]"
    ) -> list:
        """Plan the chunk against free sequences and KV cells, make room once, decode.

        A context whose cached source (its deepest cached proper prefix) ends where the
        source's sequence ends, and that no other context of the chunk extends, decodes
        into that sequence in place (a particle's one-token step takes no new sequence;
        the shorter prefix stays cached, as the first positions of the longer one); the
        others copy the source's prefix into a new sequence. Before anything decodes,
        least recently used cached entries that the chunk does not read are evicted until
        the sequences and cells it needs are free
        (:class:`~genlm_llamacpp.kv_cells.CellLedger` counts cells, shared ones once).
        If even that is not enough, the chunk runs on an emptied cache without reuse
        (``_chunks`` sizes a chunk so that it fits). No decode is ever retried for want
        of a slot.
        """
        from genlm_llamacpp.llama_context import NoKVSpace

        plan = self._plan(chunk, reuse)
        if plan is None:  # its sources and new tokens cannot share the cells: start afresh
            self._drop_all_kv()
            plan = self._plan(chunk, False)
        try:
            rows = self._decode_plan(chunk, plan, convert)
        except NoKVSpace:
            # the ledger and llama.cpp disagree (never seen): one clean retry, not a loop
            self._drop_all_kv()
            plan = self._plan(chunk, False)
            try:
                rows = self._decode_plan(chunk, plan, convert)
            except NoKVSpace:
                self._drop_all_kv()
                raise RuntimeError(
                    f"llamacpp: the {self.context.n_ctx} KV cells (kv_cells) cannot hold this batch even "
                    "with every cached prefix evicted; raise kv_cells or lower batch_size"
                ) from None
        # Every sequence of the chunk is held while the chunk's entries are stored: storing
        # one may evict the older entry that kept another's sequence (a context decoded in
        # place), which must not be freed before its own entry is stored. A sequence that
        # no stored entry reads is freed when the hold ends.
        for c, (_, kv) in zip(chunk, plan):
            kv.length = len(c)
        with self.kv.hold([kv for _, kv in plan]):
            if reuse and self.kv.enabled:
                for c, (_, kv) in zip(chunk, plan):
                    self.kv.store(c, CachedPrefix(kv, len(c)))  # may evict (and release) older entries
        return rows

    def _plan(self, chunk: list[tuple[int, ...]], reuse: bool) -> Any:
        """``(depth, sequence)`` per context, with room made for them; ``None`` when
        evicting every entry the chunk does not read leaves too few sequences or cells
        (never without reuse: ``_chunks`` sizes a chunk for an empty cache)."""
        cache = self.kv.cache
        found: list[tuple[int, CachedPrefix | None]] = (
            self.kv.lookup(chunk) if reuse else [(0, None)] * len(chunk)
        )
        sources = {id(src.kv) for _, src in found if src is not None}
        in_place: set[int] = set()
        for depth, src in found:
            if src is not None and src.kv.length == depth and id(src.kv) not in in_place:
                in_place.add(id(src.kv))
        seqs_needed = len(chunk) - len(in_place)
        cells_needed = sum(len(c) - depth for c, (depth, _) in zip(chunk, found))
        ledger = self.ledger
        while len(self.free_sequences) < seqs_needed or ledger.free < cells_needed:
            if cache is None or cache.evict_lru_kv(keep=lambda seq: id(seq.kv) in sources) is None:
                if reuse:
                    return None
                raise RuntimeError(  # pragma: no cover - _chunks sizes chunks for an empty cache
                    f"llamacpp: a group of {len(chunk)} contexts needs {cells_needed} KV cells and "
                    f"{seqs_needed} sequences; {ledger.free} and {len(self.free_sequences)} are free"
                )
        plan: list[tuple[int, KVSequence]] = []
        claimed: set[int] = set()
        for depth, src in found:
            # in place: the context continues where the sequence ends (a shorter prefix read
            # from the same sequence is copied, like any other)
            if src is not None and src.kv.length == depth and id(src.kv) not in claimed:
                claimed.add(id(src.kv))
                plan.append((depth, src.kv))
                continue
            kv = KVSequence(self.free_sequences.pop())
            if src is not None:  # copied before any decode extends the source in place
                self.context.seq_copy(src.kv.seq_id, kv.seq_id, depth)
                ledger.copy(src.kv.seq_id, kv.seq_id, depth)
            plan.append((depth, kv))
        return plan

    def _decode_plan(
        self,
        chunk: list[tuple[int, ...]],
        plan: list[tuple[int, KVSequence]],
        convert: "Callable[[np.ndarray], Any]",
    ) -> list:
        """Decode the planned tokens (``n_batch`` a call); the converted logits of each
        context's last position, in order. A failed decode leaves sequences half computed:
        the whole KV cache is dropped, so none is ever reused."""
        from genlm_llamacpp.llama_context import Row

        rows: list[Row] = []
        for c, (depth, kv) in zip(chunk, plan):
            last = len(c) - 1
            rows.extend(Row(c[p], p, kv.seq_id, p == last) for p in range(depth, len(c)))
        out: list = []
        step = self.context.n_batch
        try:
            for start in range(0, len(rows), step):
                part = rows[start : start + step]
                self.decode_calls += 1
                logits = self.context.decode(part)
                for r in part:
                    self.ledger.extend(r.seq, 1)
                self.kv.count(len(part), 0, calls=0)
                out += [convert(row) for row in logits]
        except BaseException:
            self._drop_all_kv()
            raise
        self.kv.count(0, sum(depth for depth, _ in plan), calls=0)
        return out

    def _drop_all_kv(self) -> None:
        """Evict every cached entry and empty llama.cpp's KV cache."""
        self.kv.forget()  # llama.cpp's whole KV cache goes next: nothing to free one by one
        self.context.clear()
        self.ledger.clear()
        self.free_sequences = list(range(self.context.n_seq_max))

    def _free_kv(self, kv: KVSequence) -> None:
        """No cached prefix or running call reads the sequence: its KV removed from
        llama.cpp, its cells and id free."""
        self.context.seq_remove(kv.seq_id)
        self.ledger.remove(kv.seq_id)
        self.free_sequences.append(kv.seq_id)

    def clear_cache(self) -> None:
        self._drop_all_kv()

    def close(self) -> None:
        if self.kv is not None:
            self.kv.forget()
        self.context.close()

    def stats(self) -> dict[str, Any]:
        return {
            "decode_calls": self.decode_calls,
            "free_sequences": len(self.free_sequences),
            "kv_cells": self.context.n_ctx,
            "kv_cells_used": self.ledger.used,
            "batch_invariant": self.batch_invariant,
            "n_seq_max": self.context.n_seq_max,
            "weights_type": self.context.weights_type,
            "kv_cache_type": self.context.kv_cache_type,
            "cpu_extra_buffers": self.context.extra_buffers,
            "cpu_extra_buffers_reason": self.context.extra_buffers_reason,
            "system_info": self.context.system_info,
        }


def _row(logits: "np.ndarray") -> "torch.Tensor":
    """A row of logits copied out of llama.cpp's output buffer (valid only during the call)."""
    import torch

    return torch.from_numpy(logits.copy())
