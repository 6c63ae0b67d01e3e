"""VLLMBackend: genlm-core's LogprobBackend on the vLLM V1 engine (heavy imports here).

One batch of contexts = one ``LLM.generate`` call with ``max_tokens=1``: every
request carries a tag in ``SamplingParams.extra_args``, the engine's
:class:`~genlm_vllm.capture.CaptureLogitsProcessor` records the logits row of each
tagged request in the step that completes its prompt, and the rows are fetched by
tag (see :mod:`genlm_vllm.capture` for the row-to-request mapping). vLLM schedules
the batch as it likes (chunked prefill, preemption, prefix-cache hits); the result
is always in request order.

Sampling uses vLLM's own sampler (seeded per request, stop on token ids). Every
engine call - logprob batches, sampling batches, LoRA switches, cache resets - runs
under the batcher's ``model_lock``: the engine is not thread-safe.

This module holds the class itself: its state, ``from_config``, the logprob path
(capture and fetch), health, ``info`` and ``close``. The rest lives beside it:

* :mod:`genlm_vllm.launch`: starting the engine (environment, ``vllm.LLM`` keyword
  arguments, dtype and spawn-safety checks);
* :mod:`genlm_vllm.sampling` and :mod:`genlm_vllm.lora`: the sampling and LoRA methods
  (mixins of :class:`VLLMBackend`);
* :mod:`genlm_vllm.lifecycle`: the engine's processes (watchdog,
  :class:`EngineDiedError`, shared distributed state, shutdown).

``INSTALL_HINT``, ``VLLMNotInstalledError``, ``EngineDiedError``, ``engine_kwargs``
and ``check_dtype`` are re-exported here, where they were first defined.
"""

from __future__ import annotations

import gc
import itertools
import time
from typing import Any

import torch

from genlm_core.engine import (
    AutoBatcher,
    BaseLogprobBackend,
    LoraAdapters,
    UnsupportedDtypeError,
    checkpoint,
    note,
    summarise_repeats,
)
from genlm_vllm.config import VLLMConfig
from genlm_vllm.launch import (
    INSTALL_HINT,
    VLLMNotInstalledError,
    _announce_start,
    _check_spawn_safe,
    _engine_device,
    _engine_environment,
    _prepare_environment,
    _require_vllm,
    _tolerate_llvmlite,
    _weight_dtype,
    check_dtype,
    engine_kwargs,
)
from genlm_vllm.lifecycle import (
    _LIVE_IN_PROCESS,
    EngineDiedError,
    _core_shutdown_timeout,
    _engine_failed,
    _engine_in_process,
    _engine_processes,
    _mapped,
    _shutdown,
    _stop,
    _Watchdog,
)
from genlm_vllm.lora import VLLMLora
from genlm_vllm.sampling import VLLMSampling, _SampleRequest

__all__ = [
    "INSTALL_HINT",
    "EngineDiedError",
    "VLLMBackend",
    "VLLMNotInstalledError",
    "check_dtype",
    "engine_kwargs",
]


