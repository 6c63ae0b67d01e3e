"""What a request must carry before any handler sees it: an allowed ``Host``, no foreign
``Origin``, the endpoint's media type on POST, and the bearer token when one is set.

A web page can make a browser send requests to a loopback server: *simple* cross-origin
requests (a POST with ``Content-Type: text/plain`` needs no preflight) and, after DNS
rebinding (``attacker.example`` re-resolved to 127.0.0.1, the class of Ollama's
CVE-2024-28224), same-origin requests whose ``Host`` is the attacker's name. So:

* ``Host`` must name the server as it is bound: ``127.0.0.1``, ``localhost``, ``[::1]``,
  the ``--host`` value, the names given with ``--allow-host``; any IP literal when it
  listens on every interface (a rebinding attack always carries a DNS name);
* a request carrying an ``Origin`` other than the server's own is refused, and so is every
  ``OPTIONS`` (a browser's preflight);
* a POST must declare the endpoint's media type (``application/x-genlm-frame`` or
  ``application/json``): neither is one a page may send without a preflight;
* every endpoint but ``/v1/health`` needs ``Authorization: Bearer <token>`` when the
  server has a token.

:class:`RequestGuard` is an ASGI middleware around the whole application (unknown paths
included), so no route can forget a check.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from genlm_core.serve.limits import token_matches

__all__ = ["RequestGuard", "allowed_host_names"]

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]], Awaitable[None]]

_LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
_WILDCARD = ("0.0.0.0", "::", "")


def allowed_host_names(bind_host: str, extra: Iterable[str] = ()) -> frozenset[str]:
    """The ``Host`` names a server bound to ``bind_host`` answers (lower case, no port)."""
    names = {*_LOOPBACK_NAMES, bind_host.strip("[]").lower(), *(h.strip("[]").lower() for h in extra)}
    if bind_host in _WILDCARD:
        names.update({socket.gethostname().lower(), socket.getfqdn().lower()})
    names.discard("")
    return frozenset(names)


def _host_of(value: str) -> str:
    """``"[::1]:8765"`` -> ``"::1"``, ``"Example.COM.:80"`` -> ``"example.com"``."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    host = value.rsplit(":", 1)[0] if value.count(":") == 1 else value
    return host.rstrip(".")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class RequestGuard:
    """ASGI middleware: the checks of the module docstring, then ``app``.

    ``media_types``: path -> the media type its POST must declare. ``on_refused(status,
    kind, client)`` counts refusals (for /v1/stats)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        hosts: frozenset[str],
        any_ip: bool,
        token: str | None,
        media_types: dict[str, str],
        open_paths: frozenset[str] = frozenset({"/v1/health"}),
        on_refused: Callable[[int, str, str], None] | None = None,
    ) -> None:
        self.app = app
        self.hosts = hosts
        self.any_ip = any_ip
        self.token = token
        self.media_types = media_types
        self.open_paths = open_paths
        self.on_refused = on_refused

    def problem(self, scope: Scope) -> tuple[int, str, str] | None:
        """``(status, message, kind)`` of the first check ``scope`` fails, or None."""
        headers: dict[str, str] = {}
        for k, v in scope.get("headers", []):
            headers.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))
        host = _host_of(headers.get("host", ""))
        if not (host in self.hosts or (self.any_ip and _is_ip(host))):
            return (
                403,
                f"Host {headers.get('host', '')!r} is not a name this server answers to "
                f"({', '.join(sorted(self.hosts))}); connect by one of them, or start the server "
                "with --allow-host NAME",
                "HostNotAllowed",
            )
        origin = headers.get("origin")
        if origin is not None and not self._own_origin(origin, headers.get("host", "")):
            return (
                403,
                f"requests from the web origin {origin!r} are refused: genlm serve answers programs, "
                "not browser pages",
                "OriginRefused",
            )
        method = scope.get("method", "GET")
        if method == "OPTIONS":
            return 403, "cross-origin (preflight) requests are refused", "OriginRefused"
        path = scope.get("path", "")
        if path not in self.open_paths and not token_matches(self.token, headers.get("authorization")):
            return 401, "missing or wrong token (send 'Authorization: Bearer <token>')", "Unauthorized"
        wanted = self.media_types.get(path)
        if method == "POST" and wanted is not None:
            given = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            if given != wanted:
                return (
                    415,
                    f"POST {path} needs 'Content-Type: {wanted}', got {given or 'none'!r}",
                    "UnsupportedMediaType",
                )
        return None

    def _own_origin(self, origin: str, host_header: str) -> bool:
        """Whether ``origin`` is this server itself (``http://<Host header>``)."""
        scheme, sep, rest = origin.strip().lower().partition("://")
        return bool(sep) and scheme == "http" and rest == host_header.strip().lower()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = self.problem(scope)
        if problem is None:
            await self.app(scope, receive, send)
            return
        status, message, kind = problem
        if self.on_refused is not None:
            client = scope.get("client")
            self.on_refused(status, kind, client[0] if client else "local")
        body = json.dumps({"error": message, "type": kind}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
