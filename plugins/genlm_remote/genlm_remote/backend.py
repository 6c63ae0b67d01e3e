"""RemoteBackend: a LogprobBackend whose rows come from a ``genlm serve`` server.

It is a :class:`~genlm_core.engine.backend.BaseLogprobBackend` like every engine: the client's
own AutoBatcher gathers this process's concurrent requests into one HTTP request, its
output cache answers repeated contexts locally, and ``_forward`` is the round trip.
The server then batches the requests of every client together. The rows are the
served backend's bytes (float32, already normalised), so they are returned as they
arrive: equal bit for bit to what the served backend returns in its own process.

Transport (``transport`` option, see :class:`~genlm_remote.config.RemoteConfig`): rows
through a ``/dev/shm`` buffer this client owns (:mod:`genlm_core.engine.row_transport`) when
the server is on this host, else float32 rows in the reply frame
(:mod:`genlm_core.serve.frame`). A server that cannot open the buffer answers with the
frame, so a wrong guess costs nothing but the attempt.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from genlm_core.engine import BaseLogprobBackend, Token, compact
from genlm_core.serve import frame
from genlm_core.serve.limits import is_loopback
from genlm_remote.config import RemoteConfig
from genlm_remote.connection import Connection
from genlm_remote.tokenizer import RemoteTokenizer

__all__ = ["RemoteBackend"]

_BUFFERS = itertools.count()


class RemoteBackend(BaseLogprobBackend):
    config_class = RemoteConfig
    backend_name = "remote"

    def __init__(self, config: RemoteConfig) -> None:
        self.conn = Connection(config.url, config.token, config.request_timeout_s, config.connect_timeout_s)
        info = self.conn.get_json("/v1/info")
        if info.get("protocol") != 1 or frame.VERSION not in info.get("frame_versions", []):
            raise RuntimeError(
                f"genlm serve at {config.url} speaks protocol {info.get('protocol')} / frames "
                f"{info.get('frame_versions')}; this client speaks protocol 1 / frame {frame.VERSION}: "
                "install matching versions of genlm-core on both sides"
            )
        self.server_info = info
        if config.model is not None and str(config.model) != info.get("model"):
            raise ValueError(
                f"model={config.model!r} but the server at {config.url} serves {info.get('model')!r}: "
                "leave model out (the server decides it) or connect to the right server"
            )
        if config.dtype not in ("auto", info["dtype"]):
            raise ValueError(
                f"dtype={config.dtype!r} but the server at {config.url} computes in {info['dtype']}: "
                "leave dtype out, or start the server with --opt dtype=..."
            )
        byte_vocab, str_vocab = frame.decode_vocab(self.conn.request("GET", "/v1/vocab"))
        if len(byte_vocab) != info["vocab_size"]:
            raise RuntimeError(
                f"the server sent {len(byte_vocab)} tokens, its info says {info['vocab_size']}"
            )
        tokenizer = RemoteTokenizer(self.conn, info["tokenizer"], str_vocab)
        super().__init__(
            tokenizer,
            config,
            byte_vocab=[Token(i, b) for i, b in enumerate(byte_vocab)],
            str_vocab=str_vocab,
            eos_token_ids=info["eos_token_ids"],
        )
        self._max_batch = int(info["limits"]["max_batch"])
        self.transport = self._pick_transport(config)
        self.transport_counts = {"shm": 0, "frame": 0}
        self.replica_counts: Counter[str] = Counter()  # which server process answered
        self._buffer: Any = None
        self._buffer_lock = threading.Lock()
        if self.transport == "shm":
            from genlm_core.engine.row_transport import sweep_stale_buffers

            sweep_stale_buffers()  # buffers of clients that died without close()

    @classmethod
    def from_config(cls, config: RemoteConfig) -> "RemoteBackend":
        return cls(config)

    def _pick_transport(self, config: RemoteConfig) -> str:
        from genlm_core.engine.row_transport import shm_available

        wanted = "shm" if self.conn.shm_forced else config.transport
        if wanted == "frame" or not shm_available():
            return "frame"
        if wanted == "shm":
            return "shm"
        same_host = is_loopback(self.conn.host) or self.server_info.get("host") == socket.gethostname()
        return "shm" if same_host else "frame"

    # ------------------------------------------------------------------ properties
    @property
    def max_context_length(self) -> int | None:
        return self.server_info.get("max_context_length")

    @property
    def dtype(self) -> str:
        return str(self.server_info["dtype"])

    @property
    def healthy(self) -> bool:
        if self._closed:
            return False
        try:
            return bool(self.conn.get_json("/v1/health").get("healthy"))
        except (OSError, RuntimeError, ValueError):
            return False

    # ------------------------------------------------------------------ rows
    def _new_buffer(self) -> Any:
        from genlm_core.engine.row_transport import RowBuffer

        return RowBuffer(f"{id(self):x}-{next(_BUFFERS)}", owner="remote")

    def _round_trip(self, contexts: list[tuple[int, ...]], uncached: bool) -> torch.Tensor:
        width = self.vocab_size
        if self.transport != "shm":
            reply = frame.decode_rows(
                self.conn.request(
                    "POST",
                    "/v1/logprobs",
                    frame.encode_contexts(contexts, uncached=uncached),
                    frame.MEDIA_TYPE,
                ),
                max_width=width,
            )
            return self._check(reply, contexts, None)
        with self._buffer_lock:
            if self._buffer is None:
                self._buffer = self._new_buffer()
            buf = self._buffer
            buf.ensure(len(contexts) * width * 4)
            body = frame.encode_contexts(contexts, uncached=uncached, shm=buf.describe())
            try:
                data = self.conn.request("POST", "/v1/logprobs", body, frame.MEDIA_TYPE)
            except (OSError, TimeoutError):
                # the server may still write this request's rows later: never reuse the buffer
                buf.close()
                self._buffer = None
                raise
            return self._check(frame.decode_rows(data, max_width=width), contexts, buf)

    def _check(self, reply: frame.RowsReply, contexts: list[tuple[int, ...]], buf: Any) -> torch.Tensor:
        if reply.n != len(contexts) or reply.width != self.vocab_size:
            raise RuntimeError(
                f"the server answered {reply.n} rows of {reply.width}, asked {len(contexts)} of {self.vocab_size}"
            )
        self.transport_counts[reply.transport] += 1
        self.replica_counts[reply.replica or "?"] += 1
        if reply.transport == "shm":
            if buf is None:
                raise RuntimeError("the server wrote rows into shared memory this client did not offer")
            return buf.rows(reply.n, reply.width)
        assert reply.rows is not None
        return torch.from_numpy(reply.rows)

    def _rows(self, contexts: list[tuple[int, ...]], uncached: bool = False) -> torch.Tensor:
        if not contexts:
            return torch.empty((0, self.vocab_size), dtype=torch.float32)
        step = self._max_batch
        parts = [self._round_trip(contexts[i : i + step], uncached) for i in range(0, len(contexts), step)]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def _forward(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        return self._rows(contexts)

    def _forward_uncached(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        return self._rows(contexts, uncached=True)

    def _finalize(self, out: Any) -> torch.Tensor:
        # the server's rows are already the backend's normalised float32 rows: a second
        # log_softmax would move their last bits
        return out

    def _forward_rows(self, contexts: list[tuple[int, ...]]) -> list[torch.Tensor]:
        rows = self._rows(contexts)
        return [compact(r) for r in rows.unbind(0)]

    def _forward_in_thread(self) -> bool:
        return True  # a network wait: keep the event loop running

    # ------------------------------------------------------------------ sampling
    async def sample(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[int]:
        """The served backend's own ``sample`` (its sampler, its seeds), on the server."""
        prompt = list(self.validate(prompt_token_ids))
        self._check_sample_args(max_tokens, temperature, eos_token_ids)
        return (await self._sample([prompt], max_tokens, eos_token_ids, temperature, seed, batch=False))[0]

    async def batch_sample(
        self,
        prompt_token_ids_list: Sequence[Sequence[int]],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[list[int]]:
        prompts = [list(self.validate(p)) for p in prompt_token_ids_list]
        self._check_sample_args(max_tokens, temperature, eos_token_ids)
        return await self._sample(prompts, max_tokens, eos_token_ids, temperature, seed, batch=True)

    async def _sample(
        self,
        prompts: list[list[int]],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None,
        temperature: float,
        seed: int | None,
        batch: bool,
    ) -> list[list[int]]:
        payload = {
            "prompts": prompts,
            "max_tokens": max_tokens,
            "eos_token_ids": None if eos_token_ids is None else [int(e) for e in eos_token_ids],
            "temperature": float(temperature),
            "seed": None if seed is None else int(seed),
            "batch": batch,
        }
        reply = await asyncio.to_thread(self.conn.post_json, "/v1/sample", payload)
        return [list(s) for s in reply["samples"]]

    # ------------------------------------------------------------------ state
    def clear_server_cache(self) -> None:
        """Drop the *server's* output and KV caches (every client's). ``clear_cache()``
        clears only this client's own output cache: another program's work is not ours to
        throw away."""
        self.conn.post_json("/v1/clear_cache", {})

    def server_stats(self) -> dict[str, Any]:
        """The server's /v1/stats (queue depth, batch sizes, cache hit rates)."""
        return self.conn.get_json("/v1/stats")

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["transport"] = {
            "kind": self.transport,
            "replies": dict(self.transport_counts),
            "replicas": dict(self.replica_counts),
            "bytes_sent": self.conn.bytes_sent,
            "bytes_received": self.conn.bytes_received,
        }
        return out

    def info(self) -> dict[str, Any]:
        out = super().info()
        out.update(
            url=self.conn.url,
            transport=self.transport,
            server={k: self.server_info.get(k) for k in ("backend", "model", "dtype", "host", "pid")},
        )
        return out

    def _close_engine(self) -> None:
        with self._buffer_lock:
            if self._buffer is not None:
                self._buffer.close()
                self._buffer = None
        self.conn.close()

    def __del__(self) -> None:  # best effort: a client dropped without close() unlinks its buffer
        buf = getattr(self, "_buffer", None)
        if buf is not None:
            try:
                buf.close()
            except Exception:  # noqa: BLE001
                pass
