"""`ByteDistribution`: a (log-)distribution over 256 bytes, end-of-token and EOS."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from genlm_core.engine.sampling import check_temperature

__all__ = ["EOS", "EOT", "EOT_INDEX", "EOS_INDEX", "ByteDistribution", "symbol_name", "check_temperature"]

#: key of the end-of-token entry (index 256), as in genlm-bytes
EOT = None
EOT_INDEX = 256
#: key and index of the end-of-sequence entry
EOS = 257
EOS_INDEX = 257
SIZE = 258


def _index(key: int | None) -> int:
    if key is None:
        return EOT_INDEX
    k = int(key)
    if not 0 <= k < SIZE:
        raise KeyError(f"{key!r} is not a byte (0-255), None (EOT) or 257 (EOS)")
    return k


def symbol_name(key: int | None) -> str:
    """Readable name of a key: ``b' '``, ``EOT`` or ``EOS``."""
    if key is None or key == EOT_INDEX:
        return "EOT"
    if key == EOS_INDEX:
        return "EOS"
    return repr(bytes([int(key)]))


class ByteDistribution:
    """Lazy view of 258 log-probabilities: index ``b`` for byte ``b``, 256 (key
    ``None``) for end-of-token, 257 for EOS. Nothing is materialised until asked.

    ``dist[b]`` is a log-probability; :meth:`top`, :meth:`argmax`, :meth:`pretty`
    and :meth:`materialize` give readable views.
    """

    __slots__ = ("ps",)

    def __init__(self, logps: np.ndarray) -> None:
        ps = np.asarray(logps, dtype=np.float64)
        if ps.shape != (SIZE,):
            raise ValueError(f"expected {SIZE} log-probabilities, got shape {ps.shape}")
        self.ps = ps

    # ------------------------------------------------------------------ access
    def __getitem__(self, key: int | None) -> float:
        return float(self.ps[_index(key)])

    def __len__(self) -> int:
        return SIZE

    def __iter__(self) -> Iterator[int | None]:
        return iter(self.keys())

    @staticmethod
    def keys() -> list[int | None]:
        return [*range(256), EOT, EOS]

    def logp(self, key: int | None) -> float:
        return self[key]

    def prob(self, key: int | None) -> float:
        return float(np.exp(self.ps[_index(key)]))

    @property
    def probs(self) -> np.ndarray:
        """The 258 probabilities."""
        return np.exp(self.ps)

    def total(self) -> float:
        """Sum of the probabilities (1 for a normalised distribution)."""
        return float(np.exp(self.ps).sum())

    def argmax(self, exclude_eot: bool = True) -> int | None:
        ps = self.ps.copy()
        if exclude_eot:
            ps[EOT_INDEX] = -np.inf
        i = int(np.argmax(ps))
        return None if i == EOT_INDEX else i

    def top(self, k: int = 10) -> list[tuple[int | None, float]]:
        """The ``k`` most probable keys with their log-probabilities, best first
        (``-inf`` entries left out)."""
        k = max(0, min(int(k), SIZE))
        idx = np.argsort(-self.ps, kind="stable")[:k]
        return [(None if i == EOT_INDEX else int(i), float(self.ps[i])) for i in idx if self.ps[i] > -np.inf]

    def materialize(self) -> dict[int | None, float]:
        """``{key: logp}`` for every key with non-zero probability."""
        return {(None if i == EOT_INDEX else i): float(p) for i, p in enumerate(self.ps) if p > -np.inf}

    def sample(self, rng: np.random.Generator, temperature: float = 1.0) -> int | None:
        """Draw a key (EOT never drawn). ``temperature`` is a finite number >= 0;
        ``0`` is the argmax."""
        temperature = check_temperature(temperature)
        if temperature == 0:
            return self.argmax()
        ps = self.ps.copy()
        ps[EOT_INDEX] = -np.inf
        # shift before scaling: a tiny temperature must not overflow the top entry
        ps = (ps - np.max(ps)) / temperature
        w = np.exp(ps)
        w /= w.sum()
        i = int(rng.choice(SIZE, p=w))
        return None if i == EOT_INDEX else i

    # ------------------------------------------------------------------ display
    def pretty(self, k: int = 10) -> str:
        """A small table of the ``k`` most probable symbols."""
        rows = [f"{'symbol':>10}  {'prob':>8}  {'logp':>9}"]
        for key, lp in self.top(k):
            rows.append(f"{symbol_name(key):>10}  {np.exp(lp):8.4f}  {lp:9.4f}")
        rest = SIZE - len(rows) + 1
        if rest > 0:
            shown = sum(np.exp(lp) for _, lp in self.top(k))
            rows.append(f"{'(' + str(rest) + ' more)':>10}  {max(0.0, self.total() - shown):8.4f}")
        return "\n".join(rows)

    def __repr__(self) -> str:
        items = ", ".join(f"{symbol_name(k)}: {np.exp(lp):.3f}" for k, lp in self.top(5))
        return f"ByteDistribution({items}, ...)"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, ByteDistribution) and np.array_equal(self.ps, other.ps)

    __hash__ = None  # type: ignore[assignment]
