"""RemoteEngine: a ``genlm serve`` server's backend as a genlm-core engine.

The engine is a client: the backend's own AutoBatcher gathers
this process's concurrent requests into one HTTP request, its output cache answers
repeated contexts locally, and ``forward`` is the round trip. The server then batches
the requests of every client together. The rows are the served backend's bytes
(float32, already normalised: ``returns = "logprobs"``), so they are returned as they
arrive: equal bit for bit to what the served backend returns in its own process. The
served backend's facts (EOS ids, context limit, dtype) are the engine's: the model runs
on the server, placed there (the core's placement of a served model says None; a
``model=`` or ``dtype=`` given must be the server's, checked at load).

Transport (``transport`` option, see :class:`~genlm_remote.config.RemoteConfig`): rows
through a shared-memory segment the server created and handed to this client over its
Unix socket (:mod:`genlm_core.serve.shm`) when the server is on this host, else float32
rows in the reply frame (:mod:`genlm_core.serve.frame`). Where no segment can be had
(another host or container, a server without the socket) the server answers with the
frame, so a wrong guess costs nothing but the attempt. Behind several replicas (Ray
Serve) the client gets a segment from each replica that answers it.

Every round trip is timed at its boundaries on both sides
(:func:`genlm_core.serve.phases.round_trip_phases`): ``stats()["transport"]["timing"]``.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from typing import Any

import torch

from genlm_core.engine import Checkpoint, Engine, EngineServices, SampleRequest, Token, UnsupportedDtypeError
from genlm_core.serve import frame, shm
from genlm_core.serve.limits import is_loopback
from genlm_core.serve.phases import ROUND_TRIP, round_trip_phases
from genlm_remote.config import RemoteConfig
from genlm_remote.connection import Connection
from genlm_remote.tokenizer import RemoteTokenizer

__all__ = ["RemoteEngine"]


class RemoteEngine(Engine[RemoteConfig]):
    """A ``genlm serve`` server's backend, through HTTP (and ``/dev/shm`` on this host)."""

    config_class = RemoteConfig
    supports = frozenset({"sample"})
    returns = "logprobs"
    forward_in_thread = True  # a network wait: keep the event loop running

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
        _check_served(config, info)
        byte_vocab, str_vocab = frame.vocab_from_frame(self.conn.request("GET", "/v1/vocab"))
        if len(byte_vocab) != info["vocab_size"]:
            raise RuntimeError(
                f"the server sent {len(byte_vocab)} tokens, its info says {info['vocab_size']}"
            )
        self.tokenizer = RemoteTokenizer(self.conn, info["tokenizer"], str_vocab)
        self.byte_vocab = [Token(i, b) for i, b in enumerate(byte_vocab)]
        self.str_vocab = str_vocab
        self.vocab_size = len(byte_vocab)
        self.eos_token_ids = info["eos_token_ids"]
        limit = info.get("max_context_length")  # a limit of L tokens: L + 1 positions
        self.max_positions = None if limit is None else int(limit) + 1
        self.dtype = str(info["dtype"])  # the server's placement
        self.closed = False
        self._max_batch = int(info["limits"]["max_batch"])
        self._rows_per_trip = min(self._max_batch, config.batch_size)  # the most rows one round trip carries
        self.transport = self._pick_transport(config)
        self.transport_counts = {"shm": 0, "frame": 0}
        self.replica_counts: Counter[str] = Counter()  # which server process answered
        self._segments: dict[str, shm.ClientSegment] = {}  # server socket -> its segment for us
        self._segment_lock = threading.Lock()  # a segment holds one request's rows at a time
        self.shm_problem: str | None = None  # why the last segment could not be had
        self.round_trips = 0
        self.timing = dict.fromkeys(ROUND_TRIP, 0.0)
        if self.transport == "shm":
            self._get_segment(info.get("shm_socket"), info.get("pid"))

    @classmethod
    def load(cls, checkpoint: Checkpoint, config: RemoteConfig, services: EngineServices) -> "RemoteEngine":
        return cls(config)

    def _pick_transport(self, config: RemoteConfig) -> str:
        wanted = "shm" if self.conn.shm_forced else config.transport
        if wanted == "frame" or not shm.available():
            return "frame"
        if wanted == "shm":
            return "shm"
        same_host = is_loopback(self.conn.host) or self.server_info.get("host") == socket.gethostname()
        return "shm" if same_host else "frame"

    # ------------------------------------------------------------------ properties
    @property
    def healthy(self) -> bool:
        if self.closed:
            return False
        try:
            return bool(self.conn.get_json("/v1/health").get("healthy"))
        except (OSError, RuntimeError, ValueError):
            return False

    # ------------------------------------------------------------------ rows
    def _get_segment(self, address: Any, pid: Any) -> None:
        """Ask the server process at ``address`` for a segment (at most one per server
        process, at most ``frame.MAX_HANDLES``); where none can be had, rows keep coming in
        frames and :attr:`shm_problem` says why."""
        if not isinstance(address, str) or address in self._segments:
            return
        if len(self._segments) >= frame.MAX_HANDLES:
            return
        try:
            self._segments[address] = shm.ClientSegment.request(
                address,
                self._rows_per_trip,
                self.vocab_size,
                self.conn.token,
                int(pid) if isinstance(pid, (int, str)) and str(pid).isdigit() else None,
                timeout=self.conn.connect_timeout_s,
            )
        except (OSError, ValueError, KeyError) as exc:
            self.shm_problem = f"{type(exc).__name__}: {exc}"

    def _drop_segments(self) -> None:
        segments, self._segments = list(self._segments.values()), {}
        for seg in segments:
            seg.close()

    def _round_trip(self, contexts: list[tuple[int, ...]], uncached: bool) -> torch.Tensor:
        if self.transport != "shm":
            return self._exchange(contexts, uncached, [])
        with self._segment_lock:
            try:
                return self._exchange(contexts, uncached, [s.handle for s in self._segments.values()])
            except (OSError, TimeoutError):
                # the server may still write this request's rows later: never reuse its segments
                self._drop_segments()
                raise

    def _exchange(self, contexts: list[tuple[int, ...]], uncached: bool, handles: list[str]) -> torch.Tensor:
        start = time.monotonic()
        body = frame.encode_contexts(contexts, uncached=uncached, shm=handles)
        sent = time.monotonic()
        data = self.conn.request("POST", "/v1/logprobs", body, frame.MEDIA_TYPE)
        received = time.monotonic()
        reply = frame.decode_rows(data, max_width=self.vocab_size)
        rows = self._check(reply, contexts)
        for phase, seconds in round_trip_phases(
            start, sent, received, time.monotonic(), reply.stamps
        ).items():
            self.timing[phase] += seconds
        self.round_trips += 1
        if self.transport == "shm" and reply.transport == "frame" and reply.shm_socket:
            pid = (reply.replica or "").rpartition(":")[2]
            self._get_segment(reply.shm_socket, pid)  # a replica not met before: its own segment
        return rows

    def _check(self, reply: frame.RowsReply, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        if reply.n != len(contexts) or reply.width != self.vocab_size:
            raise RuntimeError(
                f"the server answered {reply.n} rows of {reply.width}, asked {len(contexts)} of {self.vocab_size}"
            )
        self.transport_counts[reply.transport] += 1
        self.replica_counts[reply.replica or "?"] += 1
        if reply.transport == "shm":
            seg = next((s for s in self._segments.values() if s.handle == reply.segment), None)
            if seg is None:
                raise RuntimeError("the server wrote rows into a segment this client does not hold")
            return torch.from_numpy(seg.read(reply.n))
        assert reply.rows is not None
        return torch.from_numpy(reply.rows)

    def _rows(self, contexts: list[tuple[int, ...]], uncached: bool = False) -> torch.Tensor:
        if not contexts:
            return torch.empty((0, self.vocab_size), dtype=torch.float32)
        step = self._max_batch
        parts = [self._round_trip(contexts[i : i + step], uncached) for i in range(0, len(contexts), step)]
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    def forward(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        return self._rows(contexts)

    def forward_uncached(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        return self._rows(contexts, uncached=True)

    # ------------------------------------------------------------------ sampling
    def sample(self, requests: list[SampleRequest]) -> list[list[int]]:
        """The served backend's own ``sample`` (its sampler, its seeds), on the server. Runs
        of requests that its ``batch_sample`` answers alike (the same arguments, seeds
        ``s, s + 1, ...`` or none) go in one request."""
        out: list[list[int]] = []
        start = 0
        while start < len(requests):
            first, end = requests[start], start + 1
            while (
                end < len(requests)
                and end - start < self._max_batch
                and _continues(first, requests[end], end - start)
            ):
                end += 1
            payload = {
                "prompts": [list(r.prompt) for r in requests[start:end]],
                "max_tokens": first.max_tokens,
                "eos_token_ids": sorted(first.eos),
                "temperature": first.temperature,
                "seed": first.seed,
                "batch": True,
            }
            out += [[int(t) for t in s] for s in self.conn.post_json("/v1/sample", payload)["samples"]]
            start = end
        return out

    # ------------------------------------------------------------------ state
    def clear_server_cache(self) -> None:
        """Drop the *server's* output and KV caches (every client's). ``clear_cache()``
        clears only this client's own output cache: another program's work is not ours to
        throw away."""
        self.conn.post_json("/v1/clear_cache", {})

    def reset_timing(self) -> None:
        """Start the round trips' timing (``stats()["transport"]["timing"]``) afresh."""
        self.round_trips = 0
        self.timing = dict.fromkeys(ROUND_TRIP, 0.0)

    def server_stats(self) -> dict[str, Any]:
        """The server's /v1/stats (queue depth, batch sizes, cache hit rates)."""
        return self.conn.get_json("/v1/stats")

    def stats_sections(self) -> dict[str, Any]:
        return {"transport": self.transport_stats()}

    def transport_stats(self) -> dict[str, Any]:
        return {
            "kind": self.transport,
            "replies": dict(self.transport_counts),
            "replicas": dict(self.replica_counts),
            "bytes_sent": self.conn.bytes_sent,
            "bytes_received": self.conn.bytes_received,
            "segments": len(self._segments),
            "timing": {"round_trips": self.round_trips, "seconds": dict(self.timing)},
        }

    def info(self) -> dict[str, Any]:
        return {
            "url": self.conn.url,
            "transport": self.transport,
            "shm_segments": len(self._segments),
            "shm_problem": self.shm_problem,
            "server": {k: self.server_info.get(k) for k in ("backend", "model", "dtype", "host", "pid")},
        }

    def close(self) -> None:
        self.closed = True
        with self._segment_lock:
            self._drop_segments()
        self.conn.close()


def _continues(first: SampleRequest, other: SampleRequest, i: int) -> bool:
    """Whether ``other`` is what the server's ``batch_sample`` draws as prompt ``i`` of
    a batch that starts with ``first``."""
    same = (other.max_tokens, other.eos, other.temperature) == (
        first.max_tokens,
        first.eos,
        first.temperature,
    )
    seeds = other.seed is None if first.seed is None else other.seed == first.seed + i
    return same and seeds


def _check_served(config: RemoteConfig, info: dict[str, Any]) -> None:
    """Refuse a ``model=`` or ``dtype=`` other than what the server runs (they were decided
    where the model runs: leave them out, or point at a server running them)."""
    served = info.get("model")
    if served is not None and config.model is not None and str(config.model) != str(served):
        raise ValueError(
            f"remote: model={config.model!r}, but the server at {config.url} serves {served!r}: leave "
            "model out (the server decides it) or point url at a server serving that model"
        )
    asked = config.requested_dtype()
    if asked != "auto" and asked != str(info["dtype"]):
        raise UnsupportedDtypeError("remote", asked, "server", f"the server computes in {info['dtype']}")
