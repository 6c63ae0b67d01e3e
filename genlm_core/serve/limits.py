"""What a server accepts: limits per request, the token, where it may bind."""

from __future__ import annotations

import hmac
import ipaddress
import socket

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ServeLimits", "check_bind", "is_loopback", "token_matches"]


class ServeLimits(BaseModel):
    """Limits a server enforces; each violation is a clear error to that client only."""

    model_config = ConfigDict(extra="forbid")

    max_body_bytes: int = Field(16 * 2**20, ge=1024, description="largest request body (bytes)")
    max_batch: int = Field(256, ge=1, description="most contexts in one request")
    max_context_length: int | None = Field(
        None, ge=1, description="longest context accepted (None: the model's own limit)"
    )
    max_concurrent_requests: int = Field(
        64, ge=1, description="requests served at once, over all clients; more get HTTP 503"
    )
    max_sample_tokens: int = Field(4096, ge=1, description="largest max_tokens of a sampling request")
    gather_s: float = Field(
        0.1,
        ge=0,
        description=(
            "longest a rows request waits for the other active clients' requests so that they share "
            "one batch, after the backend went idle: a quarter of the last forward pass, at most this "
            "(genlm_core.serve.gather; 0: off)"
        ),
    )
    graceful_shutdown_s: float = Field(
        30.0, gt=0, description="on shutdown, how long in-flight requests may finish before they are failed"
    )


def is_loopback(host: str) -> bool:
    """Whether ``host`` names only this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(a[4][0]).is_loopback for a in socket.getaddrinfo(host, None))
        except (OSError, ValueError):
            return False


def check_bind(host: str, token: str | None) -> None:
    """A non-loopback bind needs a token: refuse to start without one."""
    if not is_loopback(host) and not token:
        raise ValueError(
            f"refusing to bind {host!r} without a token: anyone who can reach it could use the model. "
            "Pass --token (or GENLM_SERVE_TOKEN), or bind 127.0.0.1"
        )
    if token is not None and len(token) < 16:
        raise ValueError(
            "the token must be at least 16 characters (e.g. `python -c 'import secrets; print(secrets.token_urlsafe())'`)"
        )


def token_matches(expected: str | None, authorization: str | None) -> bool:
    """``Authorization: Bearer <token>`` against ``expected``, in constant time."""
    if expected is None:
        return True
    given = (authorization or "").removeprefix("Bearer ").strip()
    return hmac.compare_digest(given.encode(), expected.encode())
