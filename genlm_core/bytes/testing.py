"""Test helpers for byte-level models: a table-driven backend and brute-force oracles.

:class:`TableBackend` is a real :class:`~genlm_core.engine.backend.BaseLogprobBackend` (the
shared batcher, cache and validation) over a small byte vocabulary. Its next-token
distribution is fixed per context: given explicitly in ``table`` or, otherwise,
pseudo-random and seeded by the whole context.

:class:`BruteForce` enumerates every tokenization to give exact prefix
probabilities of byte strings, the quantities a beam with ``K=None`` and
``prune_threshold=0`` must reproduce.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from genlm_core.config import BackendConfig
from genlm_core.engine.backend import BaseLogprobBackend
from genlm_core.engine.contract import Engine
from genlm_core.token import Token

__all__ = ["BruteForce", "TableBackend", "TableEngine"]


class _Tok:
    """Minimal tokenizer stand-in (ids only)."""

    def __init__(self, bos: int | None, eos: int | None) -> None:
        self.bos_token_id = bos
        self.eos_token_id = eos
        self.name_or_path = "table"


class TableEngine(Engine):
    """The engine of :class:`TableBackend`: a table of distributions, else seeded noise."""

    def __init__(
        self,
        vocab: Sequence[bytes],
        eos_token_ids: Sequence[int],
        table: Mapping[tuple[int, ...], Mapping[int, float]] | None,
        bos: int | None,
        scale: float,
        seed: int,
        default: Mapping[int, float] | None,
    ) -> None:
        self.byte_vocab = [Token(i, bytes(b)) for i, b in enumerate(vocab)]
        eos = [int(e) for e in eos_token_ids]
        if bos is None:
            bos = eos[0] if eos else 0
        self.tokenizer = _Tok(bos, eos[0] if eos else None)
        self.eos_token_ids = eos
        self.table = {tuple(k): dict(v) for k, v in (table or {}).items()}
        self.default = dict(default) if default is not None else None
        self.scale = scale
        self.seed = seed
        self.forward_calls = 0
        self.forward_rows = 0

    def logits_for(self, ctx: tuple[int, ...]) -> np.ndarray:
        size = len(self.byte_vocab)
        row = self.table.get(tuple(ctx), self.default)
        if row is not None:
            p = np.zeros(size)
            for i, v in row.items():
                p[i] = v
            with np.errstate(divide="ignore"):
                return np.log(p / p.sum()).astype(np.float32)
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, len(ctx), *ctx]))
        return (rng.standard_normal(size) * self.scale).astype(np.float32)

    def forward(self, contexts: list[tuple[int, ...]]) -> Any:
        import torch

        self.forward_calls += 1
        self.forward_rows += len(contexts)
        return torch.from_numpy(np.stack([self.logits_for(c) for c in contexts]))

    def stats(self) -> dict[str, Any]:
        return {"forward_calls": self.forward_calls, "forward_rows": self.forward_rows}


class TableBackend(BaseLogprobBackend):
    """A LogprobBackend over ``vocab`` whose distributions come from a table.

    Args:
        vocab: byte strings (duplicates allowed: distinct token ids).
        eos_token_ids: ids of the EOS tokens.
        table: ``{context tuple: {token id: probability}}`` (missing ids get 0);
            contexts not in the table get a seeded pseudo-random distribution.
        bos: the BOS token id (default: the first EOS id).
        scale: spread of the pseudo-random logits (larger is peakier).
        seed: mixed into the pseudo-random seed.
        timeout: the batcher's wait for more requests (0: tests run fast).
        default: ``{token id: probability}`` for contexts not in ``table``
            (instead of the pseudo-random distribution).
    """

    backend_name = "table"
    engine: TableEngine

    def __init__(
        self,
        vocab: Sequence[bytes],
        eos_token_ids: Sequence[int] = (),
        table: Mapping[tuple[int, ...], Mapping[int, float]] | None = None,
        bos: int | None = None,
        scale: float = 2.0,
        seed: int = 0,
        timeout: float = 0.0,
        default: Mapping[int, float] | None = None,
    ) -> None:
        engine = TableEngine(vocab, eos_token_ids, table, bos, scale, seed, default)
        super().__init__(engine, BackendConfig(timeout=timeout))


class BruteForce:
    """Exact byte-level probabilities of a token LM by enumerating tokenizations.

    ``with_eos=True``: EOS tokens end the sequence (their bytes are never read);
    ``False``: they are ordinary tokens. Empty tokens are never used.
    """

    def __init__(self, llm: BaseLogprobBackend, context: Sequence[int], with_eos: bool = True) -> None:
        self.llm = llm
        self.context = tuple(context)
        self.with_eos = with_eos
        self.vocab = [bytes(t) for t in llm.byte_vocab]
        self.eos = set(llm.eos_token_ids)

    @functools.cache  # noqa: B019 - test helper, lives as long as the test
    def _probs(self, ctx: tuple[int, ...]) -> np.ndarray:
        """The row as the beam reads it: ``exp`` in float64, renormalised.

        A float32 ``log_softmax`` row sums to 1 only up to its float32 rounding
        (``|log sum exp(row)|`` is a few ``eps32``, and its value depends on the
        CPU's SIMD path: -3.0e-8 on AVX2 for one table row). The beam divides every
        row's masses by the root's mass, so it computes with the renormalised row;
        the oracle does the same, and the two then differ by float64 rounding only.
        """
        lp = self.llm.next_token_logprobs_sync(ctx)
        p = np.exp(lp.detach().cpu().numpy().astype(np.float64))
        return p / p.sum()

    def _ordinary(self) -> list[int]:
        return [i for i, t in enumerate(self.vocab) if t and not (self.with_eos and i in self.eos)]

    @functools.cache  # noqa: B019
    def prefix(self, rest: bytes, ctx: tuple[int, ...] | None = None) -> float:
        """P(the byte stream starts with ``rest``) after ``ctx`` (default: the context)."""
        ctx = self.context if ctx is None else ctx
        if not rest:
            return 1.0
        p = self._probs(ctx)
        total = 0.0
        for i in self._ordinary():
            t = self.vocab[i]
            if len(t) >= len(rest):
                if t.startswith(rest):
                    total += p[i]
            elif rest.startswith(t):
                total += p[i] * self.prefix(rest[len(t) :], (*ctx, i))
        return total

    @functools.cache  # noqa: B019
    def exact_then_eos(self, rest: bytes, ctx: tuple[int, ...] | None = None) -> float:
        """P(the stream is exactly ``rest`` and then EOS) (0 unless ``with_eos``)."""
        if not self.with_eos:
            return 0.0
        ctx = self.context if ctx is None else ctx
        p = self._probs(ctx)
        if not rest:
            return float(sum(p[i] for i in self.eos))
        total = 0.0
        for i in self._ordinary():
            t = self.vocab[i]
            if rest.startswith(t):
                total += p[i] * self.exact_then_eos(rest[len(t) :], (*ctx, i))
        return total

    def next_byte_logprobs(self, x: bytes) -> np.ndarray:
        """Exact log P(next symbol | x) over 258 entries (EOT is always -inf)."""
        fx = self.prefix(x)
        out = np.full(258, -np.inf)
        for b in sorted(set(b"".join(self.vocab))):  # other bytes are in no token: 0
            v = self.prefix(x + bytes([b]))
            if v > 0:
                out[b] = math.log(v / fx)
        e = self.exact_then_eos(x)
        if e > 0:
            out[257] = math.log(e / fx)
        return out
