"""Checking what a request sends, before it counts as in flight.

(Its body is read by :mod:`genlm_core.serve.bodies`.) JSON bodies are parsed strictly
(no ``NaN`` / ``Infinity``, bounded nesting) into pydantic models whose errors name the
field; every size limit is checked before any work: token budgets
(``max_request_tokens``), batch sizes, text lengths.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from genlm_core.serve.limits import ServeLimits

__all__ = [
    "DetokenizeRequest",
    "HTTPError",
    "SampleRequest",
    "TokenizeRequest",
    "parse_json",
    "token_budget",
]

_INT64 = 2**63


class HTTPError(Exception):
    """An answer with a status other than 200 (``headers``: extra response headers)."""

    def __init__(self, status: int, message: str, kind: str = "error", headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.headers = headers or {}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(body: bytes, what: str = "request body") -> dict[str, Any]:
    """A JSON object, or a ``ValueError`` saying what is wrong with ``what``."""
    try:
        data = json.loads(body, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError(f"{what} is not JSON the server accepts: nested too deeply") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{what} is not JSON: {exc}") from None
    except ValueError as exc:  # NaN, Infinity
        raise ValueError(f"{what} is not JSON the server accepts: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{what} must be a JSON object")
    return data


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    @classmethod
    def parse(cls, data: dict[str, Any], what: str) -> Any:
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"field {'.'.join(str(p) for p in e['loc']) or '(body)'!r}: {e['msg']}" for e in exc.errors()
            )
            raise ValueError(f"{what} request: {problems}") from None


class SampleRequest(_Strict):
    prompts: list[list[int]]
    max_tokens: int = Field(ge=0)
    eos_token_ids: list[int] | None = None
    temperature: float = Field(1.0, ge=0, allow_inf_nan=False)
    seed: int | None = Field(None, ge=-_INT64, lt=_INT64)
    batch: bool = True

    @model_validator(mode="after")
    def _seeds_fit(self) -> "SampleRequest":
        if self.seed is not None and self.seed + max(0, len(self.prompts) - 1) >= _INT64:
            raise ValueError(
                f"field 'seed': prompt i samples with seed + i, which must stay below 2**63 "
                f"(seed {self.seed}, {len(self.prompts)} prompts)"
            )
        return self


class TokenizeRequest(_Strict):
    text: str
    add_special_tokens: bool = True

    @field_validator("text")
    @classmethod
    def _characters_only(cls, text: str) -> str:
        """JSON's ``\\ud800`` escapes decode to lone surrogates, which are no characters:
        no tokenizer takes them (the Rust ones raise TypeError)."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"lone surrogate U+{ord(text[exc.start]):04X} at character {exc.start} is not a Unicode "
                "character; send valid text (a character above U+FFFF escaped as a surrogate pair, "
                "e.g. \\ud83d\\ude00)"
            ) from None
        return text


class DetokenizeRequest(_Strict):
    ids: list[int]
    skip_special_tokens: bool = False


def token_budget(tokens: int, limits: ServeLimits, what: str) -> None:
    """A request of ``tokens`` tokens within ``max_request_tokens``, or HTTP 413."""
    if tokens > limits.max_request_tokens:
        raise HTTPError(
            413,
            f"{what} of {tokens} tokens is above the server's limit of {limits.max_request_tokens} tokens "
            "per request (--max-request-tokens); split it into several requests",
            "TooManyTokens",
        )
