"""A batch-level vLLM V1 logits processor that records next-token logits per request.

vLLM V1 dropped per-request ``SamplingParams(logits_processors=...)``. Its public
extension point is a *batch-level* processor class given to the engine
(``LLM(logits_processors=[CaptureLogitsProcessor])``): the engine builds one
instance per worker, tells it which row of its persistent batch holds which
request (:class:`~vllm.v1.sample.logits_processor.BatchUpdate`: removed, added,
moved), and calls :meth:`apply` with the ``(num_rows, vocab)`` logits of each step.

How a row is mapped to a request:

* a request asks to be captured through ``SamplingParams(extra_args={TAG_KEY: tag})``
  (``tag`` is a string unique in the process, see :func:`new_namespace`);
* :meth:`update_state` keeps ``row -> (tag, output_token_ids)`` in step with the
  persistent batch (removals, additions, one-way moves and swaps, in that order);
* :meth:`apply` copies the logits row of every tagged request that has **no output
  token yet** into the process-local :data:`CAPTURED` registry, last write wins.

Why "no output token yet" and "last write wins" give the right row: a request
whose prompt is prefilled in several chunks (small ``max_num_batched_tokens``), or
which is preempted and recomputed, appears in several steps; only the step that
completes its prompt samples a token that is kept, and that step is the last one
before its output list grows. Earlier (partial) rows are overwritten; later steps
(if any) see a non-empty output list and are ignored. Returned logits are untouched,
so sampling is unaffected; captured rows stay on the engine's device.

Transport: :data:`CAPTURED` lives in the process that runs the worker. The backend
fetches rows with ``LLM.collective_rpc(...)``, calling methods added to every worker
by :class:`CaptureWorkerExtension` (vLLM's public ``worker_extension_cls`` engine
option). With ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` and one in-process worker (the
default here) ``genlm_pop_captured`` is a plain function call and the rows never
leave the engine's device. With worker processes (``tensor_parallel_size`` /
``pipeline_parallel_size`` > 1, a multiprocessing engine core) the backend calls
``genlm_pop_captured_rows``: one rank (TP rank 0 of the last pipeline stage) writes
its rows into the backend's ``/dev/shm`` buffer, or sends float32 bytes where it
cannot open it (see :mod:`genlm_vllm.transport`).
"""

from __future__ import annotations

import itertools
import os
import threading
import uuid
import weakref
from typing import TYPE_CHECKING, Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

if TYPE_CHECKING:  # pragma: no cover
    from vllm.config import VllmConfig
    from vllm.sampling_params import SamplingParams

__all__ = [
    "TAG_KEY",
    "CAPTURED",
    "CaptureLogitsProcessor",
    "new_namespace",
    "pop_captured",
    "discard",
    "capture_args",
    "CaptureWorkerExtension",
]

#: key of ``SamplingParams.extra_args`` that marks a request for capture
TAG_KEY = "genlm_capture"

#: process-local registry: request tag -> logits row (on the engine's device)
CAPTURED: dict[str, torch.Tensor] = {}
_LOCK = threading.Lock()
_NAMESPACES = itertools.count()
#: live processor instances of this process (diagnostics and tests: ``.steps``)
INSTANCES: weakref.WeakSet[CaptureLogitsProcessor] = weakref.WeakSet()


def new_namespace() -> str:
    """A prefix unique in this process, so two engines' tags never collide."""
    return f"{uuid.uuid4().hex[:8]}-{next(_NAMESPACES)}"


def pop_captured(tags: list[str]) -> list[torch.Tensor | None]:
    """Remove and return the rows captured for ``tags`` (None where none was)."""
    with _LOCK:
        return [CAPTURED.pop(t, None) for t in tags]


def discard(tags: list[str]) -> None:
    with _LOCK:
        for t in tags:
            CAPTURED.pop(t, None)


class CaptureLogitsProcessor(LogitsProcessor):
    """Records the logits row of each tagged request; returns logits unchanged."""

    def __init__(self, vllm_config: "VllmConfig", device: torch.device, is_pin_memory: bool) -> None:
        self.device = device
        # persistent-batch row -> (tag, running output token list of that request)
        self.rows: dict[int, tuple[str, list[int]]] = {}
        self.steps = 0  # apply() calls
        self.captures = 0  # rows recorded (partial-prefill rows included)
        self._reply: bool | None = None  # whether this rank hands rows back (first apply)
        INSTANCES.add(self)

    @classmethod
    def validate_params(cls, sampling_params: "SamplingParams") -> None:
        extra = sampling_params.extra_args or {}
        tag = extra.get(TAG_KEY)
        if tag is not None and not isinstance(tag, str):
            raise ValueError(f"extra_args[{TAG_KEY!r}] must be a string, got {type(tag).__name__}")

    def is_argmax_invariant(self) -> bool:
        # False: vLLM then applies it on every step, greedy or not.
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        rows = self.rows
        for index in batch_update.removed:
            rows.pop(index, None)
        for index, params, _prompt, output_ids in batch_update.added:
            tag = (params.extra_args or {}).get(TAG_KEY) if params is not None else None
            if tag is None:
                rows.pop(index, None)  # an untagged request replaces whatever was there
            else:
                rows[index] = (tag, output_ids)
        for a, b, direction in batch_update.moved:
            ra, rb = rows.pop(a, None), rows.pop(b, None)
            if ra is not None:
                rows[b] = ra
            if direction == MoveDirectionality.SWAP and rb is not None:
                rows[a] = rb

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        self.steps += 1
        if not self.rows:
            return logits
        if self._reply is None:  # parallel groups exist by the first step
            self._reply = is_reply_rank()
        if not self._reply:  # another rank holds the same rows and answers for them
            return logits
        want = [(i, tag) for i, (tag, out) in self.rows.items() if not out and i < logits.shape[0]]
        if not want:
            return logits
        index = torch.tensor([i for i, _ in want], dtype=torch.long).to(logits.device, non_blocking=True)
        picked = logits.index_select(0, index)  # a copy: later in-place edits do not reach it
        with _LOCK:
            for k, (_, tag) in enumerate(want):
                CAPTURED[tag] = picked[k]
        self.captures += len(want)
        return logits


class CaptureWorkerExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``): the fetch endpoint."""

    def genlm_pop_captured(self, tags: list[str]) -> list[torch.Tensor | None]:
        return pop_captured(list(tags))

    def genlm_discard_captured(self, tags: list[str]) -> None:
        discard(list(tags))

    def genlm_weight_dtype(self) -> str:
        """The dtype of the worker's model weights (first floating parameter), e.g. "float32"."""
        for param in self.get_model().parameters():  # type: ignore[attr-defined]
            if param.is_floating_point():
                return str(param.dtype).removeprefix("torch.")
        return "float32"

    def genlm_pop_captured_rows(
        self, tags: list[str], buffer: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        """For workers in other processes: the replying rank hands its rows back through
        the backend's shared-memory buffer (bytes where it cannot open it, see
        :mod:`genlm_vllm.transport`); every other rank drops its copies and answers None."""
        from genlm_core.engine.row_transport import write_rows

        rows = pop_captured(list(tags))
        if not is_reply_rank():
            return None
        return write_rows(rows, buffer)

    def genlm_forget_buffer(self, name: str) -> None:
        from genlm_core.engine.row_transport import forget

        forget(name)

    def genlm_prepare_pipeline(self) -> bool:
        """Allocate a later pipeline stage's receive buffers where vLLM did not.

        vLLM 0.32's GPU model runner allocates ``intermediate_tensors`` (what a
        pipeline stage receives from the previous one) in its warm-up dummy run. The
        CPU runner skips that warm-up when nothing is compiled (``enforce_eager=True``),
        so the first step of every later stage fails (``assert self.intermediate_tensors
        is not None`` in ``sync_and_gather_intermediate_tensors``). This allocates them as
        the dummy run would. Returns whether it did.
        """
        from vllm.distributed.parallel_state import get_pp_group

        runner = getattr(self, "model_runner", None)
        if runner is None or get_pp_group().is_first_rank or runner.intermediate_tensors is not None:
            return False
        runner.intermediate_tensors = runner.model.make_empty_intermediate_tensors(
            batch_size=runner.max_num_tokens, dtype=runner.model_config.dtype, device=runner.device
        )
        return True

    def genlm_worker_info(self) -> dict[str, Any]:
        """Where this worker runs (``llm.info()``'s parallel layout; the fault watchdog)."""
        import socket

        tp = pp = None
        try:
            from vllm.distributed.parallel_state import get_pp_group, get_tp_group

            tp, pp = get_tp_group().rank_in_group, get_pp_group().rank_in_group
        except Exception:  # noqa: BLE001 - no parallel groups (should not happen in a worker)
            pass
        return {
            "rank": getattr(self, "rank", None),
            "tp_rank": tp,
            "pp_rank": pp,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "reply": is_reply_rank(),
            # names this engine's CPU communicator segments in /dev/shm (CPU workers)
            "dist_ident": os.environ.get("VLLM_DIST_IDENT"),
        }


def is_reply_rank() -> bool:
    """Whether this worker answers with rows: tensor-parallel rank 0 of the last
    pipeline stage (every TP rank holds the full rows; earlier PP stages none)."""
    try:
        from vllm.distributed.parallel_state import get_pp_group, get_tp_group

        return bool(get_pp_group().is_last_rank and get_tp_group().is_first_rank)
    except Exception:  # noqa: BLE001 - no parallel groups: a lone worker replies
        return True


def capture_args(tag: str) -> dict[str, Any]:
    """``SamplingParams.extra_args`` asking for ``tag`` to be captured."""
    return {TAG_KEY: tag}


def row_params(tag: str, read_prefix_cache: bool, fork: tuple[str, int] | None = None) -> Any:
    """The ``SamplingParams`` of one captured row: a one-token greedy turn whose row the
    capture processor records under ``tag`` (the sampled token is never used), reading
    vLLM's prefix cache or not; ``fork``: (a live request's id, tokens) whose KV the
    request's prompt starts with, copied rather than prefilled (:mod:`genlm_vllm.fork`)."""
    from vllm import SamplingParams

    extra = capture_args(tag)
    if fork is not None:
        from genlm_vllm.fork import fork_params

        extra.update(fork_params(*fork))
    return SamplingParams(
        max_tokens=1,
        temperature=0.0,
        ignore_eos=True,
        detokenize=False,
        extra_args=extra,
        skip_reading_prefix_cache=None if read_prefix_cache else True,
    )
