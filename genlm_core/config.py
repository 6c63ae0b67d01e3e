"""Pydantic v2 configuration models shared by every protocol implementation.

Every config rejects unknown keys with an error that names the key, the
implementation and the accepted keys (with close matches), and prints its JSON
schema through :meth:`GenlmConfig.schema_json`.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "GenlmConfig",
    "BackendConfig",
    "ConfigError",
    "build_config",
    "reject_unknown_options",
    "unknown_options_message",
]


class ConfigError(ValueError):
    """A configuration could not be built: the message says what to change."""


class GenlmConfig(BaseModel):
    """Base of every genlm-core config: strict about unknown keys."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())

    #: Name used in error messages (the registered implementation name).
    component: ClassVar[str] = ""

    @classmethod
    def accepted_keys(cls) -> list[str]:
        return list(cls.model_fields)

    @classmethod
    def schema_json(cls, indent: int = 2) -> str:
        """The JSON schema of this config, as text."""
        return json.dumps(cls.model_json_schema(), indent=indent)

    @classmethod
    def build(cls, component: str | None = None, /, **kwargs: Any) -> "GenlmConfig":
        """Validate ``kwargs`` into this config, with errors that say how to fix them."""
        return build_config(cls, component or cls.component or cls.__name__, kwargs)


def unknown_options_message(component: str, unknown: Sequence[str], accepted: Sequence[str]) -> str:
    """``Unknown option 'x' (did you mean 'y'?) for 'component'. Accepted options: ...``"""
    parts = []
    for key in unknown:
        close = difflib.get_close_matches(key, accepted, n=3, cutoff=0.6)
        hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
        parts.append(f"{key!r}{hint}")
    return f"Unknown option {', '.join(parts)} for {component!r}. Accepted options: {', '.join(accepted)}."


def reject_unknown_options(component: str, kwargs: Mapping[str, Any], accepted: Sequence[str]) -> None:
    """Raise :class:`ConfigError` naming every key of ``kwargs`` not in ``accepted``
    (with close matches): for constructors that take plain keyword options."""
    unknown = [k for k in kwargs if k not in accepted]
    if unknown:
        raise ConfigError(unknown_options_message(component, unknown, accepted))


def build_config(cls: type[GenlmConfig], component: str, kwargs: dict[str, Any]) -> GenlmConfig:
    accepted = cls.accepted_keys()
    unknown = [k for k in kwargs if k not in accepted]
    if unknown:
        raise ConfigError(
            unknown_options_message(component, unknown, accepted)
            + f" See the schema with `genlm backends --schema {component}`."
        )
    try:
        return cls(**kwargs)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "(config)"
            lines.append(f"{loc}: {err['msg']}")
        raise ConfigError(f"Invalid options for {component!r}: " + "; ".join(lines)) from None


class BackendConfig(GenlmConfig):
    """Options every LogprobBackend accepts. Plugins subclass this."""

    model: str | None = Field(None, description="hub id or local folder of the model")
    batch_size: int = Field(32, ge=1, description="most contexts per forward pass")
    timeout: float = Field(0.002, ge=0, description="seconds a request waits for others to join its batch")
    cache_size: int = Field(4096, ge=0, description="entries of the output cache (0 disables it)")
    cache_bytes: int | None = Field(
        1 << 30, ge=0, description="bytes held by the output cache (None: no bound)"
    )
    cache_to_cpu: bool = Field(False, description="keep cached results on the CPU")
    forward_thread: bool | None = Field(
        None,
        description=(
            "run async forward passes in a worker thread (True) or on the event loop's own thread "
            "(False); None: the backend decides (a thread for accelerators, the loop for CPU engines)"
        ),
    )
