"""The static step: a call whose every row runs one new token, run in a shape fixed per
bucket so that it can be captured as a CUDA graph and replayed (:class:`StaticStep`,
on when ``static_decode`` is; not the engine's ``"decode"`` capability).

A program's particles call once a step, each on its context of the step before plus one
token (SIS, SMC, a burst's steps, the byte beam's extensions). Over the KV pool such a
call is one token a row: the rows fork their parents' pages and write one column each.
The eager pass (:func:`genlm_hf.eager_pass.run_pass`) builds its inputs, masks and
gathers with shapes that change every call, so it cannot be replayed; a
:class:`StepBucket` has them fixed:

* a bucket is ``(B, U, L)``: ``B`` rows (the call's rows rounded up to a power of two,
  the rest padding), ``U`` private columns a row (rounded up, at least
  :data:`MIN_WIDTH`), and ``L`` columns of one shared span (rounded up; 0 when no group
  of rows shares one);
* its inputs are one int64 tensor on the device, sliced into the new tokens, their
  positions, the slots their KV goes to, each row's private slots and their count, the
  span's slots, its length and which rows read it; one host-to-device copy a step fills
  them all;
* the masks are computed on the device from those inputs (a row reads its private slots
  below its count, and the span's columns below its length if it is in the group);
* on CUDA the step is captured once per bucket (after two warm-up runs on a side stream)
  and replayed; a capture the model cannot take turns graphs off (a note), unless
  ``static_decode="on"`` (it raises).

The step is the model's own forward through the pool's attention, or, for Llama-family
models, genlm-hf's fused step (:mod:`genlm_hf.fused`: fewer kernels). Both read the same
pool, so a row computed by the step and one computed by an eager pass continue each
other. A graph reads the pool's tensor where it was at capture: when the pool grows (a
new tensor), every bucket is captured again.

Buckets are kept least recently used first, at most :data:`MAX_BUCKETS` (each holds its
inputs and, on CUDA, its graph's memory pool: activations of ``B`` rows).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from genlm_core.engine import note
from genlm_hf.attention import PoolPass, SharedSpan, use_pool_attention
from genlm_hf.fused import FusedLlama
from genlm_hf.pass_layout import Layout, PassRow
from genlm_hf.pool import PAD_SLOT, KVPool

__all__ = ["MAX_BUCKETS", "MIN_WIDTH", "StaticStep", "StepBucket", "bucket_size"]

#: the fewest private columns of a bucket
MIN_WIDTH = 16
#: the fewest columns of a bucket's shared span
MIN_SPAN_WIDTH = 64
#: the buckets kept (least recently used dropped first)
MAX_BUCKETS = 32


def bucket_size(n: int, least: int = 1) -> int:
    """``n`` rounded up to a power of two, at least ``least``."""
    b = least
    while b < n:
        b *= 2
    return b


class StepBucket:
    """One ``(B, U, L)`` shape: its inputs on the device and, once run on CUDA, its graph."""

    def __init__(
        self, model: Any, pool: KVPool, key: tuple[int, int, int], fused: FusedLlama | None, graph: bool
    ) -> None:
        B, U, L = key
        self.key = key
        self.model = model
        self.pool = pool
        self.fused = fused
        device = pool.layout.device
        # ids, pos, write (B each), private (B * U), width (B), span slots (L), in span (B), span length (1)
        self.sizes = (B, B, B, B * U, B, L, B, 1)
        self.inputs = torch.zeros(sum(self.sizes), dtype=torch.long, device=device)
        parts = self.inputs.split(self.sizes)
        self.ids, self.pos = parts[0].view(B, 1), parts[1].view(B, 1)
        self.write, self.private, self.width = parts[2], parts[3], parts[4]
        self.span, self.in_span, self.span_len = parts[5], parts[6], parts[7]
        self._cols = torch.arange(U, device=device)
        self._span_cols = torch.arange(L, device=device)
        self._rows = torch.arange(B, device=device)
        # the masks' values, made here: a tensor built from a host value inside a capture
        # would be a copy from the host, which a graph cannot replay
        self._zero = torch.zeros((), device=device)
        self._ninf = torch.full((), float("-inf"), device=device)
        self.use_graph = graph
        self.graph: Any = None
        self.captured_at = -1  # the pool's growth count its graph reads the tensor of
        self.out: torch.Tensor | None = None

    def _pass(self) -> PoolPass:
        B, U, L = self.key
        zero, ninf = self._zero, self._ninf
        mask = torch.where(self._cols[None, :] < self.width[:, None], zero, ninf).view(B, 1, 1, U)
        spans = []
        if L:
            reads = (self._span_cols[None, :] < self.span_len) & (self.in_span[:, None] > 0)
            span_mask = torch.where(reads, zero, ninf).view(B, 1, 1, L)
            spans.append(SharedSpan(self._rows, L, slots=self.span, mask=span_mask))
        return PoolPass(self.pool, write=self.write, private=self.private, mask=mask, shared=spans)

    def step(self) -> torch.Tensor:
        """The model on the inputs: ``(B, V')`` logits. Reads only static tensors and the
        pool (capturable)."""
        run = self._pass()
        if self.fused is not None:
            return self.fused.step(self.ids, self.pos, run.attend)
        with use_pool_attention(self.model, run, self.pool.layout.layers):
            return self.model(
                input_ids=self.ids, position_ids=self.pos, use_cache=False, logits_to_keep=1
            ).logits[:, -1]

    def fill(self, rows: list[PassRow], layout: Layout, pad_id: int) -> None:
        """The inputs of ``rows`` (each one new token, extended and laid out; one span at most)."""
        B, U, L = self.key
        n = len(rows)
        ids = [r.ctx[-1] for r in rows] + [pad_id] * (B - n)
        pos = [r.depth for r in rows] + [0] * (B - n)
        write = [new[0] for new in layout.new] + [PAD_SLOT] * (B - n)
        private: list[int] = []
        for cols in layout.private:
            private += cols + [PAD_SLOT] * (U - len(cols))
        private += [PAD_SLOT] * (U * (B - n))
        width = [len(c) for c in layout.private] + [1] * (B - n)  # a padding row reads the pad slot
        span, in_span, span_len = [PAD_SLOT] * L, [0] * B, 0
        if layout.spans:
            members, span_len = layout.spans[0]
            span[:span_len] = rows[members[0]].seq.slots(0, span_len)
            for m in members:
                in_span[m] = 1
        host = torch.tensor(
            [*ids, *pos, *write, *private, *width, *span, *in_span, span_len], dtype=torch.long
        )
        # queued behind the device's work (no wait): the bytes are staged at once
        self.inputs.copy_(host, non_blocking=True)

    def capture(self) -> None:
        """Warm up on a side stream (twice: each run writes the same KV), then capture the
        step; the capture's replay computes this step."""
        device = self.inputs.device
        side = torch.cuda.Stream(device=device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self.step()
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the engine may capture in a worker thread while the program's thread
        # copies rows off the device; "global" would break the capture on such a call
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            self.out = self.step()
        self.graph = graph
        self.captured_at = self.pool.grown
        graph.replay()

    def run(self) -> torch.Tensor:
        """The step on the filled inputs (the graph's output on CUDA: read it before the
        bucket runs again)."""
        if not self.use_graph:
            return self.step()
        if self.graph is None or self.captured_at != self.pool.grown:
            self.graph = None
            self.capture()
        else:
            self.graph.replay()
        assert self.out is not None
        return self.out


class StaticStep:
    """The one-token step of one engine in fixed shapes, captured on CUDA: its buckets
    (see the module doc)."""

    def __init__(
        self,
        model: Any,
        pool: KVPool,
        *,
        batch_size: int,
        graph: bool,
        pad_id: int,
        max_columns: int | None,
        strict: bool = False,
        fused: FusedLlama | None = None,
        fused_off_reason: str | None = None,
    ) -> None:
        self.model = model
        self.pool = pool
        self.batch_size = batch_size
        self.graph = graph
        self.pad_id = pad_id
        self.max_columns = max_columns
        self.strict = strict  # a capture that fails raises (static_decode="on")
        #: the fused step new buckets run (genlm_hf.fused), and why there is none
        self.fused = fused
        self.fused_off_reason = fused_off_reason
        self._fused_ran = False
        self.buckets: OrderedDict[tuple[int, int, int], StepBucket] = OrderedDict()
        self.steps = 0
        self.captured = 0
        self.capture_failed = 0
        self.declined = 0  # one-token calls left to the eager pass (no bucket fits)

    def bucket(self, rows: list[PassRow], layout: Layout) -> tuple[int, int, int] | None:
        """The bucket of a call (None: its private columns exceed the model's positions)."""
        B = bucket_size(len(rows))
        if B > max(self.batch_size, len(rows)):
            B = len(rows)
        U = bucket_size(layout.width, MIN_WIDTH)
        L = bucket_size(layout.spans[0][1], MIN_SPAN_WIDTH) if layout.spans else 0
        if self.max_columns is not None:
            if layout.width > self.max_columns:
                return None
            U = min(U, self.max_columns)
            L = min(L, self.max_columns)
        return B, U, L

    def run(self, rows: list[PassRow], layout: Layout) -> torch.Tensor | None:
        """The logits ``(n, V')`` of ``rows`` (one new token each, extended, laid out with
        at most one span), or None when no bucket takes them (the caller runs an eager pass)."""
        key = self.bucket(rows, layout)
        if key is None:
            self.declined += 1
            return None
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = StepBucket(self.model, self.pool, key, self.fused, self.graph)
            self.buckets[key] = bucket
            while len(self.buckets) > MAX_BUCKETS:
                self.buckets.popitem(last=False)
        self.buckets.move_to_end(key)
        bucket.fill(rows, layout, self.pad_id)
        fresh = bucket.use_graph and bucket.graph is None
        try:
            out = bucket.run()
        except Exception as exc:  # noqa: BLE001 - a model the capture (or the fused step) cannot take
            out = self._recover(bucket, exc, fresh)
            fresh = False
        self.captured += fresh
        self.steps += 1
        self._fused_ran = self._fused_ran or bucket.fused is not None
        return out[: len(rows)]

    def _recover(self, bucket: StepBucket, exc: Exception, fresh: bool) -> torch.Tensor:
        """Run a step that failed: without the fused step if it never ran here, else
        without graphs if its capture failed (idempotent: the same KV is written again)."""
        if bucket.fused is not None and not self._fused_ran:
            note(
                f"hf: the fused decode step failed on its first step ({exc!r}); the decode step runs "
                "the model's own forward from now on (fused_decode=False skips it)",
                advice=True,
            )
            self.unfuse(f"its first step failed: {exc!r}")
            bucket.fused, bucket.graph = None, None
            return bucket.run()
        if not fresh or self.strict:
            raise exc
        note(
            f"hf: the decode step could not be captured ({exc!r}); it runs without CUDA graphs from "
            "now on, much slower on a GPU (static_decode='on' raises instead)",
            advice=True,
        )
        self.capture_failed += 1
        self.graph = False
        for b in self.buckets.values():
            b.use_graph, b.graph = False, None
        return bucket.run()

    def unfuse(self, why: str) -> None:
        """Buckets run the model's own forward from now on (an adapter was loaded: the fused
        step reads the base weights only)."""
        if self.fused is not None:
            self.fused, self.fused_off_reason = None, why
            self.buckets.clear()

    def clear(self) -> None:
        self.buckets.clear()

    def stats(self) -> dict[str, Any]:
        return {
            "static_steps": self.steps,
            "static_captured": self.captured,
            "static_capture_failed": self.capture_failed,
            "static_declined": self.declined,
            "static_buckets": len(self.buckets),
            "fused_decode": self.fused is not None,
            "fused_decode_off": self.fused_off_reason,
        }
