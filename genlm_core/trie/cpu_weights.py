"""How the CPU trie (:class:`genlm_core.trie.cpu.TokenByteTrie`) takes weights in and
hands results back: every input (a NumPy array, a torch tensor on any device, a list of
rows) becomes one C-contiguous host array of a dtype the passes accumulate from, and a
result goes back as the caller's kind (a torch tensor for torch input).

float64 stays float64 and any other float, integer or bool input becomes float32 (NumPy
cannot hold bfloat16, so torch half precision is upcast before it leaves torch); complex
and object input raises ``TypeError``; a wrong shape, or an ``out=`` array that is not
the result's shape, dtype and layout, raises ``ValueError``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["check_out", "prepare", "stack_rows", "to_host", "wrap"]


def to_host(ws: Any) -> tuple[np.ndarray, bool]:
    """(array, came_from_torch). Torch half-precision tensors (float16, bfloat16,
    which NumPy cannot hold) are upcast to float32 on the host."""
    mod = type(ws).__module__
    if mod.startswith("torch"):
        t = ws.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.is_complex():
            raise TypeError(f"weights must be real numbers, got a torch tensor of dtype {t.dtype}")
        if t.is_floating_point() and t.element_size() < 4:
            t = t.float()
        return t.numpy(), True
    if isinstance(ws, (list, tuple)) and len(ws) == 0:
        return np.zeros(0), False
    return np.asarray(ws), False


def prepare(ws: Any, n: int, ndim: int) -> tuple[np.ndarray, bool, np.dtype]:
    """``ws`` as a C-contiguous host array of ``ndim`` dimensions, the last ``n`` long
    (float64 or float32), whether it came from torch, and the result's dtype."""
    arr, from_torch = to_host(ws)
    if arr.ndim != ndim or arr.shape[-1] != n:
        want = f"({n},)" if ndim == 1 else f"(batch, {n})"
        raise ValueError(f"weights must have shape {want}, got {tuple(arr.shape)}")
    if arr.dtype == np.float64:
        out_dtype = np.dtype(np.float64)
    elif arr.dtype.kind in "fiub":
        out_dtype = np.dtype(np.float32)
        if arr.dtype != np.float32:
            arr = arr.astype(np.float32)
    else:
        raise TypeError(f"weights must be real numbers, got an array of dtype {arr.dtype}")
    return np.ascontiguousarray(arr), from_torch, out_dtype


def wrap(out: np.ndarray, from_torch: bool) -> Any:
    """A result as the caller's kind: a (CPU) torch tensor sharing ``out``'s memory for
    torch input, ``out`` itself otherwise."""
    if from_torch:
        import torch

        return torch.from_numpy(out)
    return out


def check_out(out: Any, shape: tuple[int, ...], dt: np.dtype) -> None:
    """Raise ValueError unless ``out`` can take a result of ``shape`` and ``dt`` in place
    (a C-contiguous NumPy array of exactly that shape and dtype)."""
    if isinstance(out, np.ndarray) and out.shape == shape and out.dtype == dt and out.flags.c_contiguous:
        return
    got = f"{out.dtype} array of shape {out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
    raise ValueError(f"out must be a C-contiguous {dt} array of shape {shape}, got {got}")


def stack_rows(ws: Any, n: int, method: str) -> Any:
    """A list of 1-D weight vectors of length ``n`` as one ``(batch, n)`` array (or
    tensor); anything else as it is. ``method`` names the caller in the errors."""
    if not isinstance(ws, (list, tuple)):
        return ws
    if not ws:
        raise ValueError(
            f"{method} got an empty list: it takes weights of shape (batch, {n}) or a "
            f"non-empty list of ({n},) vectors; for no rows pass np.empty((0, {n}))"
        )
    for i, w in enumerate(ws):
        shape = tuple(getattr(w, "shape", np.shape(w)))
        if shape != (n,):
            raise ValueError(f"{method}: weights row {i} must have shape ({n},), got {shape}")
    if type(ws[0]).__module__.startswith("torch"):
        import torch

        return torch.stack([w.detach().cpu() for w in ws])
    return np.stack([np.asarray(w) for w in ws])