class VLLMBackend(VLLMSampling, VLLMLora, BaseLogprobBackend):
    """LogprobBackend on a ``vllm.LLM`` engine (V1).

    Build it with ``genlm_core.load("vllm", model=...)``, ``VLLMBackend.from_name``
    or ``VLLMBackend(llm_engine, config)`` around an ``LLM`` you made yourself with
    :func:`engine_kwargs` (it must carry the capture processor and worker extension).
    """

    config_class = VLLMConfig
    backend_name = "vllm"

    def __init__(self, llm: Any, config: VLLMConfig | None = None, *, device: str | None = None) -> None:
        from genlm_vllm.capture import new_namespace

        config = config or VLLMConfig()
        self.llm = llm
        self._device = device or _engine_device()
        model_config = llm.llm_engine.model_config
        self._max_model_len = int(model_config.max_model_len)
        # the checkpoint policy (genlm_core.engine.checkpoint), lowered by max_model_len: vLLM
        # needs a position for the one token it generates (prompt < max_model_len)
        hf_config = getattr(model_config, "hf_config", None)
        self._max_context = checkpoint.engine_context_limit(
            checkpoint.context_limit(
                checkpoint.read_config(config.model if config is not None else None)
                or (hf_config.to_dict() if hf_config is not None else {})
            ),
            self._max_model_len - 1,
        )
        self._dtype = _weight_dtype(llm)
        self.in_process = _engine_in_process(llm)
        if self.in_process:
            _LIVE_IN_PROCESS.add(self)
        tokenizer = llm.get_tokenizer()
        super().__init__(tokenizer, config)
        self._namespace = new_namespace()
        # rows from worker processes: see genlm_vllm.transport
        self.transport_counts = {"shm": 0, "bytes": 0}
        self._row_width = int(model_config.get_vocab_size())
        self._buffer: Any = None
        self._dead: str | None = None  # why the engine is unusable (a worker died)
        self.workers: list[dict[str, Any]] = []
        self._engine_procs: list[Any] = []  # its processes here (psutil: workers, a separate core)
        self._engine_segments: set[str] = set()  # what they map in /dev/shm
        if not self.in_process:
            from genlm_core.engine.row_transport import RowBuffer, shm_available, sweep_stale_buffers

            self.workers = [w for w in llm.collective_rpc("genlm_worker_info") if w]
            if llm.llm_engine.vllm_config.parallel_config.pipeline_parallel_size > 1:
                llm.collective_rpc("genlm_prepare_pipeline")  # see CaptureWorkerExtension
            if shm_available():
                sweep_stale_buffers()  # what backends killed without close() left here
                self._buffer = RowBuffer(self._namespace)
            self._watchdog = _Watchdog(self)
            self._engine_procs = _engine_processes(self.workers)
            # what the engine's processes map in /dev/shm (its message queues, the
            # executor's lock, the CPU communicator): removed at close() if left over
            self._engine_segments = _mapped(self._engine_procs)
        self._counter = itertools.count()
        #: engine steps and prompt tokens computed / read from vLLM's prefix cache
        #: (``RequestOutput.num_cached_tokens``), as ``stats()["engine"]`` reports them
        self._forward_calls = 0
        self._tokens_computed = 0
        self._tokens_reused = 0
        self._lora_ids = itertools.count(1)
        self.adapters = LoraAdapters()
        self._lora_requests: dict[str, Any] = {}
        self._active_lora: Any = None  # the active LoRARequest
        self.sample_batcher: AutoBatcher[_SampleRequest, list[int]] = AutoBatcher(
            self._sample_batch_fn,
            batch_size=config.batch_size,
            timeout=config.timeout,
            name="vllm-sample",
        )
        # one engine, one lock: logprob batches and sampling batches never overlap
        self.sample_batcher.model_lock = self.batcher.model_lock

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, config: VLLMConfig) -> "VLLMBackend":
        config.check_model()
        if config.model is None:  # the checkpoint policy: the embedded SmolLM2 (genlm_core.engine.checkpoint)
            config = config.model_copy(update={"model": checkpoint.default_model()})
        _require_vllm()
        _tolerate_llvmlite()
        note(f"vllm: importing vLLM to start an engine for {config.model}")
        device = _engine_device()
        _prepare_environment(config, device)
        from vllm import LLM

        kwargs = engine_kwargs(config, device)
        check_dtype(kwargs["dtype"], device)
        _check_spawn_safe(kwargs, device)
        _announce_start(kwargs, device)
        t0 = time.perf_counter()
        with (
            _engine_environment(kwargs, device),
            summarise_repeats("vllm"),  # e.g. one cast warning per weight
        ):
            llm = LLM(**kwargs)
        note(f"vllm: engine ready in {time.perf_counter() - t0:.0f} s")
        try:
            engine_dtype = str(llm.llm_engine.model_config.dtype).removeprefix("torch.")
            if engine_dtype != kwargs["dtype"]:
                raise UnsupportedDtypeError(
                    "vllm", kwargs["dtype"], device, f"the engine chose {engine_dtype} instead"
                )
            return cls(llm, config, device=device)
        except BaseException:
            _shutdown(llm, keep_distributed=any(b.llm is not None for b in _LIVE_IN_PROCESS))
            raise

    # ------------------------------------------------------------------ engine hooks
    @property
    def device(self) -> str:
        return self._device

    @property
    def dtype(self) -> str:
        """The dtype of the engine's model weights (asked of the worker at start)."""
        return self._dtype

    @property
    def max_context_length(self) -> int:
        return self._max_context  # type: ignore[return-value]

    def _new_tags(self, n: int) -> list[str]:
        return [f"{self._namespace}:{next(self._counter)}" for _ in range(n)]

    def _forward(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        return self._capture(contexts, read_prefix_cache=True)

    def _forward_uncached(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        """The same engine step, reading no KV block from vLLM's prefix cache."""
        return self._capture(contexts, read_prefix_cache=False)

    def _capture(self, contexts: list[tuple[int, ...]], read_prefix_cache: bool) -> torch.Tensor:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        from genlm_vllm.capture import TAG_KEY

        tags = self._new_tags(len(contexts))
        params = [
            SamplingParams(
                max_tokens=1,
                temperature=0.0,
                ignore_eos=True,
                detokenize=False,
                extra_args={TAG_KEY: tag},
                skip_reading_prefix_cache=None if read_prefix_cache else True,
            )
            for tag in tags
        ]
        prompts = [TokensPrompt(prompt_token_ids=list(c)) for c in contexts]
        self._check_healthy()
        try:
            results = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self._active_lora)
            out, missing = self._fetch(tags)
        except BaseException as exc:
            self._check_healthy(exc)
            self._discard(tags)
            raise
        self._count(contexts, results)
        if missing:
            raise RuntimeError(
                f"vllm: no logits were captured for {len(missing)} of {len(contexts)} requests; "
                "is the engine running its workers in another process without the genlm "
                "worker extension?"
            )
        return out

    def _count(self, contexts: list[tuple[int, ...]], results: Any) -> None:
        reused = sum(int(getattr(r, "num_cached_tokens", None) or 0) for r in results or ())
        self._forward_calls += 1
        self._tokens_reused += reused
        self._tokens_computed += sum(len(c) for c in contexts) - reused

    def _fetch(self, tags: list[str]) -> tuple[torch.Tensor, list[int]]:
        """The captured rows in request order, and the indices that have none."""
        if self.in_process:  # a plain call: the worker's own tensors, stacked (one copy)
            from genlm_core.engine.row_transport import stack_rows

            rows = self.llm.collective_rpc("genlm_pop_captured", args=(tags,))[0]
            missing = [i for i, r in enumerate(rows) if r is None]
            return (stack_rows(rows) if not missing else torch.empty(0)), missing
        buffer = self._buffer
        desc = None
        if buffer is not None:
            buffer.ensure(len(tags) * self._row_width * 4)
            desc = buffer.describe()
        replies = self.llm.collective_rpc("genlm_pop_captured_rows", args=(tags, desc))
        reply = next((r for r in replies if r is not None), None)
        if reply is None or not reply["width"]:
            return torch.empty(0), list(range(len(tags)))
        width = self._row_width = int(reply["width"])
        missing = [i for i, p in enumerate(reply["present"]) if not p]
        if missing:
            return torch.empty(0), missing
        if reply.get("shm"):
            self.transport_counts["shm"] += 1
            out = buffer.rows(len(tags), width)  # type: ignore[union-attr]
        else:
            self.transport_counts["bytes"] += 1
            out = torch.stack([torch.frombuffer(bytearray(b), dtype=torch.float32) for b in reply["bytes"]])
        return (out if self._device == "cpu" else out.to(self._device)), []

    # ------------------------------------------------------------------ health
    @property
    def healthy(self) -> bool:
        """False once closed or once a worker process of the engine has died."""
        return not self._closed and self._dead is None and self.llm is not None

    def _mark_dead(self, reason: str) -> None:
        if self._dead is None:
            self._dead = reason
            note(f"vllm: {reason}; the engine cannot answer any more (close() and load again)")

    def _check_healthy(self, cause: BaseException | None = None) -> None:
        """Raise a clear error when the engine lost a worker (``cause``: what vLLM raised)."""
        if self._dead is None and cause is not None and _engine_failed(self.llm):
            self._mark_dead(f"the vLLM engine failed ({type(cause).__name__}: {cause})")
        if self._dead is not None:
            raise EngineDiedError(
                f"vllm: {self._dead}; this backend cannot answer any more: close() it and load a new one"
            ) from cause

    def info(self) -> dict[str, Any]:
        """What runs where: the device, the parallel layout, the workers and the row transport."""
        parallel = self.llm.llm_engine.vllm_config.parallel_config if self.llm is not None else None
        out: dict[str, Any] = super().info()
        out.update(
            {
                "in_process": self.in_process,
                "transport": "in-process tensors"
                if self.in_process
                else (
                    "shared memory (/dev/shm), bytes through the RPC off this node"
                    if self._buffer is not None
                    else "float32 bytes through the RPC"
                ),
                "transport_counts": dict(self.transport_counts),
                "workers": list(self.workers),
            }
        )
        if parallel is not None:
            out.update(
                tensor_parallel_size=int(parallel.tensor_parallel_size),
                pipeline_parallel_size=int(parallel.pipeline_parallel_size),
                data_parallel_size=int(parallel.data_parallel_size),
                world_size=int(parallel.world_size),
                distributed_executor_backend=str(parallel.distributed_executor_backend),
                engine_core="in this process"
                if type(self.llm.llm_engine.engine_core).__name__ == "InprocClient"
                else "own process",
            )
        return out

    def _discard(self, tags: list[str]) -> None:
        try:
            self.llm.collective_rpc("genlm_discard_captured", args=(tags,))
        except Exception:  # noqa: BLE001 - best effort after a failure
            pass

    def _clear_engine_cache(self) -> None:
        with self.batcher.model_lock:
            self.llm.reset_prefix_cache()

    # ------------------------------------------------------------------ shutdown
    def _close_engine(self) -> None:
        self.sample_batcher.close()
        watchdog = getattr(self, "_watchdog", None)
        if watchdog is not None:
            watchdog.stop()
        llm, self.llm = self.llm, None
        _LIVE_IN_PROCESS.discard(self)
        if self._engine_procs:  # what the processes still alive map now (e.g. grown queues)
            self._engine_segments |= _mapped(self._engine_procs)
        if llm is not None:
            # the in-process engines left use this process's parallel groups: keep them
            others = any(b.llm is not None for b in _LIVE_IN_PROCESS)
            with self.batcher.model_lock:
                _shutdown(llm, keep_distributed=others)
        if self._buffer is not None:
            self._buffer.close()
        self._remove_worker_segments()

    def _remove_worker_segments(self) -> None:
        """Unlink what the engine's processes on this machine left in ``/dev/shm`` (vLLM's
        message queues, the executor's lock, CPU-communicator segments: what a killed
        worker never removes; see :func:`genlm_vllm.transport.remove_engine_segments`).
        The executor's shutdown waits for them; survivors get a grace period, then a signal."""
        import socket

        from genlm_vllm.transport import remove_engine_segments

        host = socket.gethostname()
        idents = sorted(
            {w["dist_ident"] for w in self.workers if w.get("dist_ident") and w.get("host") == host}
        )
        if not idents and not self._engine_segments:
            return
        if _stop(self._engine_procs, grace=_core_shutdown_timeout()):
            note("vllm: the engine's processes outlived SIGKILL; their shared memory is left to them")
            return
        gc.collect()  # a collected message queue unlinks its own segment
        removed = remove_engine_segments(self._engine_segments, idents)
        if removed:
            note(f"vllm: removed {len(removed)} shared-memory segment(s) the engine's processes left")

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["sample_batcher"] = self.sample_batcher.stats.as_dict()
        out["engine"] = {
            "forward_calls": self._forward_calls,
            "tokens_computed": self._tokens_computed,
            "tokens_reused": self._tokens_reused,
            "prefix_caching": self.config.enable_prefix_caching,
        }
        return out
