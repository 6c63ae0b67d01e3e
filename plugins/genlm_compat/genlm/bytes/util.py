"""``genlm.bytes.util``: genlm-bytes' distribution helpers.

:class:`LazyByteProbs` is genlm-core's :class:`~genlm_core.bytes.dist.ByteDistribution`
with genlm-bytes' indexing and views (``materialize()`` and ``pretty()`` give a
:class:`Chart` of all 258 entries). :class:`Chart` is genlm-bytes' dict of values with
a default (``zero``) and the arithmetic its programs use (``argmax``, ``normalize``,
``top``, ``+``, ...).
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from genlm.backend._surface import public_dir  # noqa: E402

from genlm_core.bytes.dist import ByteDistribution

__all__ = ["Chart", "LazyByteProbs", "escape", "format_byte", "format_table", "logsumexp"]


class ByteProbsShapeError(ValueError, AssertionError):
    """Not 258 entries (genlm-bytes asserted the length)."""


class LazyByteProbs(ByteDistribution):
    """(Log-)probabilities of the 256 bytes, EOT (index 256, key ``None``) and EOS (257)."""

    __slots__ = ("log_space",)

    def __init__(self, ps: Any, log_space: bool = True) -> None:
        if len(ps) != 258:
            raise ByteProbsShapeError(f"expected 258 entries (256 bytes, EOT, EOS), got {len(ps)}")
        super().__init__(ps)
        self.log_space = log_space

    def __getitem__(self, b: int | None) -> Any:
        if b is None:
            return self.ps[256]
        if b >= 258:
            raise ValueError(f"Invalid index: {b}. Must be between 0 and 257, or None for EOT.")
        return self.ps[b]

    def materialize(self) -> "Chart":  # type: ignore[override]
        """A :class:`Chart` of every entry: bytes 0-255, ``None`` (EOT), 257 (EOS)."""
        q = Chart(-np.inf if self.log_space else 0)
        for b, p in enumerate(self.ps[:256]):
            q[b] = p
        q[None] = self.ps[256]
        q[257] = self.ps[257]
        return q

    def pretty(self) -> "Chart":  # type: ignore[override]
        """:meth:`materialize` keyed by ``bytes([b])``, ``"EOT"`` and ``"EOS"``."""
        return self.materialize().map_keys(
            lambda x: bytes([x]) if isinstance(x, int) and 0 <= x <= 255 else "EOS" if x == 257 else "EOT"
        )


def logsumexp(arr: Iterable[float]) -> float:
    """``log(sum(exp(arr)))`` without overflow (``-inf`` for no finite entry)."""
    a = np.array(arr, dtype=np.float64)
    a = a[a > -np.inf]
    if len(a) == 0:
        return -np.inf
    vmax = a.max()
    return np.log(np.exp(a - vmax).sum()) + vmax


def escape(x: Any) -> str:
    """A byte (int), bytes or text as printable text, spaces shown as ``␣``."""
    if isinstance(x, int):
        x = bytes([x])
    y = repr(x)[2:-1] if isinstance(x, bytes) else repr(x)[1:-1]
    return y.replace(" ", "␣")


def format_byte(byte_val: int) -> str:
    """``b'A'`` for a byte 0-255, the number itself for 256 (EOT) / 257 (EOS)."""
    try:
        return repr(bytes([byte_val])) if 0 <= byte_val <= 255 else str(byte_val)
    except Exception:  # noqa: BLE001 - anything else prints as itself
        return str(byte_val)


def _cell(x: Any) -> str:
    if type(x).__name__ in ("SVG", "HTML") and hasattr(x, "data"):  # IPython display objects
        return x.data
    for method in ("_repr_html_", "_repr_svg_", "_repr_image_svg_xml"):
        if hasattr(x, method):
            return getattr(x, method)()
    return f"<pre>{html.escape(str(x))}</pre>"


def format_table(rows: Iterable[Iterable[Any]], headings: Iterable[Any] | None = None) -> str:
    """An HTML table of ``rows`` (notebook display)."""
    head = (
        '<tr style="font-weight: bold;">' + "".join(f"<td>{x}</td>" for x in headings) + "</tr>"
        if headings
        else ""
    )
    body = "".join("<tr>" + "".join(f"<td>{_cell(x)}</td>" for x in row) + " </tr>" for row in rows)
    return "<table>" + head + body + "</table>"


class Chart(dict):
    """A dict with a default value ``zero`` for missing keys, and arithmetic over values."""

    def __init__(self, zero: Any, vals: Any = ()) -> None:
        self.zero = zero
        super().__init__(vals)

    def __missing__(self, k: Any) -> Any:
        return self.zero

    def spawn(self) -> "Chart":
        return Chart(self.zero)

    def __add__(self, other: Any) -> "Chart":
        new = self.spawn()
        for part in (self, other):
            for k, v in part.items():
                new[k] += v
        return new

    def __mul__(self, other: Any) -> "Chart":
        new = self.spawn()
        for k in self:
            v = self[k] * other[k]
            if v != self.zero:
                new[k] += v
        return new

    def copy(self) -> "Chart":
        return Chart(self.zero, self)

    def trim(self) -> "Chart":
        return Chart(self.zero, {k: v for k, v in self.items() if v != self.zero})

    def metric(self, other: "Chart") -> Any:
        assert isinstance(other, Chart)
        return max((abs(self[x] - other[x]) for x in self.keys() | other.keys()), default=0)

    def _repr_html_(self) -> str:
        return (
            '<div style="font-family: Monospace;">'
            + format_table(self.trim().items(), headings=["key", "value"])
            + "</div>"
        )

    def __repr__(self) -> str:
        return repr({k: v for k, v in self.items() if v != self.zero})

    def __str__(self, style_value: Callable[[Any, Any], str] = lambda k, v: str(v)) -> str:
        lines = (
            f"  {k!r}: {style_value(k, self[k])},"
            for k in sorted(self, key=lambda k: -self[k])
            if self[k] != self.zero
        )
        return "Chart {\n" + "\n".join(lines) + "\n}"

    def assert_equal(
        self, want: Any, *, domain: Any = None, tol: float = 1e-5, verbose: bool = False, throw: bool = True
    ) -> None:
        if not isinstance(want, Chart):
            want = Chart(self.zero, want)
        assert verbose or throw
        errors = []
        for x in self.keys() | want.keys() if domain is None else domain:
            ok = abs(self[x] - want[x]) <= tol
            if verbose:
                print("ok " if ok else "BAD", x, self[x], *(() if ok else (want[x],)))
            if not ok:
                errors.append(x)
        if throw:
            for x in errors:
                raise AssertionError(f"{x}: {self[x]} {want[x]}")

    def argmax(self) -> Any:
        return max(self, key=self.__getitem__)

    def argmin(self) -> Any:
        return min(self, key=self.__getitem__)

    def top(self, k: int) -> "Chart":
        return Chart(self.zero, {x: self[x] for x in sorted(self, key=self.__getitem__, reverse=True)[:k]})

    def max(self) -> Any:
        return max(self.values())

    def min(self) -> Any:
        return min(self.values())

    def sum(self) -> Any:
        return sum(self.values())

    def sort(self, **kwargs: Any) -> "Chart":
        return Chart(self.zero, [(k, self[k]) for k in sorted(self, **kwargs)])

    def sort_descending(self) -> "Chart":
        return Chart(self.zero, [(k, self[k]) for k in sorted(self, key=lambda k: -self[k])])

    def normalize(self) -> "Chart":
        Z = self.sum()
        return self if Z == 0 else Chart(self.zero, [(k, v / Z) for k, v in self.items()])

    def filter(self, f: Callable[[Any], bool]) -> "Chart":
        return Chart(self.zero, [(k, v) for k, v in self.items() if f(k)])

    def map_values(self, f: Callable[[Any], Any]) -> "Chart":
        return Chart(f(self.zero), [(k, f(v)) for k, v in self.items()])

    def map_keys(self, f: Callable[[Any], Any]) -> "Chart":
        return Chart(self.zero, [(f(k), v) for k, v in self.items()])

    def project(self, f: Callable[[Any], Any]) -> "Chart":
        """Apply ``f`` to each key, summing values whose keys collide."""
        out = self.spawn()
        for k, v in self.items():
            out[f(k)] += v
        return out

    def compare(self, other: Any, *, domain: Any = None) -> Any:
        """A pandas DataFrame of both values and their distance per key (``genlm-compat[pandas]``)."""
        import pandas as pd

        if not isinstance(other, Chart):
            other = Chart(self.zero, other)
        keys = self.keys() | other.keys() if domain is None else domain
        return pd.DataFrame(
            [dict(key=x, self=self[x], other=other[x], metric=abs(self[x] - other[x])) for x in keys]
        )

    def to_dict(self) -> dict[Any, Any]:
        return dict(self.items())


__dir__ = public_dir(__name__)  # the API only, as the reference lists it
