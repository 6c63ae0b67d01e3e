"""`BeamParams`: the configuration of the byte-level beam ("beam" ByteModel)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from pydantic import AliasChoices, Field, field_validator

from genlm_core.config import GenlmConfig

__all__ = ["BeamParams"]


class BeamParams(GenlmConfig):
    """Parameters of :class:`genlm_core.bytes.beam.ByteBeamState`.

    ``K=None`` keeps every candidate (with ``prune_threshold=0`` the beam is then an
    exact sum over tokenizations). ``eos_tokens`` (alias ``eos_byte_strings``) are
    the byte strings of the tokens that end a sequence; ``None`` takes the
    backend's EOS tokens (``llm.eos_token_ids``), ``()`` disables EOS.
    """

    component = "beam"

    K: int | None = Field(5, ge=1, description="beam width (None: no width limit)")
    prune_threshold: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="drop candidates whose share of the beam mass is at most this",
    )
    eos_tokens: tuple[bytes, ...] | None = Field(
        None,
        validation_alias=AliasChoices("eos_tokens", "eos_byte_strings"),
        description="byte strings of the EOS tokens (None: the backend's EOS tokens)",
    )
    heal: bool = Field(True, description="adaptive token healing when a byte would empty the beam")
    heal_max_backoff: int | None = Field(
        None, ge=0, description="most bytes healing may back off within the current token"
    )
    heal_max_splits: int | None = Field(
        None, ge=0, description="most intra-suffix commits during one healing attempt"
    )
    verbose: bool = Field(False, description="print the beam after every byte")
    initial_context: tuple[int, ...] | None = Field(
        None, description="token ids the model is conditioned on first (None: BOS, else EOS)"
    )
    max_context_length: int | None = Field(
        None, ge=1, description="keep at most this many context tokens (None: the model's limit)"
    )
    lookahead: int = Field(
        16,
        ge=0,
        description="when the bytes are known (prefill, bits_per_byte): score tokenizations up to this many "
        "bytes ahead, so one forward pass serves several bytes (0: off; results are the same)",
    )
    lookahead_width: int = Field(
        16, ge=1, description="most lookahead contexts scored per byte position and forward pass"
    )
    lookahead_margin: float = Field(
        12.0,
        gt=0.0,
        description="lookahead skips tokenizations this many nats below the best one ending at the same byte",
    )
    trie: str | None = Field(
        None,
        description="registered trie implementation (None: the CPU trie, numba-accelerated when installed)",
    )

    model_config = {**GenlmConfig.model_config, "populate_by_name": True}

    @field_validator("eos_tokens", mode="before")
    @classmethod
    def _eos_bytes(cls, v: Any) -> Any:
        if v is None:
            return None
        if isinstance(v, (bytes, str)):
            v = [v]
        if not isinstance(v, Iterable):
            raise ValueError(f"expected byte strings, got {type(v).__name__}")
        out = []
        for t in v:
            if isinstance(t, str):
                t = t.encode("utf-8")
            if not isinstance(t, (bytes, bytearray, memoryview)):
                raise ValueError(f"EOS tokens must be byte strings, got {type(t).__name__}")
            out.append(t if isinstance(t, bytes) else bytes(t))
        return tuple(out)

    @classmethod
    def accepted_keys(cls) -> list[str]:
        return [*cls.model_fields, "eos_byte_strings"]

    @property
    def log_prune_threshold(self) -> float:
        """``log(prune_threshold)`` (``-inf`` for 0)."""
        return math.log(self.prune_threshold) if self.prune_threshold > 0 else -math.inf

    @property
    def eos_byte_strings(self) -> tuple[bytes, ...] | None:
        return self.eos_tokens
