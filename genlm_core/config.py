"""Pydantic v2 configuration models shared by every protocol implementation.

Every config rejects unknown keys with an error that names the key, the
implementation and the accepted keys (with close matches), rejects bad values with
an error that names the option, the value and what is accepted (never pydantic's
raw "1 validation error for ..." text), and prints its JSON schema through
:meth:`GenlmConfig.schema_json`.
"""

from __future__ import annotations

import contextvars
import difflib
import json
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Literal

import annotated_types
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator

from genlm_core import model_files as model_folder
from genlm_core.dtype_names import DTYPES, normalize_dtype
from genlm_core.errors import ConfigError

__all__ = [
    "GenlmConfig",
    "BackendConfig",
    "ConfigError",
    "build_config",
    "describe_validation_error",
    "reject_unknown_options",
    "unknown_options_message",
]


#: the component name ``build_config`` reports errors under (a registered name)
_COMPONENT: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "genlm_config_component", default=None
)


class GenlmConfig(BaseModel):
    """Base of every genlm-core config: strict about unknown keys, clear about bad values.

    Building one (``Config(...)``, :meth:`build`) or assigning a field raises
    :class:`ConfigError` naming the option, the bad value and what is accepted.
    """

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, protected_namespaces=(), populate_by_name=True
    )

    #: Name used in error messages (the registered implementation name).
    component: ClassVar[str] = ""

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigError(describe_validation_error(type(self), exc, _COMPONENT.get())) from None

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            raise ConfigError(describe_validation_error(type(self), exc)) from None

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        try:
            return super().model_validate(obj, **kwargs)
        except ValidationError as exc:
            raise ConfigError(describe_validation_error(cls, exc, _COMPONENT.get())) from None

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


def unknown_options_message(component: str, unknown: Iterable[str], accepted: Sequence[str]) -> str:
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


def _unknown_keys_message(cls: type[GenlmConfig], component: str, unknown: Iterable[str]) -> str:
    return (
        unknown_options_message(component, unknown, cls.accepted_keys())
        + f" See the schema with `genlm backends --schema {component}`."
    )


def build_config(cls: type[GenlmConfig], component: str, kwargs: dict[str, Any]) -> GenlmConfig:
    unknown = [k for k in kwargs if k not in cls.accepted_keys()]
    if unknown:
        raise ConfigError(_unknown_keys_message(cls, component, unknown))
    token = _COMPONENT.set(component)
    try:
        return cls(**kwargs)  # a bad value: ConfigError from GenlmConfig.__init__
    finally:
        _COMPONENT.reset(token)


# ---------------------------------------------------------------------- error messages
_TYPE_WORDS: dict[Any, str] = {
    bool: "true or false",
    int: "an integer",
    float: "a number",
    str: "a string",
    bytes: "a byte string",
    dict: "a mapping",
}
_BOUNDS = ((annotated_types.Gt, "gt", ">"), (annotated_types.Ge, "ge", ">="))
_BOUNDS += ((annotated_types.Lt, "lt", "<"), (annotated_types.Le, "le", "<="))


