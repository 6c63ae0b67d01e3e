"""Pydantic v2 configuration models shared by every protocol implementation.

Every config rejects unknown keys with an error that names the key, the
implementation and the accepted keys (with close matches), and prints its JSON
schema through :meth:`GenlmConfig.schema_json`.
"""

from __future__ import annotations

import difflib
import json
from typing import Any, ClassVar, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator

from genlm_core.dtypes import DTYPES, normalize_dtype

__all__ = ["GenlmConfig", "BackendConfig", "ConfigError", "build_config"]


class ConfigError(ValueError):
    """A configuration could not be built: the message says what to change."""


class GenlmConfig(BaseModel):
    """Base of every genlm-core config: strict about unknown keys."""

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, protected_namespaces=(), populate_by_name=True
    )

    #: Name used in error messages (the registered implementation name).
    component: ClassVar[str] = ""

    @classmethod
    def accepted_keys(cls) -> list[str]:
        """Field names, then the old names kept as aliases (e.g. ``torch_dtype``)."""
        keys = list(cls.model_fields)
        for field in cls.model_fields.values():
            alias = field.validation_alias
            choices = alias.choices if isinstance(alias, AliasChoices) else [alias] if alias else []
            keys += [c for c in choices if isinstance(c, str) and c not in keys]
        return keys

    @classmethod
    def schema_json(cls, indent: int = 2) -> str:
        """The JSON schema of this config, as text."""
        return json.dumps(cls.model_json_schema(), indent=indent)

    @classmethod
    def build(cls, component: str | None = None, /, **kwargs: Any) -> "GenlmConfig":
        """Validate ``kwargs`` into this config, with errors that say how to fix them."""
        return build_config(cls, component or cls.component or cls.__name__, kwargs)


def build_config(cls: type[GenlmConfig], component: str, kwargs: dict[str, Any]) -> GenlmConfig:
    accepted = cls.accepted_keys()
    unknown = [k for k in kwargs if k not in accepted]
    if unknown:
        parts = []
        for key in unknown:
            close = difflib.get_close_matches(key, accepted, n=3, cutoff=0.6)
            hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
            parts.append(f"{key!r}{hint}")
        raise ConfigError(
            f"Unknown option {', '.join(parts)} for {component!r}. "
            f"Accepted options: {', '.join(accepted)}. "
            f"See the schema with `genlm backends --schema {component}`."
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
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto",
        validation_alias=AliasChoices("dtype", "torch_dtype"),
        description=(
            "dtype the model computes in, the same on every backend: 'auto' = the checkpoint's "
            "dtype (config.json dtype/torch_dtype, else its safetensors weights, else float32); "
            "float32, float16 or bfloat16 otherwise. A backend that cannot run it on its device "
            "raises an error instead of substituting another (old name: torch_dtype)"
        ),
    )
    forward_thread: bool | None = Field(
        None,
        description=(
            "run async forward passes in a worker thread (True) or on the event loop's own thread "
            "(False); None: the backend decides (a thread for accelerators, the loop for CPU engines)"
        ),
    )

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype_spelling(cls, value: Any) -> Any:
        """Accept torch dtypes and common spellings (``torch.float32``, ``bf16``, ``half``)."""
        if value is None or value == "auto":
            return "auto" if value is None else value
        name = normalize_dtype(value)
        if name is None:
            raise ValueError(f"dtype={value!r} is not one of {', '.join(DTYPES)}")
        return name
