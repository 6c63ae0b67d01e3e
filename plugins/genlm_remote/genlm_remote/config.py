from typing import ClassVar, Literal

from pydantic import Field

from genlm_core.engine import BackendConfig


class RemoteConfig(BackendConfig):
    """Options of the remote backend. The model, dtype and tokenizer are the server's:
    ``model`` and ``dtype``, when given, must match what it serves."""

    component = "remote"
    reads_checkpoint: ClassVar[bool] = False  # the model lives on the server

    url: str = Field(
        "http://127.0.0.1:8765",
        description=(
            "the server (`genlm serve`): http://HOST:PORT; shm+http://HOST:PORT asks for rows "
            "through shared memory (same host)"
        ),
    )
    token: str | None = Field(
        None, description="bearer token the server was started with (its GENLM_SERVE_TOKEN or --token-file)"
    )
    transport: Literal["auto", "shm", "frame"] = Field(
        "auto",
        description=(
            "how rows come back: 'shm' = through a shared-memory segment the server hands this "
            "client over its Unix socket (rows come in the frame where none can be had), "
            "'frame' = float32 rows in the HTTP reply, 'auto' = shm when the server is on this "
            "host (a loopback url, or the server reports this host's name), else frame"
        ),
    )
    request_timeout_s: float = Field(600.0, gt=0, description="seconds to wait for one reply before failing")
    connect_timeout_s: float = Field(10.0, gt=0, description="seconds to wait for a connection")

    def model_needs(self) -> tuple[str, ...]:
        return ()
