"""What a request must carry before any handler sees it: an allowed ``Host``, no foreign
``Origin``, the endpoint's media type on POST, and the bearer token when one is set.

A web page can make a browser send requests to a loopback server: *simple* cross-origin
requests (a POST with ``Content-Type: text/plain`` needs no preflight) and, after DNS
rebinding (``attacker.example`` re-resolved to 127.0.0.1, the class of Ollama's
CVE-2024-28224), same-origin requests whose ``Host`` is the attacker's name. So:

* exactly one ``Host``: a request with two is a 400 (RFC 7230 section 5.4), whichever
  names the server;
* ``Host`` must name the server as it is bound: ``127.0.0.1``, ``localhost``, ``[::1]``,
  the ``--host`` value, the names given with ``--allow-host``; any IP literal when it
  listens on every interface (a rebinding attack always carries a DNS name). It is
  parsed whole, as ``host[:port]`` (:func:`parse_host`): ``localhost:x@evil.com`` or
  ``[::1]evil.com`` is refused, not read as its first part;
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
import re
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from genlm_core.serve.limits import token_matches

__all__ = ["RequestGuard", "allowed_host_names", "parse_host"]

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


#: a name (RFC 3986 reg-name, restricted to what DNS and /etc/hosts hold) or an IPv4
#: address: labels of letters, digits, ``-`` and ``_`` between single dots, one final dot
_NAME = re.compile(r"(?:[a-z0-9_-]+\.)*[a-z0-9_-]+\.?")


def parse_host(value: str) -> tuple[str, int | None]:
    """A ``Host`` header (RFC 7230: ``uri-host [":" port]``, RFC 3986's host) as ``(host,
    port)``: the host in lower case, without brackets or the final dot; the port, or None.
    ``"[::1]:8765"`` -> ``("::1", 8765)``, ``"Example.COM.:80"`` -> ``("example.com", 80)``.
    Anything else (text after the port, a second colon, ``@``, empty labels, an unclosed
    or misplaced bracket) is a ``ValueError`` naming the fault: the host is never taken
    from part of a header."""
    text = value.strip().lower()
    if not text:
        raise ValueError("the request has no Host")
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError("'[' opens an IPv6 address that no ']' closes")
        host, rest = text[1:end], text[end + 1 :]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host!r} in brackets is not an IPv6 address") from None
        if rest and not rest.startswith(":"):
            raise ValueError(f"{rest!r} follows ']': only ':PORT' may")
    else:
        host, colon, port = text.partition(":")
        rest = colon + port
        if _is_ip(text) and ":" in text:
            raise ValueError(f"an IPv6 address goes in brackets: '[{text}]'")
        if not _NAME.fullmatch(host):
            raise ValueError(
                f"{host!r} is not a host name or IPv4 address (labels of letters, digits, '-' "
                "between single dots)"
            )
    port = rest[1:]
    if rest and not (port == "" or (port.isascii() and port.isdigit() and int(port) <= 65535)):
        raise ValueError(f"port {port!r} is not a number from 0 to 65535")
    return host.removesuffix("."), int(port) if port else None


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
        hosts = 0
        for k, v in scope.get("headers", []):
            name = k.decode("latin-1").lower()
            hosts += name == "host"
            headers.setdefault(name, v.decode("latin-1"))
        if hosts > 1:  # RFC 7230 5.4: which one names the server is no check's to guess
            return (
                400,
                f"the request carries {hosts} Host headers; HTTP/1.1 (RFC 7230 section 5.4) allows "
                "one: send the name or address the server was reached by, once",
                "BadRequest",
            )
        given = headers.get("host", "")
        try:
            host, _ = parse_host(given)
        except ValueError as exc:
            return (
                403,
                f"Host {given!r} is not HOST[:PORT] ({exc}); send the name or address the server "
                "was reached by, e.g. 'localhost:8765' or '[::1]:8765'",
                "HostNotAllowed",
            )
        if not (host in self.hosts or (self.any_ip and _is_ip(host))):
            return (
                403,
                f"Host {given!r} is not a name this server answers to "
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
