"""Observations of public calls as JSON-able records, and their comparison.

Imported by ``cases.py`` on both sides (the reference venv has no genlm-core, so this
module needs the standard library, NumPy and, when the values are tensors, torch).

An observation is one of:

* ``{"value": v}``: ``v`` from :func:`encode` (exact, except numbers that carry a
  tolerance: ``{"num": ...}`` nodes inside ``v``);
* ``{"raised": {"type": name, "is": [probe names], "message": text}}``: the call
  raised; ``is`` lists the :data:`PROBES` the exception is an instance of, so the
  comparison can ask the question a caller's ``except`` clause asks.

:func:`differences` compares the reference's observation with genlm-compat's:
values equal (numbers within the tolerance the case gave, the same non-finite
entries in the same places, the same container types, dtypes and shapes), or both
raised and every probe class that catches the reference's exception catches
genlm-compat's too (``except IndexError`` keeps working when genlm-compat raises a
class that is both ``ValueError`` and ``IndexError``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

#: the exception classes a caller's ``except`` may name; an observation lists those
#: its exception is an instance of
PROBES: tuple[type[BaseException], ...] = (
    ValueError,
    TypeError,
    IndexError,
    KeyError,
    LookupError,
    RuntimeError,
    NotImplementedError,
    AttributeError,
    ImportError,
    AssertionError,
    ArithmeticError,
)


def num(x: Any, atol: float = 0.0, rtol: float = 0.0) -> dict[str, Any]:
    """A number or an array/tensor (kind, dtype, shape, values) compared within
    ``atol + rtol * |reference|``; the tolerance is the case's, stated where it calls this."""
    kind, dtype, shape, data = _numeric(x)
    return {"num": {"kind": kind, "dtype": dtype, "shape": shape, "data": data, "atol": atol, "rtol": rtol}}


def _numeric(x: Any) -> tuple[str, str, list[int], Any]:
    mod = type(x).__module__
    if mod.startswith("torch"):
        t = x.detach().cpu()
        if t.layout != _torch_strided():
            t = t.to_dense()
        return (
            "torch.Tensor",
            str(t.dtype).removeprefix("torch."),
            list(t.shape),
            _floats(t.double().tolist()),
        )
    import numpy as np

    if isinstance(x, float):  # numpy.float64 is a float too
        return "float", "", [], _floats(float(x))
    if isinstance(x, np.ndarray):
        return "numpy.ndarray", str(x.dtype), list(x.shape), _floats(x.astype(np.float64).tolist())
    if isinstance(x, np.generic):
        return f"numpy.{type(x).__name__}", str(x.dtype), [], _floats(float(x))
    if isinstance(x, int) and not isinstance(x, bool):
        return "int", "", [], _floats(float(x))
    raise TypeError(f"not a number or array: {type(x).__name__}")


def _torch_strided() -> Any:
    import torch

    return torch.strided


def _floats(data: Any) -> Any:
    """Nested lists of floats with non-finite values as strings (JSON has none)."""
    if isinstance(data, list):
        return [_floats(d) for d in data]
    f = float(data)
    return f if math.isfinite(f) else repr(f)


def encode(x: Any) -> Any:
    """``x`` as JSON: containers keep their type name (a ``set`` is not a ``tuple``),
    bytes become hex, arrays and tensors become exact :func:`num` nodes."""
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, int) and type(x) is int:
        return x
    if isinstance(x, float):
        return num(x)
    if isinstance(x, bytes):
        tid = getattr(x, "token_id", None)
        if tid is not None:
            return {"Token": [encode(tid), x.hex()]}
        return {"bytes": x.hex()}
    if isinstance(x, (list, tuple)):
        return {type(x).__name__ if type(x) in (list, tuple) else "sequence": [encode(v) for v in x]}
    if isinstance(x, (set, frozenset)):
        items = [encode(v) for v in x]
        return {"set": sorted(items, key=repr)}
    if isinstance(x, dict) and set(x) == {"num"}:  # already recorded with its tolerance
        return x
    if isinstance(x, Mapping):
        return {"mapping": [[encode(k), encode(v)] for k, v in x.items()]}
    mod = type(x).__module__
    if mod.startswith(("torch", "numpy")):
        return num(x)
    raise TypeError(f"cannot record a {type(x).__module__}.{type(x).__name__}; convert it in the case")


