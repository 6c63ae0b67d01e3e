"""LlamaCppEngine: llama.cpp as a genlm-core engine, reading GGUF files directly.

Importing this module does not import llama_cpp; creating an engine does.

* ``forward`` computes many contexts per engine call: every context gets a KV
  sequence of its own, its new tokens go into one ``llama_decode`` batch (split in
  ``n_batch``-token decodes when longer) and the logits of its last position are read
  copied out of llama.cpp's output buffer into a row of its own (no batch tensor); the
  core normalises each row.
* KV prefix reuse (capability ``"resume"``): each computed context keeps its sequence and
  is handed back to the core as a payload naming the sequence and how many of its
  positions the context covers. The sequence is the payload's owner: the core counts the kept
  prefixes reading it and hands it back (:meth:`LlamaCppEngine.release_kv`: ``seq_rm``)
  when none is left. A row resumes the sequence of its kept prefix in place when that
  prefix is where the sequence ends (a particle's one-token step: one token computed, no
  new sequence, the shorter prefix still kept), or copies the prefix into a sequence of
  its own (``llama_memory_seq_cp``: the unified KV cache shares the cells) and computes
  only its remaining tokens.
* Before the core hands over a set of rows it asks what they lack
  (:meth:`LlamaCppEngine.kv_shortfall`: sequences and KV cells, counted by
  :mod:`genlm_llamacpp.kv_cells`, the cells under ``kv_cache_tokens`` too) and releases
  kept prefixes the rows do not read (the prompt and a fixed subset of particles stay:
  :mod:`genlm_core.engine.kv_resident`), or runs the rows in parts.
* The byte vocabulary comes from the GGUF's tokenizer (:mod:`genlm_llamacpp.tokenizer`);
  the checkpoint (the GGUF file, its context length and EOS id) is the core's reading.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from genlm_core.engine import Checkpoint, Engine, EngineServices, note
from genlm_core.engine.kv_rows import KVPolicy, ResumeRow, RowsOut
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


class LlamaCppEngine(Engine[LlamaCppConfig]):
    """Batched, prefix-reusing next-token log-probabilities from a GGUF model on llama.cpp."""

    config_class = LlamaCppConfig
    #: bursts: the core's decode step over forward; each row resumes its sequence
    supports = frozenset({"burst", "resume"})
    forward_in_thread = False  # llama.cpp computes on every core already
    #: named when a context is past the limit it sets below the model's window
    max_positions_option = "n_ctx"

    def __init__(
        self,
        context: "LlamaContext",
        config: LlamaCppConfig | None = None,
    ) -> None:
        from genlm_llamacpp.tokenizer import GGUFTokenizer, byte_vocab

        config = config or LlamaCppConfig()
        self.context = context
        self.byte_vocab, self.str_vocab = byte_vocab(context)
        self.tokenizer = GGUFTokenizer(context, self.byte_vocab)
        self.max_positions = context.max_context
        self.free_sequences: list[int] = list(range(context.n_seq_max))
        self.ledger = CellLedger(context.n_ctx)
        #: every context computed alone in an emptied KV cache (see LlamaCppConfig.batch_invariant)
        self.batch_invariant: bool = context.batch_invariant
        self.decode_calls = 0
        self.kv_cache_tokens = config.kv_cache_tokens
        if self.kv_cache_tokens and not self.batch_invariant:
            # the budget bounds the cells of a context computed alone: the core refuses longer
            self.max_positions = min(self.max_positions, self.kv_cache_tokens + 1)

    @classmethod
    def load(
        cls, checkpoint: Checkpoint, config: LlamaCppConfig, services: EngineServices
    ) -> "LlamaCppEngine":
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
        return cls(context, config)

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

    # ------------------------------------------------------------------ KV reuse ("resume")
    def kv_policy(self) -> KVPolicy:
        """No kept prefix when every context is computed alone (``batch_invariant``) or
        ``kv_cache_tokens=0``; otherwise the cells bound the KV (``kv_shortfall``: a prompt
        that sequences share holds its cells once, so the budget counts distinct cells, not
        each kept prefix's length); an uncached or failed call empties llama.cpp's whole KV
        cache."""
        return KVPolicy(
            budget=0 if self.batch_invariant or self.kv_cache_tokens == 0 else None,
            budget_option="kv_cache_tokens",
            drops_kv=True,
        )

    def kv_size(self, payload: CachedPrefix) -> int:
        return payload.n_tokens

    def kv_owner(self, payload: CachedPrefix) -> KVSequence:
        return payload.kv

    def release_kv(self, owner: KVSequence) -> None:
        """No kept prefix reads the sequence: its KV removed from llama.cpp, its cells and id free."""
        self.context.seq_remove(owner.seq_id)
        self.ledger.remove(owner.seq_id)
        self.free_sequences.append(owner.seq_id)

    def kv_shortfall(self, rows: list[ResumeRow]) -> int:
        """The sequences and KV cells the rows need beyond the free ones (a row extending
        its source's sequence in place takes no sequence; a copied prefix shares its cells);
        free cells are those under ``kv_cache_tokens`` too, where it is set."""
        if self.batch_invariant:
            return 0
        sequences = len(rows) - len(_in_place(rows))
        cells = sum(r.new_tokens for r in rows)
        free = self.ledger.free
        if self.kv_cache_tokens is not None:
            free = min(free, self.kv_cache_tokens - self.ledger.used)
        return max(0, sequences - len(self.free_sequences)) + max(0, cells - free)

    # ------------------------------------------------------------------ model calls
    def forward_rows(self, rows: list[ResumeRow]) -> RowsOut:
        """Each row's logits copied out of llama.cpp's output buffer into a row of its own
        (the core normalises each), and each context's sequence handed back."""
        contexts = [r.context for r in rows]
        if self.batch_invariant:
            return RowsOut([self._alone(c, _row) for c in contexts])
        plan = self._plan(rows)
        out = self._decode_plan(contexts, plan, _row)
        for c, (_, kv) in zip(contexts, plan):
            kv.length = len(c)
        return RowsOut(out, [(c, CachedPrefix(kv, len(c))) for c, (_, kv) in zip(contexts, plan)])

    def forward_uncached(self, contexts: list[tuple[int, ...]]) -> "list[torch.Tensor]":
        """Each context alone in an emptied KV cache (see :meth:`_alone`): the reference
        computation, the same bits whatever was cached before (the KV cache is dropped)."""
        return [self._alone(c, _row) for c in contexts]

    def logits(self, contexts: list[tuple[int, ...]]) -> "torch.Tensor":
        """Raw logits (float32, ``(len(contexts), model vocabulary)``), copied out of
        llama.cpp, each context from its start, nothing kept."""
        import torch

        return torch.stack(list(self.forward(contexts)))

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

    def _plan(self, rows: list[ResumeRow]) -> list[tuple[int, KVSequence]]:
        """``(depth, sequence)`` per row: the source's sequence, extended in place, where
        the row continues where it ends (the first such row), else a free sequence with the
        source's prefix copied in (before any decode extends the source)."""
        plan: list[tuple[int, KVSequence]] = []
        in_place = _in_place(rows)
        ledger = self.ledger
        for i, r in enumerate(rows):
            src: CachedPrefix | None = r.payload
            if i in in_place:
                assert src is not None
                plan.append((r.depth, src.kv))
                continue
            if not self.free_sequences:
                raise RuntimeError(  # pragma: no cover - the core made room (kv_shortfall)
                    f"llamacpp: no free KV sequence for a row (n_seq_max={self.context.n_seq_max})"
                )
            kv = KVSequence(self.free_sequences.pop())
            if src is not None:
                self.context.seq_copy(src.kv.seq_id, kv.seq_id, r.depth)
                ledger.copy(src.kv.seq_id, kv.seq_id, r.depth)
            plan.append((r.depth, kv))
        return plan

    def _decode_plan(
        self,
        chunk: list[tuple[int, ...]],
        plan: list[tuple[int, KVSequence]],
        convert: "Callable[[np.ndarray], Any]",
    ) -> list:
        """Decode the planned tokens (``n_batch`` a call); the converted logits of each
        context's last position, in order. A failed decode leaves sequences half computed:
        the whole KV cache is dropped, so none is ever reused (the core forgets what it
        kept: ``KVPolicy.drops_kv``)."""
        from genlm_llamacpp.llama_context import NoKVSpace, Row

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
                out += [convert(row) for row in logits]
        except NoKVSpace:
            # the ledger and llama.cpp disagree (never seen): nothing half computed is kept
            self._drop_all_kv()
            raise RuntimeError(
                f"llamacpp: the {self.context.n_ctx} KV cells (kv_cells) could not hold this batch; "
                "raise kv_cells or lower batch_size"
            ) from None
        except BaseException:
            self._drop_all_kv()
            raise
        return out

    def context_limit_error(self, tokens: int) -> str | None:
        """The KV cells' bound, when ``kv_cells`` below ``n_ctx`` is what refuses a context of
        ``tokens`` tokens (else the core names n_ctx or the model's window)."""
        ctx = self.context
        if ctx.max_context >= ctx.n_positions:
            return self._budget_limit_error(tokens)
        return (
            f"llama.cpp's KV cache was given kv_cells={ctx.max_context}, fewer cells than n_ctx="
            f"{ctx.n_positions} positions; a context of {tokens} tokens needs kv_cells >= {tokens + 1}: "
            "raise kv_cells in load() (unset, it is at least n_ctx), or truncate the context (keep its last tokens)"
        )

    def _budget_limit_error(self, tokens: int) -> str | None:
        """``kv_cache_tokens``, when it is what refuses a context of ``tokens`` tokens."""
        budget = self.kv_cache_tokens
        if not budget or self.batch_invariant or tokens <= budget or tokens > self.context.max_context - 1:
            return None
        return (
            f"the KV budget (kv_cache_tokens={budget}) holds a context of at most {budget} tokens; a "
            f"context of {tokens} tokens needs kv_cache_tokens >= {tokens}: raise it in load(), or "
            "shorten the context"
        )

    def _drop_all_kv(self) -> None:
        """Empty llama.cpp's whole KV cache (every sequence free)."""
        self.context.clear()
        self.ledger.clear()
        self.free_sequences = list(range(self.context.n_seq_max))

    def clear_cache(self) -> None:
        self._drop_all_kv()

    def close(self) -> None:
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


def _in_place(rows: list[ResumeRow]) -> set[int]:
    """The rows that extend their source's sequence in place: the first row, per
    sequence, whose kept prefix ends where the sequence ends."""
    taken: set[int] = set()
    out: set[int] = set()
    for i, r in enumerate(rows):
        src = r.payload
        if src is not None and src.kv.length == r.depth and id(src.kv) not in taken:
            taken.add(id(src.kv))
            out.add(i)
    return out
