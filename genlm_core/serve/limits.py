"""What a server accepts: limits per request and per client, the token, where it may bind."""

from __future__ import annotations

import hmac
import ipaddress
import os
import socket
import stat
import sys

from pydantic import Field, model_validator

from genlm_core.config import GenlmConfig

__all__ = ["TOKEN_ENV", "ServeLimits", "check_bind", "is_loopback", "read_token", "token_matches"]

#: the environment variable a server reads its token from (a command line is visible in `ps`)
TOKEN_ENV = "GENLM_SERVE_TOKEN"


class ServeLimits(GenlmConfig):
    """Limits a server enforces; each violation is a clear error to that client only.

    Limits that cannot hold together (no body of the largest size fits in the bytes read at
    once) are a :class:`~genlm_core.errors.ConfigError` whose message says what to change."""

    component = "serve"

    max_body_bytes: int = Field(16 * 2**20, ge=1024, description="largest request body (bytes)")
    max_batch: int = Field(256, ge=1, description="most contexts in one request")
    max_context_length: int | None = Field(
        None, ge=1, description="longest context accepted (None: the model's own limit)"
    )
    max_request_tokens: int = Field(
        65536,
        ge=1,
        description=(
            "most tokens in one request: the sum of its contexts' lengths (a sampling request: its "
            "prompts plus max_tokens per prompt); more get HTTP 413"
        ),
    )
    max_text_bytes: int = Field(
        1 << 20, ge=1, description="longest text /v1/tokenize accepts (UTF-8 bytes); more get HTTP 413"
    )
    max_concurrent_requests: int = Field(
        64,
        ge=1,
        description=(
            "requests computed at once, over all clients; more get HTTP 503. A request counts once "
            "its body is read"
        ),
    )
    max_requests_per_client: int = Field(
        128,
        ge=1,
        description=(
            "requests of one peer address computed at once (their bodies read); more get HTTP 503. "
            "Bodies being read are capped over all clients (max_open_bodies): a local client may "
            "connect from any loopback address"
        ),
    )
    body_timeout_s: float = Field(
        30.0, gt=0, description="seconds a request's whole body may take to arrive; slower ones get HTTP 408"
    )
    body_idle_s: float = Field(
        10.0,
        gt=0,
        description=(
            "seconds a request body may go without a byte arriving (counted between reads, as nginx's "
            "client_body_timeout); a stalled body gets HTTP 408"
        ),
    )
    max_open_bodies: int = Field(
        256,
        ge=1,
        description=(
            "request bodies being read at once, over all clients; when all are taken, a new request "
            "takes the place of the one idle longest (HTTP 408 to it)"
        ),
    )
    max_open_body_bytes: int = Field(
        256 * 2**20,
        ge=1024,
        description=(
            "bytes of the request bodies being read at once, over all clients (at least "
            "max_body_bytes); when full, the bodies idle longest are dropped (HTTP 408) to make room"
        ),
    )
    max_shm_segments: int = Field(
        64,
        ge=0,
        description="shared-memory row segments handed to same-host clients (0: none, rows in frames)",
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

    @model_validator(mode="after")
    def _one_body_fits(self) -> "ServeLimits":
        if self.max_open_body_bytes < self.max_body_bytes:
            raise ValueError(
                f"max_open_body_bytes ({self.max_open_body_bytes}) is below max_body_bytes "
                f"({self.max_body_bytes}): no body of the largest size could be read; raise "
                "--max-open-body-bytes or lower --max-body-bytes"
            )
        return self


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
            f"Set {TOKEN_ENV} (or --token-file FILE), or bind 127.0.0.1"
        )
    if token is not None and len(token) < 16:
        raise ValueError(
            "the token must be at least 16 characters (e.g. `python -c 'import secrets; print(secrets.token_urlsafe())'`)"
        )


def read_token(cli_token: str | None, token_file: str | None) -> str | None:
    """The server's token: ``--token-file`` (a file only its owner may read), else
    ``$GENLM_SERVE_TOKEN``, else ``--token`` (with a warning: a command line is visible to
    every local user in ``ps``). ``None``: no token."""
    given = [name for name, v in (("--token", cli_token), ("--token-file", token_file)) if v]
    if len(given) > 1:
        raise ValueError("give the token once: --token-file FILE or GENLM_SERVE_TOKEN (not also --token)")
    if token_file is not None:
        try:
            st = os.stat(token_file)
            with open(token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            raise ValueError(f"cannot read --token-file {token_file!r}: {exc.strerror or exc}") from None
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ValueError(
                f"--token-file {token_file!r} is readable by other users (mode {stat.filemode(st.st_mode)}): "
                f"chmod 600 {token_file}"
            )
        if not token:
            raise ValueError(f"--token-file {token_file!r} is empty")
        return token
    if cli_token:
        print(
            "genlm serve: warning: --token is visible to every user of this machine (ps, /proc); "
            f"set {TOKEN_ENV} or use --token-file instead",
            file=sys.stderr,
        )
        return cli_token
    return os.environ.get(TOKEN_ENV) or None


def token_matches(expected: str | None, authorization: str | None) -> bool:
    """``Authorization: Bearer <token>`` (the scheme in any case) against ``expected``,
    in constant time. A header without the ``Bearer`` scheme never matches."""
    if expected is None:
        return True
    scheme, _, given = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), expected.encode())