def raised(exc: BaseException) -> dict[str, Any]:
    return {
        "raised": {
            "type": type(exc).__name__,
            "is": [p.__name__ for p in PROBES if isinstance(exc, p)],
            "message": str(exc)[:300],
        }
    }


def observe(thunk: Callable[[], Any], conv: Callable[[Any], Any] = encode) -> dict[str, Any]:
    """Run ``thunk``; its converted value, or what it raised."""
    try:
        value = thunk()
    except Exception as exc:  # noqa: BLE001 - recording what the call raised is the point
        return raised(exc)
    try:
        return {"value": conv(value)}
    except Exception as exc:  # noqa: BLE001
        return {"unrecordable": f"{type(exc).__name__}: {exc}"}


async def aobserve(thunk: Callable[[], Any], conv: Callable[[Any], Any] = encode) -> dict[str, Any]:
    """:func:`observe` of a call that returns an awaitable."""
    try:
        value = await thunk()
    except Exception as exc:  # noqa: BLE001
        return raised(exc)
    try:
        return {"value": conv(value)}
    except Exception as exc:  # noqa: BLE001
        return {"unrecordable": f"{type(exc).__name__}: {exc}"}


# --------------------------------------------------------------------------- comparison


def differences(ref: Any, got: Any, path: str = "") -> list[str]:
    """Where observation (or record) ``got`` differs from ``ref`` (empty: they agree)."""
    if isinstance(ref, dict) and "raised" in ref:
        if not (isinstance(got, dict) and "raised" in got):
            return [
                f"{path}: the reference raised {ref['raised']['type']}, genlm-compat did not ({_short(got)})"
            ]
        missing = set(ref["raised"]["is"]) - set(got["raised"]["is"])
        if missing:
            return [
                f"{path}: the reference raised {ref['raised']['type']}, genlm-compat "
                f"{got['raised']['type']} ({got['raised']['message'][:120]!r}), which is not a {sorted(missing)}"
            ]
        return []
    if isinstance(got, dict) and "raised" in got:
        return [f"{path}: genlm-compat raised {got['raised']['type']}: {got['raised']['message'][:160]!r}"]
    if isinstance(ref, dict) and "num" in ref:
        return _num_diff(ref["num"], got.get("num") if isinstance(got, dict) else None, path)
    if isinstance(ref, dict) and isinstance(got, dict):
        out = []
        if set(ref) != set(got):
            out.append(f"{path}: keys {sorted(ref)} != {sorted(got)}")
        for k in ref:
            if k in got:
                out += differences(ref[k], got[k], f"{path}.{k}" if path else k)
        return out
    if isinstance(ref, list) and isinstance(got, list):
        if len(ref) != len(got):
            return [f"{path}: {len(ref)} items != {len(got)}"]
        out = []
        for i, (a, b) in enumerate(zip(ref, got)):
            out += differences(a, b, f"{path}[{i}]")
            if len(out) > 5:
                break
        return out
    if ref != got:
        return [f"{path}: {_short(ref)} != {_short(got)}"]
    return []


def _num_diff(a: dict[str, Any], b: dict[str, Any] | None, path: str) -> list[str]:
    if b is None:
        return [f"{path}: a number was expected"]
    for field in ("kind", "dtype", "shape"):
        if a[field] != b[field]:
            return [f"{path}: {field} {a[field]} != {b[field]}"]
    fa, fb = _flat(a["data"]), _flat(b["data"])
    atol, rtol = a["atol"], a["rtol"]
    for i, (x, y) in enumerate(zip(fa, fb)):
        if isinstance(x, str) or isinstance(y, str):  # inf, -inf, nan: in the same places
            if x != y:
                return [f"{path}[{i}]: {x} != {y}"]
        elif abs(x - y) > atol + rtol * abs(x):
            worst = max(
                (abs(p - q) for p, q in zip(fa, fb) if not isinstance(p, str) and not isinstance(q, str)),
                default=0.0,
            )
            return [f"{path}[{i}]: {x!r} != {y!r} (atol {atol}, rtol {rtol}; largest difference {worst:.3g})"]
    return []


def _flat(data: Any) -> list[Any]:
    if isinstance(data, list):
        return [v for d in data for v in _flat(d)]
    return [data]


def _short(x: Any) -> str:
    text = repr(x)
    return text if len(text) < 160 else text[:157] + "..."
