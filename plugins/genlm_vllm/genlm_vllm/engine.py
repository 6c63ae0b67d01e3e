"""VLLMEngine: the vLLM V1 engine as a genlm-core engine (heavy imports here).

One batch of contexts = one ``LLM.generate`` call with ``max_tokens=1``: every
request carries a tag in ``SamplingParams.extra_args``, the engine's
:class:`~genlm_vllm.capture.CaptureLogitsProcessor` records the logits row of each
tagged request in the step that completes its prompt, and the rows are fetched by
tag (see :mod:`genlm_vllm.capture` for the row-to-request mapping). vLLM schedules
the batch as it likes (chunked prefill, preemption, prefix-cache hits); the result
is always in request order.

A burst (``decode_step``, ``end_burst``) keeps each row as a vLLM streaming-input
session that runs one token a step over its kept KV (:mod:`genlm_vllm.sessions`). So do
ordinary calls (the resident path, ``VLLMConfig.resident``, on by default): ``forward`` drives
``LLMEngine`` itself, every row a session kept after the call, and a later call whose
context extends a live row's by a token or a few continues that row and runs only its
new tokens (:class:`~genlm_vllm.sessions.ResidentSessions` over the core's
:class:`~genlm_core.engine.resident.ResidentRows`). Off, each call is one
``LLM.generate``.

Sampling uses vLLM's own sampler (seeded per request, stop on token ids:
:mod:`genlm_vllm.sampling`). LoRA adapters are the capability ``"lora"``
(:meth:`VLLMEngine.load_adapter`, :meth:`VLLMEngine.use_adapter`; ``enable_lora=True``):
every engine call passes the active adapter's ``LoRARequest``, and vLLM keys its prefix
cache by adapter, so a switch keeps it (``adapter_keyed_kv``). The backend holding the
engine runs every engine call - logprob batches, sampling batches, LoRA switches, cache
resets - under its one engine lock: the engine is not thread-safe.

Around an ``LLM`` started by hand with :func:`~genlm_vllm.launch.engine_kwargs` (it must
carry the capture processor and worker extension):
``BaseLogprobBackend(VLLMEngine(llm, config), config)``.

Beside it: :mod:`genlm_vllm.launch` (starting the engine: environment, ``vllm.LLM``
keyword arguments, spawn-safety checks) and :mod:`genlm_vllm.lifecycle` (the engine's
processes: watchdog, :class:`~genlm_vllm.lifecycle.EngineDiedError`, shared distributed
state, shutdown).
"""

from __future__ import annotations

import gc
import itertools
import time
from collections.abc import Collection, Mapping
from typing import Any

import torch

from genlm_core.engine import Checkpoint, Engine, EngineServices, SampleRequest, note, summarise_repeats
from genlm_core.engine.kv_reuse import ComputeCounters
from genlm_vllm import launch, lifecycle, sampling
from genlm_vllm.config import VLLMConfig
from genlm_vllm.lifecycle import EngineDiedError
from genlm_vllm.sessions import DecodeSessions, ResidentSessions, Turn, run_turns

__all__ = ["VLLMEngine"]


