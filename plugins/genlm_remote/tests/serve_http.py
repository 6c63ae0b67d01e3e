"""Raw HTTP for the serve tests: requests with exactly the headers a test sets (a hostile
client, a browser), and a connection that sends part of a body and stalls."""

from __future__ import annotations

import http.client
import json
import socket
import urllib.parse
from typing import Any

from genlm_core.serve import frame

JSON = "application/json"


def host_port(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def request(
    url: str,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 60.0,
    source: str | None = None,
) -> tuple[int, bytes]:
    """``(status, body)``; ``headers`` replace the defaults (Host by http.client, and the
    endpoint's media type on POST); ``source``: the local address to connect from."""
    host, port = host_port(url)
    conn = http.client.HTTPConnection(
        host, port, timeout=timeout, source_address=(source, 0) if source else None
    )
    given = {k.lower(): v for k, v in (headers or {}).items()}
    if method == "POST" and "content-type" not in given:
        given["content-type"] = frame.MEDIA_TYPE if path == "/v1/logprobs" else JSON
    try:
        conn.putrequest(method, path, skip_host="host" in given)
        for k, v in given.items():
            conn.putheader(k, v)
        conn.putheader("Content-Length", str(len(body or b"")))
        conn.endheaders(body or b"")
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def post_json(url: str, path: str, payload: Any, **kw: Any) -> tuple[int, dict]:
    raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    status, body = request(url, "POST", path, raw, **kw)
    return status, json.loads(body) if body else {}


def stalled_body(url: str, path: str = "/v1/logprobs", sent: int = 10, declared: int = 40,
                 source: str | None = None) -> socket.socket:  # fmt: skip
    """A connection that sent valid headers and ``sent`` of ``declared`` body bytes."""
    host, port = host_port(url)
    s = socket.create_connection((host, port), timeout=60, source_address=(source, 0) if source else None)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {frame.MEDIA_TYPE}\r\n"
        f"Content-Length: {declared}\r\n\r\n"
    )
    s.sendall(head.encode() + b"G" * sent)
    return s


def read_status(sock: socket.socket) -> int:
    """The status of the response waiting on ``sock`` (0 if it was closed without one)."""
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return 0
        data += chunk
    return int(data.split(b" ", 2)[1])
