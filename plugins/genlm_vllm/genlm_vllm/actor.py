"""The vLLM backend as a remote service: a plain class to run inside a Ray actor.

Imports neither Ray nor vLLM: wrap it where Ray is used::

    import ray
    from genlm_vllm.actor import VLLMActor

    ray.init(address="auto")
    Remote = ray.remote(VLLMActor).options(num_cpus=1, max_concurrency=4)
    actor = Remote.remote(model="HuggingFaceTB/SmolLM2-135M", dtype="float32",
                          engine_opts={"tensor_parallel_size": 2,
                                       "distributed_executor_backend": "mp"})
    rows = ray.get(actor.batch_next_token_logprobs.remote([ids1, ids2]))  # (2, V) on the CPU

The actor process holds the engine core and the backend; the engine's workers are
processes of their own on the actor's node (the ``mp`` executor), so the rows reach the
actor through that node's ``/dev/shm`` (:mod:`genlm_vllm.transport`) and the driver
through Ray's object store (``batch * vocab * 4`` bytes per call). Keyword arguments are
those of ``genlm_core.load("vllm", ...)``.

Being a module-level class of an installed package, it is pickled by reference: every
node that runs the actor imports it from its own ``genlm_vllm`` (a class defined in a
script or a test module would have to travel by value). Calls are synchronous and
thread-safe (the backend serialises engine calls), so the actor may be threaded
(``max_concurrency`` > 1): :meth:`info`, :meth:`healthy` and :meth:`in_flight` then
answer while a batch runs. When a worker of the engine dies, the running and later
calls raise :class:`~genlm_vllm.lifecycle.EngineDiedError` (Ray wraps it in a
``RayTaskError`` whose ``cause`` it is) and :meth:`healthy` turns False: close the actor
and start a new one. :meth:`close` (and Ray's graceful actor exit, ``__ray_shutdown__``)
shuts the engine down and removes its shared-memory buffer.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["VLLMActor"]


class VLLMActor:
    """A genlm ``vllm`` backend owned by one (actor) process; see the module docstring."""

    def __init__(self, **config: Any) -> None:
        import genlm_core

        self.backend = genlm_core.load("vllm", **config)
        self._lock = threading.Lock()
        self._in_flight = 0

    @contextlib.contextmanager
    def _call(self) -> Iterator[None]:
        with self._lock:
            self._in_flight += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1

    # ------------------------------------------------------------------ the backend's API
    def batch_next_token_logprobs(self, contexts: Sequence[Sequence[int]]) -> Any:
        """Normalised float32 rows ``(len(contexts), vocab)``, on the CPU (they travel)."""
        with self._call():
            return self.backend.batch_next_token_logprobs_sync([list(c) for c in contexts]).cpu()

    def next_token_logprobs(self, token_ids: Sequence[int]) -> Any:
        with self._call():
            return self.backend.next_token_logprobs_sync(list(token_ids)).cpu()

    def sample(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[int]:
        request = self.backend.sample_request(prompt_token_ids, max_tokens, eos_token_ids, temperature, seed)
        with self._call():
            return self.backend.run_sample_sync(request)

    def batch_sample(
        self,
        prompt_token_ids_list: Sequence[Sequence[int]],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[list[int]]:
        """One engine call for every prompt; prompt ``i`` uses ``seed + i``."""
        with self._call():
            return asyncio.run(
                self.backend.batch_sample(prompt_token_ids_list, max_tokens, eos_token_ids, temperature, seed)
            )

    def vocab_size(self) -> int:
        return self.backend.vocab_size

    def eos_token_ids(self) -> list[int]:
        return sorted(self.backend.eos_token_ids)

    def clear_cache(self) -> None:
        self.backend.clear_cache()

    # ------------------------------------------------------------------ health and layout
    def info(self) -> dict[str, Any]:
        """``backend.info()`` plus where the actor runs (``actor_pid``, ``actor_host``)."""
        out = self.backend.info()
        out.update(actor_pid=os.getpid(), actor_host=socket.gethostname())
        return out

    def healthy(self) -> bool:
        return self.backend.healthy

    def in_flight(self) -> int:
        """Model calls running (or waiting for the engine) now."""
        return self._in_flight

    def close(self) -> None:
        """Shut the engine down (its workers exit, the shared-memory buffer is unlinked)."""
        self.backend.close()

    def __ray_shutdown__(self) -> None:
        """Ray calls it when the actor exits gracefully (its handles are gone,
        ``__ray_terminate__``); ``ray.kill`` skips it: call :meth:`close` first."""
        self.close()
