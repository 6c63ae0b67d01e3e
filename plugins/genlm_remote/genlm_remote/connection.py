"""A small blocking HTTP client for ``genlm serve`` (the standard library's http.client).

One keep-alive connection per thread. A request on a connection the server closed
meanwhile (idle timeout, a restarted server) is sent once more on a fresh one: every
request of this protocol is idempotent (logprobs are a pure function of the context;
a seeded sample is one too). Server errors become Python errors for that call only:
400/413 -> ``ValueError``, 401 -> ``PermissionError``, 503 -> :class:`ServerBusy`,
others -> :class:`RemoteError`; no reply within ``request_timeout_s`` ->
``TimeoutError``; no server -> ``ConnectionError``. Nothing here ever waits forever.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import urllib.parse
import uuid
from typing import Any

__all__ = ["Connection", "RemoteError", "ServerBusy", "parse_url"]


class RemoteError(RuntimeError):
    """The server failed a request (its message is kept)."""


class ServerBusy(RemoteError):
    """The server refused the request for now (at its concurrency limit, or shutting down)."""


def parse_url(url: str) -> tuple[str, str, int, bool]:
    """``(scheme, host, port, shm_forced)`` of ``http://HOST:PORT`` or ``shm+http://HOST:PORT``."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme
    shm = scheme.startswith("shm+")
    scheme = scheme.removeprefix("shm+")
    if scheme != "http" or not parts.hostname:
        raise ValueError(
            f"url={url!r}: expected http://HOST:PORT or shm+http://HOST:PORT "
            "(the address `genlm serve` printed when it was ready)"
        )
    if parts.path not in ("", "/"):
        raise ValueError(f"url={url!r}: give the server's root (http://HOST:PORT), not a path")
    return scheme, parts.hostname, parts.port or 80, shm


_RETRYABLE = (
    http.client.RemoteDisconnected,
    ConnectionResetError,
    BrokenPipeError,
    http.client.BadStatusLine,
)


class Connection:
    def __init__(
        self, url: str, token: str | None, request_timeout_s: float, connect_timeout_s: float
    ) -> None:
        self.url = url
        _, self.host, self.port, self.shm_forced = parse_url(url)
        self.token = token
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._local = threading.local()
        self._all: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self.bytes_received = 0
        self.bytes_sent = 0
        #: sent with every request: the server gathers the requests of its active clients
        #: into one batch (genlm_core.serve.gather)
        self.client_id = uuid.uuid4().hex

    def _conn(self, fresh: bool = False) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is not None and not fresh:
            return conn
        if conn is not None:
            conn.close()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.connect_timeout_s)
        try:
            conn.connect()
        except OSError as exc:
            raise ConnectionError(
                f"cannot reach genlm serve at {self.url}: {exc} (is `genlm serve` running there?)"
            ) from None
        conn.sock.settimeout(self.request_timeout_s)
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._local.conn = conn
        with self._lock:
            self._all.append(conn)
        return conn

    def drop(self) -> None:
        """Forget this thread's connection (after an error left it in an unknown state)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def request(self, method: str, path: str, body: bytes | None = None, content_type: str = "") -> bytes:
        headers = {"X-Genlm-Client": self.client_id}
        if content_type:
            headers["Content-Type"] = content_type
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        for attempt in (0, 1):
            conn = self._conn(fresh=attempt > 0)
            try:
                conn.request(method, path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                break
            except _RETRYABLE as exc:
                self.drop()
                if attempt:
                    raise ConnectionError(
                        f"genlm serve at {self.url} closed the connection: {exc!r}"
                    ) from None
            except TimeoutError:
                self.drop()
                raise TimeoutError(
                    f"genlm serve at {self.url} sent no reply to {path} within {self.request_timeout_s} s "
                    "(request_timeout_s)"
                ) from None
            except OSError as exc:
                self.drop()
                raise ConnectionError(f"genlm serve at {self.url}: {exc}") from None
        self.bytes_sent += len(body or b"")
        self.bytes_received += len(data)
        if resp.status == 200:
            return data
        try:
            err = json.loads(data)
            message, kind = str(err.get("error", "")), str(err.get("type", ""))
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            message, kind = data[:200].decode("utf-8", errors="replace"), ""
        text = f"genlm serve at {self.url}: {message}"
        if resp.status in (400, 413):
            raise ValueError(text)
        if resp.status == 401:
            raise PermissionError(text + " (pass token=... to load('remote', ...))")
        if resp.status == 503:
            raise ServerBusy(text)
        raise RemoteError(f"{text} (HTTP {resp.status}{', ' + kind if kind else ''})")

    def get_json(self, path: str) -> Any:
        return json.loads(self.request("GET", path))

    def post_json(self, path: str, payload: dict[str, Any]) -> Any:
        return json.loads(self.request("POST", path, json.dumps(payload).encode(), "application/json"))

    def close(self) -> None:
        with self._lock:
            conns, self._all = self._all, []
        for c in conns:
            c.close()