def _describe_type(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        words = [_describe_type(a) for a in args if a is not type(None)]
        if type(None) in args:
            words.append("None")
        return ", or ".join(words)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (tuple, list) or tp in (tuple, list):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return "a sequence" + (f" of {_describe_type(args[0]).removeprefix('a ')}s" if len(args) == 1 else "")
    return _TYPE_WORDS.get(origin or tp, getattr(tp, "__name__", str(tp)))


def accepted_values(cls: type[BaseModel], field: str) -> str | None:
    """What option ``field`` of ``cls`` accepts, in words (``"an integer >= 1, or None"``)."""
    info = cls.model_fields.get(field)
    if info is None:
        return None
    bounds = [
        f"{op} {getattr(m, attr)}" for m in info.metadata for kind, attr, op in _BOUNDS if isinstance(m, kind)
    ]
    words = _describe_type(info.annotation)
    if bounds:
        # the bounds belong to the non-None member: "an integer >= 1, or None"
        first, _, rest = words.partition(", or ")
        words = f"{first} {' and '.join(bounds)}" + (f", or {rest}" if rest else "")
    return words


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _field_of(cls: type[BaseModel], key: str) -> str:
    """The field a location key names (a field name or one of its validation aliases)."""
    if key in cls.model_fields:
        return key
    for name, info in cls.model_fields.items():
        alias = info.validation_alias
        choices = getattr(alias, "choices", [alias])
        if key in choices:
            return name
    return key


def describe_validation_error(
    cls: type[GenlmConfig], exc: ValidationError, component: str | None = None
) -> str:
    """One line for a pydantic error: each bad option with its value and what it accepts.

    Fields with several errors (each member of a union failed) are reported once.
    """
    component = component or getattr(cls, "component", "") or cls.__name__
    by_field: dict[str, list[dict[str, Any]]] = {}
    unknown = []
    for err in exc.errors():
        inner = (err.get("ctx") or {}).get("error")
        if isinstance(inner, ConfigError):  # raised by a nested GenlmConfig.__init__: already clear
            return str(inner)
        if err["type"] == "extra_forbidden" and len(err["loc"]) == 1:
            unknown.append(str(err["loc"][0]))
            continue
        by_field.setdefault(str(err["loc"][0]) if err["loc"] else "", []).append(err)
    parts = []
    for key, errs in by_field.items():
        err = errs[0]
        field = _field_of(cls, key)
        accepted = accepted_values(cls, field)
        # a union's members each fail: their messages only restate the accepted types
        why = "" if len(errs) > 1 else str(err["msg"]).removeprefix("Value error, ")
        name = ".".join(str(p) for p in err["loc"][: 1 if len(errs) > 1 else None]) or "(config)"
        if err["type"] == "missing":
            text = f"{name} is required"
        elif not err["loc"]:  # the config's own check of several options: its sentence says it all
            text = why
        else:
            text = f"{name}={_short(err.get('input'))}" + (f": {why}" if why else "")
        if accepted and err["type"] not in ("literal_error", "enum"):  # those list the choices
            text += f" (accepted: {accepted})"
        parts.append(text)
    message = f"Invalid option for {component!r}: " + "; ".join(parts) if parts else ""
    if unknown:
        message = " ".join(filter(None, [_unknown_keys_message(cls, component, unknown), message]))
    return message or str(exc)


class BackendConfig(GenlmConfig):
    """Options every LogprobBackend accepts. Plugins subclass this."""

    #: whether the model's checkpoint is read on this machine (False: it lives elsewhere,
    #: e.g. on a ``genlm serve`` server, whose answers the engine reports)
    reads_checkpoint: ClassVar[bool] = True
    #: the engine's one default dtype: what ``dtype="auto"`` means where the checkpoint
    #: declares none (a quantised GGUF file, no model at all). A plugin's config overrides it
    default_dtype: ClassVar[str] = "float32"

    model: str | None = Field(
        None,
        description="hub id or local folder of the model (a str or os.PathLike; a Path is always a local folder)",
    )

    @field_validator("model", mode="before")
    @classmethod
    def _model_argument(cls, value: Any) -> Any:
        return model_folder.as_model_argument(value)

    def model_needs(self) -> tuple[str, ...]:
        """What a local ``model`` folder must hold for this backend (keys of
        :data:`genlm_core.model_files.REQUIREMENTS`). Plugins override it."""
        return ("config", "tokenizer")

    def check_model(self) -> None:
        """Raise :class:`ConfigError` when ``model`` names a local folder that does not
        exist or lacks what :meth:`model_needs` says (hub ids pass). ``load()`` calls it
        before importing any engine; plugins call it first in ``from_config``."""
        model_folder.check_model_folder(self.model, self.model_needs())

    batch_size: int = Field(32, ge=1, description="most contexts per forward pass")
    timeout: float = Field(
        0.002,
        ge=0,
        allow_inf_nan=False,  # inf: a lone request under 'deadline' would wait forever
        description="seconds a request waits for others to join its batch (finite)",
    )
    batch_policy: Literal["deadline", "tick", "debounce"] = Field(
        "tick",
        description=(
            "when a partial batch runs: 'tick' = as soon as every task ready on the event loop has "
            "submitted (a lone caller does not wait), timeout as the upper bound; 'deadline' = timeout "
            "after its first request (also gathers requests from other threads); 'debounce' = timeout "
            "after the last request"
        ),
    )
    cache_size: int = Field(4096, ge=0, description="entries of the output cache (0 disables it)")
    cache_bytes: int | None = Field(
        1 << 30, ge=0, description="bytes held by the output cache (None: no bound)"
    )
    cache_to_cpu: bool = Field(
        False, description="keep cached results in host memory (a hit comes back on the rows' device)"
    )
    output_cache_impl: str = Field(
        "output",
        min_length=1,
        description="name of the registered cache that keeps next-token rows (`genlm backends --all` lists them)",
    )
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto",
        validation_alias=AliasChoices("dtype", "torch_dtype"),
        description=(
            "dtype the model computes in, the same on every backend: 'auto' = the checkpoint's "
            "dtype (config.json dtype/torch_dtype, else its safetensors weights, else the backend's "
            "default: float32; llama.cpp's float16 for a quantised GGUF); float32, float16 or "
            "bfloat16 otherwise. A backend that cannot run it on its device raises an error before "
            "loading instead of substituting another (old name: torch_dtype)"
        ),
    )
    forward_thread: bool | None = Field(
        None,
        description=(
            "run async forward passes in a worker thread (True) or on the event loop's own thread "
            "(False); None: the backend decides (genlm-hf on any device and genlm-llamacpp: the "
            "loop, measured faster; other engines: a thread)"
        ),
    )

    def requested_dtype(self) -> str:
        """The dtype asked for (``"auto"`` or a name of :data:`~genlm_core.dtype_names.DTYPES`),
        before the checkpoint resolves ``"auto"``; configs with another way to ask override it."""
        return self.dtype

    def requested_device(self) -> str | None:
        """The device asked for (``"cuda"``, ``"cuda:1"``, ``"mps"``, ``"cpu"``; None: the best
        this machine has for the backend); a config with a ``device`` option overrides it."""
        return None

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