class VLLMEngine(Engine[VLLMConfig]):
    """A ``vllm.LLM`` engine (V1) with the genlm capture processor and worker extension."""

    config_class = VLLMConfig
    supports = frozenset({"sample", "decode", "lora"})
    #: named when a context is past the limit it sets below the model's window
    max_positions_option = "max_model_len"
    #: vLLM keys its prefix cache (and the sessions here) by adapter: a switch keeps them
    adapter_keyed_kv = True
    #: a burst's rows are decoded one token over the KV their session kept; the step loop's
    #: rows prefill the tail its prefix cache lacks: other kernels, bit-identical on the
    #: machines we measured, promised by nothing in vLLM
    decode_same_arithmetic = False

    def __init__(
        self,
        llm: Any,
        config: VLLMConfig | None = None,
        *,
        device: str | None = None,
    ) -> None:
        from genlm_vllm.capture import new_namespace

        config = config or VLLMConfig()
        self.llm = llm
        #: where vLLM runs: the placement's, or for an ``LLM`` started by hand vLLM's platform
        self.device = device or launch.engine_device()
        self.prefix_caching = config.enable_prefix_caching
        model_config = llm.llm_engine.model_config
        # the positions vLLM holds; the core's context limit is max_model_len - 1 (vLLM needs
        # a position for the one token it generates: prompt < max_model_len)
        self.max_positions = int(model_config.max_model_len)
        hf_config = getattr(model_config, "hf_config", None)
        self.model_config = hf_config.to_dict() if hf_config is not None else None
        self.dtype = launch.weight_dtype(llm)
        self.forward_in_thread = True
        self.in_process = lifecycle.engine_in_process(llm)
        if self.in_process:
            lifecycle.LIVE_IN_PROCESS.add(self)
        self.tokenizer = llm.get_tokenizer()
        self.closed = False
        #: this engine's prefix of capture tags and request ids (unique in the process):
        #: :meth:`new_tags`, and the ids of the sessions' requests (:mod:`genlm_vllm.sessions`)
        self.namespace = new_namespace()
        # rows from worker processes: see genlm_vllm.transport
        self.transport_counts = {"shm": 0, "bytes": 0}
        #: floats in a captured row (what the row buffer holds per row): the model's logits
        #: width, its padded vocabulary, which may exceed :attr:`vocab_size` (the core cuts
        #: the rows); updated to what the workers report
        self.captured_width = int(model_config.get_vocab_size())
        self._buffer: Any = None
        self._dead: str | None = None  # why the engine is unusable (a worker died)
        self.workers: list[dict[str, Any]] = []
        self._watchdog: lifecycle.Watchdog | None = None
        self._engine_procs: list[Any] = []  # its processes here (psutil: workers, a separate core)
        self._engine_segments: set[str] = set()  # what they map in /dev/shm
        if not self.in_process:
            from genlm_core.engine.row_transport import RowBuffer, shm_available, sweep_stale_buffers

            self.workers = [w for w in llm.collective_rpc("genlm_worker_info") if w]
            if llm.llm_engine.vllm_config.parallel_config.pipeline_parallel_size > 1:
                llm.collective_rpc("genlm_prepare_pipeline")  # see CaptureWorkerExtension
            if shm_available():
                sweep_stale_buffers()  # what backends killed without close() left here
                self._buffer = RowBuffer(self.namespace)
            self._watchdog = lifecycle.Watchdog(self)
            self._engine_procs = lifecycle.engine_processes(self.workers)
            # what the engine's processes map in /dev/shm (its message queues, the
            # executor's lock, the CPU communicator): removed at close() if left over
            self._engine_segments = lifecycle.mapped(self._engine_procs)
        self._counter = itertools.count()
        #: model calls, and the context tokens computed / resumed from kept KV (vLLM's prefix
        #: cache: ``RequestOutput.num_cached_tokens``; a session's kept KV), with the meaning
        #: of every engine's ``stats()["engine"]`` counters
        self.counters = ComputeCounters()
        self.lora_ids = itertools.count(1)
        #: the loaded adapters' ``LoRARequest`` by name (:meth:`load_adapter`)
        self.lora_requests: dict[str, Any] = {}
        #: the active ``LoRARequest`` every engine call passes (None: the base model)
        self.lora_request: Any = None
        #: a burst's rows as vLLM streaming-input sessions (:mod:`genlm_vllm.sessions`)
        self.sessions = DecodeSessions(self)
        #: ordinary calls' rows as sessions kept between calls (None: the resident path is off)
        self.resident: ResidentSessions | None = (
            ResidentSessions(self, config.resident_rows, config.resident_idle_s) if config.resident else None
        )
        _close_sessions_before_direct_calls(self)

    # ------------------------------------------------------------------ loading
    @classmethod
    def dtypes_on(cls, device: str) -> tuple[str, ...]:
        """The dtypes vLLM's platform computes in, where that platform is ``device``'s kind
        (a CPU build of vLLM on a GPU machine says so, with the fix)."""
        launch.require_vllm()
        launch.tolerate_llvmlite()
        launch.check_platform(device)
        return launch.supported_dtypes()

    @classmethod
    def load(cls, checkpoint: Checkpoint, config: VLLMConfig, services: EngineServices) -> "VLLMEngine":
        launch.require_vllm()
        launch.tolerate_llvmlite()
        note(f"vllm: importing vLLM to start an engine for {checkpoint.model}")
        device = str(services.device).split(":")[0]
        launch.prepare_environment(config, device)
        from vllm import LLM

        kwargs = launch.engine_kwargs(config, device, services.dtype, checkpoint=checkpoint)
        launch.check_spawn_safe(kwargs, device)
        launch.announce_start(kwargs, device)
        t0 = time.perf_counter()
        with (
            launch.engine_environment(kwargs, device),
            summarise_repeats("vllm"),  # e.g. one cast warning per weight
        ):
            try:
                llm = LLM(**kwargs)
            except ValueError as exc:  # the KV space below one context: this backend's options
                better = launch.kv_space_error(exc, config, kwargs, device)
                if better is None:
                    raise
                raise better from exc
        note(f"vllm: engine ready in {time.perf_counter() - t0:.0f} s")
        try:
            return cls(llm, config, device=device)
        except BaseException:
            lifecycle.shutdown(llm, keep_distributed=_others_open())
            raise

    # ------------------------------------------------------------------ logprobs
    def new_tags(self, n: int) -> list[str]:
        """``n`` fresh capture tags (``SamplingParams.extra_args``, :mod:`genlm_vllm.capture`):
        the rows of requests carrying them are fetched with :meth:`fetch`."""
        return [f"{self.namespace}:{next(self._counter)}" for _ in range(n)]

    def forward(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        """The rows of ``contexts``: on the resident path each continues the live row its
        context extends, or starts a session from its prompt (the prefix cache supplies
        its full blocks); else one ``LLM.generate``."""
        if self.resident is None:
            return self.capture(contexts, read_prefix_cache=True)
        self.check_healthy()
        try:
            return self.resident.forward(contexts, len(self.sessions.live))
        except BaseException as exc:
            self.check_healthy(exc)
            raise

    def forward_uncached(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        """The same engine step, reading no KV block from vLLM's prefix cache (on the
        resident path: requests that end with the call, the live sessions left waiting)."""
        if self.resident is None:
            return self.capture(contexts, read_prefix_cache=False)
        self.check_healthy()
        try:
            turns = [Turn(None, tuple(c), tuple(c), resumable=False) for c in contexts]
            return run_turns(self, turns, read_prefix_cache=False)[0]
        except BaseException as exc:
            self.check_healthy(exc)
            raise

    def close_sessions(self) -> None:
        """End every session (burst and resident): before ``LLM.generate``, which waits
        for every unfinished request, a cache reset or close."""
        self.sessions.close_all()
        if self.resident is not None:
            self.resident.close_all()

    def capture(self, contexts: list[tuple[int, ...]], read_prefix_cache: bool) -> torch.Tensor:
        """One ``LLM.generate`` over ``contexts``; the rows its capture processor recorded."""
        from vllm.inputs import TokensPrompt

        from genlm_vllm.capture import row_params

        tags = self.new_tags(len(contexts))
        params = [row_params(tag, read_prefix_cache) for tag in tags]
        prompts = [TokensPrompt(prompt_token_ids=list(c)) for c in contexts]
        self.check_healthy()
        self.close_sessions()  # LLM.generate waits for every request, sessions too
        try:
            results = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self.lora_request)
            out, missing = self.fetch(tags)
        except BaseException as exc:
            self.check_healthy(exc)
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
        self.counters.count(sum(len(c) for c in contexts) - reused, reused)

    def fetch(self, tags: list[str]) -> tuple[torch.Tensor, list[int]]:
        """The captured rows in request order, and the indices that have none."""
        if self.in_process:  # a plain call: the worker's own tensors, stacked (one copy)
            from genlm_core.engine.row_transport import stack_rows

            rows = self.llm.collective_rpc("genlm_pop_captured", args=(tags,))[0]
            missing = [i for i, r in enumerate(rows) if r is None]
            return (stack_rows(rows) if not missing else torch.empty(0)), missing
        buffer = self._buffer
        desc = None
        if buffer is not None:
            buffer.ensure(len(tags) * self.captured_width * 4)
            desc = buffer.describe()
        replies = self.llm.collective_rpc("genlm_pop_captured_rows", args=(tags, desc))
        reply = next((r for r in replies if r is not None), None)
        if reply is None or not reply["width"]:
            return torch.empty(0), list(range(len(tags)))
        width = self.captured_width = int(reply["width"])
        missing = [i for i, p in enumerate(reply["present"]) if not p]
        if missing:
            return torch.empty(0), missing
        if reply.get("shm"):
            self.transport_counts["shm"] += 1
            out = buffer.rows(len(tags), width)  # type: ignore[union-attr]
        else:
            self.transport_counts["bytes"] += 1
            out = torch.stack([torch.frombuffer(bytearray(b), dtype=torch.float32) for b in reply["bytes"]])
        return (out if self.device == "cpu" else out.to(self.device)), []

    def _discard(self, tags: list[str]) -> None:
        try:
            self.llm.collective_rpc("genlm_discard_captured", args=(tags,))
        except Exception:  # noqa: BLE001 - best effort after a failure
            pass

    # ------------------------------------------------------------------ bursts
    def decode_step(self, rows: Mapping[int, tuple[int, ...]], released: Collection[int]) -> torch.Tensor:
        """One step of a burst: each row (by handle) a vLLM streaming-input session that
        keeps its KV between steps and runs only the token drawn last
        (:mod:`genlm_vllm.sessions`)."""
        self.check_healthy()
        try:
            if self.resident is not None:
                self.resident.make_room(len(rows))  # request slots for the burst's sessions
            return self.sessions.take_turn(rows, released)
        except BaseException as exc:
            self.check_healthy(exc)
            raise

    def end_burst(self, released: Collection[int]) -> None:
        """The burst ended: its rows' sessions end."""
        self.check_healthy()
        try:
            self.sessions.end_burst(released)
        except BaseException as exc:
            self.check_healthy(exc)
            raise

    # ------------------------------------------------------------------ sampling
    def sample(self, requests: list[SampleRequest]) -> list[list[int]]:
        """vLLM's sampler: one ``LLM.generate`` for the batch (:func:`genlm_vllm.sampling.sample`)."""
        self.check_healthy()
        self.close_sessions()
        try:
            return sampling.sample(self.llm, self.device, requests, self.lora_request)
        except BaseException as exc:
            self.check_healthy(exc)
            raise

    # ------------------------------------------------------------------ LoRA ("lora")
    def lora_enabled(self) -> bool:
        """Whether the engine was started with ``enable_lora=True``."""
        return bool(self.llm.llm_engine.vllm_config.lora_config)

    def load_adapter(self, name: str, folder: str) -> None:
        """Register the adapter ``folder`` under ``name`` (a fresh adapter id; vLLM loads it
        on the first call using it); the active adapter does not change."""
        if not self.lora_enabled():
            raise ValueError("LoRA is disabled: build the backend with enable_lora=True")
        self.lora_requests[name] = self.new_lora_request(name, folder)

    def use_adapter(self, name: str | None) -> None:
        """Pass the adapter ``name``'s ``LoRARequest`` with every later call (None: the base
        model). vLLM keys its prefix cache by adapter, and a session continues a row only
        under the adapter it was started with: nothing is dropped."""
        self.lora_request = None if name is None else self.lora_requests[name]

    def new_lora_request(self, name: str, folder: str) -> Any:
        """A ``LoRARequest`` for the adapter ``folder`` (a fresh adapter id)."""
        from vllm.lora.request import LoRARequest

        return LoRARequest(name, next(self.lora_ids), folder)

    # ------------------------------------------------------------------ health
    @property
    def healthy(self) -> bool:
        """False once closed or once a worker process of the engine has died."""
        return not self.closed and self._dead is None and self.llm is not None

    def mark_dead(self, reason: str) -> None:
        if self._dead is None:
            self._dead = reason
            note(f"vllm: {reason}; the engine cannot answer any more (close() and load again)")

    def check_healthy(self, cause: BaseException | None = None) -> None:
        """Raise a clear error when the engine lost a worker (``cause``: what vLLM raised)."""
        if self._dead is None and cause is not None and lifecycle.engine_failed(self.llm):
            self.mark_dead(f"the vLLM engine failed ({type(cause).__name__}: {cause})")
        if self._dead is not None:
            raise EngineDiedError(
                f"vllm: {self._dead}; this backend cannot answer any more: close() it and load a new one"
            ) from cause

    def info(self) -> dict[str, Any]:
        """The parallel layout, the workers and the row transport."""
        parallel = self.llm.llm_engine.vllm_config.parallel_config if self.llm is not None else None
        out: dict[str, Any] = {
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

    def stats(self) -> dict[str, Any]:
        return {
            **self.counters.stats(),
            "prefix_caching": self.prefix_caching,
            **self.sessions.stats(),
            "resident": self.resident is not None,
            **(self.resident.stats() if self.resident is not None else {}),
        }

    def clear_cache(self) -> None:
        self.close_sessions()  # their blocks would keep the prefix cache from resetting
        self.llm.reset_prefix_cache()

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.llm is not None and self._dead is None:
            self.close_sessions()
        if self._watchdog is not None:
            self._watchdog.stop()
        llm, self.llm = self.llm, None
        lifecycle.LIVE_IN_PROCESS.discard(self)
        if self._engine_procs:  # what the processes still alive map now (e.g. grown queues)
            self._engine_segments |= lifecycle.mapped(self._engine_procs)
        if llm is not None:
            # the in-process engines left use this process's parallel groups: keep them
            lifecycle.shutdown(llm, keep_distributed=_others_open())
        if self._buffer is not None:
            self._buffer.close()
        self._remove_worker_segments()

    def _remove_worker_segments(self) -> None:
        """Unlink what the engine's processes on this machine left in ``/dev/shm`` (vLLM's
        message queues, the executor's lock, CPU-communicator segments: what a killed
        worker never removes; see :func:`genlm_vllm.transport.remove_engine_segments`), once
        they are gone: the executor's shutdown waits for them (or kills them), from a thread
        of its own when it saw a worker die."""
        import socket

        from genlm_vllm.transport import remove_engine_segments

        host = socket.gethostname()
        idents = sorted(
            {w["dist_ident"] for w in self.workers if w.get("dist_ident") and w.get("host") == host}
        )
        if not idents and not self._engine_segments:
            return
        if lifecycle.alive(self._engine_procs, within=lifecycle.core_shutdown_timeout()):
            note("vllm: the engine's processes are still running; their shared memory is left to them")
            return
        gc.collect()  # a collected message queue unlinks its own segment
        removed = remove_engine_segments(self._engine_segments, idents)
        if removed:
            note(f"vllm: removed {len(removed)} shared-memory segment(s) the engine's processes left")


def _close_sessions_before_direct_calls(engine: VLLMEngine) -> None:
    """Code holding the ``vllm.LLM`` itself (``llm.llm.generate(...)``, test oracles, a
    user's own calls) would wait forever on the live sessions (``LLM.generate`` runs the
    engine until no request is unfinished), and ``reset_prefix_cache`` cannot drop the
    blocks they hold: this instance's ``_run_engine`` (what every offline entry point of
    ``LLM`` runs) and ``reset_prefix_cache`` end the sessions first. A weak reference: the
    ``LLM`` does not keep its engine alive."""
    import weakref

    ref = weakref.ref(engine)
    llm = engine.llm
    # ``LLM._run_engine`` is vLLM's own (0.32): no public hook runs before every offline
    # entry point of ``LLM``, and ``generate``, ``encode``, ``beam_search``... all reach it
    for name in ("_run_engine", "reset_prefix_cache"):
        original = getattr(llm, name, None)
        if original is None:
            continue

        def guarded(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            owner = ref()
            if owner is not None and owner.healthy:
                owner.close_sessions()
            return _original(*args, **kwargs)

        try:
            setattr(llm, name, guarded)
        except (AttributeError, TypeError):  # an LLM that takes no instance attributes
            pass


def _others_open() -> bool:
    """Whether another in-process engine of this process is still open."""
    return any(e.llm is not None for e in lifecycle.LIVE_IN_PROCESS)
