"""What a value keeps alive in memory, and private copies of it.

Used by the caches (budgets count the storage a value keeps alive, not its visible
elements: a row that is a view of a batch tensor keeps the whole batch alive) and by
the batcher and the backend (every caller owns the tensor it gets: results are
private copies, never the cached object or another caller's). Torch tensors, numpy
arrays and mlx arrays are recognised without importing any engine.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "sizeof",
    "storage_of",
    "private_copy",
    "private_copies",
    "cpu_copies",
    "compact",
    "on_device",
    "accelerator",
    "moved_from_cpu",
]


#: classes whose instances are torch tensors (their class has the methods): a row's check is
#: a set lookup, where reading two bound methods of a tensor costs ~1.5 us (twice a row a step)
_TENSOR_CLASSES: set[type] = set()


def _is_torch_tensor(value: Any) -> bool:
    cls = type(value)
    if cls in _TENSOR_CLASSES:
        return True
    if not (callable(getattr(value, "untyped_storage", None)) and callable(getattr(value, "clone", None))):
        return False
    if callable(getattr(cls, "untyped_storage", None)) and callable(getattr(cls, "clone", None)):
        _TENSOR_CLASSES.add(cls)
    return True


def _is_numpy_array(value: Any) -> bool:
    return type(value).__module__ == "numpy" and hasattr(value, "base") and hasattr(value, "nbytes")


def _torch_storage(value: Any) -> tuple[Any, int] | None:
    """(identity, bytes) of a tensor's storage; None for tensors without one (sparse)."""
    try:
        storage = value.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    return ("torch", str(value.device), storage.data_ptr()), int(storage.nbytes())


def _numpy_root(value: Any) -> tuple[Any, int]:
    """(identity, bytes) of the buffer a numpy array (or a view of one) keeps alive."""
    root = value
    while True:
        base = getattr(root, "base", None)
        if base is None:
            break
        if isinstance(getattr(base, "nbytes", None), int):
            root = base  # another array, a memoryview
            continue
        if isinstance(base, (bytes, bytearray)):
            return ("numpy", id(base)), len(base)
        break
    return ("numpy", id(root)), int(root.nbytes)


def _array_storage(value: Any) -> tuple[Any, int] | None:
    """(identity, bytes) of the storage a torch tensor or numpy array keeps alive; None for
    anything else (and for tensors without a storage)."""
    if _is_torch_tensor(value):
        return _torch_storage(value)
    if _is_numpy_array(value):
        return _numpy_root(value)
    return None


def sizeof(value: Any) -> int:
    """Bytes a value keeps alive: tensors and arrays by the storage they hold.

    A torch tensor counts its whole ``untyped_storage()`` (a row viewed out of a batch
    tensor counts the batch), a numpy view counts the array it views; mlx arrays count
    ``nbytes``. Tuples, lists and dicts sum their items, counting a storage shared by
    several items once. Other objects: ``bytes`` by length, anything else 64.
    """
    return _sizeof(value, set())


def _sizeof(value: Any, seen: set[Any]) -> int:
    if value is None:
        return 0
    found = _array_storage(value)
    if found is not None:
        ident, nbytes = found
    elif _is_torch_tensor(value):  # no storage (sparse)
        return int(value.numel()) * int(value.element_size())
    elif isinstance(getattr(value, "nbytes", None), int):  # mlx arrays, memoryviews
        return int(value.nbytes)
    elif isinstance(value, (tuple, list)):
        return sum(_sizeof(v, seen) for v in value)
    elif isinstance(value, dict):
        return sum(_sizeof(v, seen) for v in value.values())
    elif isinstance(value, (bytes, bytearray)):
        return len(value)
    else:
        return 64
    if ident in seen:
        return 0
    seen.add(ident)
    return nbytes


def storage_of(value: Any) -> tuple[Any, int]:
    """``(identity, bytes)`` of the storage ``value`` keeps alive: equal identities for
    values viewing one storage (rows of one batch tensor, views of one numpy array), so a
    holder of several counts it once. A value that is no tensor or array (or holds several)
    is its own storage of :func:`sizeof` bytes."""
    found = _array_storage(value)
    return found if found is not None else (("own", id(value)), sizeof(value))


#: the fewest elements torch copies in parallel (``at::internal::GRAIN_SIZE``): a smaller
#: tensor's clone runs on the calling thread alone, and costs less than numpy's copy
_PARALLEL_GRAIN = 32768


def _clone_tensor(value: Any) -> Any:
    """A compact copy of a torch tensor, on its device. A CPU tensor that numpy can view is
    copied by numpy (one thread), not by torch's ``clone``.

    Why: torch runs a copy of more than 32,768 elements as an OpenMP parallel region, and the
    first such region on a thread gives that thread an OpenMP pool of its own. Once two
    threads of a process own one, libgomp throttles its spinning (more pool threads than
    cores) and every small parallel op of either gets slower: on a 2-core machine a
    parallel ``exp`` of 40k floats took 15 us with one pool and 43-45 us with two. The
    batcher copies a row for a context's second caller on the event loop's thread while
    forward passes run on its worker (``genlm serve`` always; a GPU engine too): one such
    clone made every later SmolLM2-135M pass of 16 rows on the CPU 30-36% slower (130-147 ms
    against 168-200, three runs each). A row's copy gains nothing from two threads anyway."""
    t = value.detach()
    if t.device.type == "cpu" and t.numel() >= _PARALLEL_GRAIN and not t.is_conj() and not t.is_neg():
        try:
            src = t.numpy()
        except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16), a sparse layout
            import torch

            if t.layout != torch.strided:
                return t.clone()
            return t.clone(memory_format=torch.contiguous_format)
        out = t.new_empty(tuple(t.shape))  # contiguous
        out.numpy()[...] = src
        return out
    return t.clone()


def private_copy(value: Any) -> Any:
    """A copy the receiver owns: torch tensors cloned, numpy arrays copied (both compact).

    Tuples, lists and dicts are copied item by item; other objects (ints, strings,
    immutable results, mlx arrays, which are not modified in place) are returned as
    they are.
    """
    if _is_torch_tensor(value):
        return _clone_tensor(value)
    if _is_numpy_array(value):
        return value.copy()
    if isinstance(value, tuple):
        return tuple(private_copy(v) for v in value)
    if isinstance(value, list):
        return [private_copy(v) for v in value]
    if isinstance(value, dict):
        return {k: private_copy(v) for k, v in value.items()}
    return value


#: device types whose tensors :func:`private_copies` copies in one batched copy (on the CPU
#: a copy each costs the same: the bytes, not the launches)
BATCHED_COPY_DEVICES = {"cuda"}


def private_copies(values: list[Any]) -> list[Any]:
    """:func:`private_copy` of each of ``values``; torch tensors on a CUDA device are
    copied in one batched copy (one launch for the lot, where a clone each launches a copy
    each - on a GPU the host's time per row of a step). Each copy is compact and owns its
    storage."""
    if len(values) > 1 and all(_is_torch_tensor(v) for v in values):
        device = values[0].device
        if device.type in BATCHED_COPY_DEVICES and all(v.device == device for v in values):
            return _batched_copies(values)
    return [private_copy(v) for v in values]


def _batched_copies(values: list[Any]) -> list[Any]:
    """Copies of torch tensors of one device in one batched operation.

    Floating-point tensors that need no gradient: ``torch._foreach_mul(values, 1.0)``,
    whose copies are allocated in C++ (``x * 1.0`` is ``x`` bit for bit in IEEE
    arithmetic: signed zeros, infinities and subnormals included; only a NaN's payload
    may differ, and a NaN row is an error row). The H200's host made 64 rows of 49,152
    float32 in 236 us this way against 378 us through Python's ``empty_like`` and one
    ``_foreach_copy_`` (``bench_hf_step --host-account``'s copy probe), the way other
    tensors (another dtype, a gradient, a strided view: copies are contiguous) still go."""
    import torch

    exact = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
    scalable = all(v.dtype in exact and not v.requires_grad and v.is_contiguous() for v in values)
    if scalable and hasattr(torch, "_foreach_mul"):
        return list(torch._foreach_mul(values, 1.0))
    if not hasattr(torch, "_foreach_copy_"):
        return [private_copy(v) for v in values]
    srcs = [v.detach() for v in values]
    out = [torch.empty_like(v, memory_format=torch.contiguous_format) for v in srcs]
    torch._foreach_copy_(out, srcs)
    return out


def on_device(value: Any) -> bool:
    """Whether ``value`` (a tensor, an array, anything with a ``device``) lives on a device
    other than the CPU."""
    device = getattr(value, "device", None)
    return device is not None and getattr(device, "type", device) not in ("cpu", None)


#: torch's device kinds other than the CPU, as a device's name starts (``"cuda:1"``)
_ACCELERATOR_KINDS = ("cuda", "mps", "xpu", "npu", "hpu", "mtia", "privateuseone")


def accelerator(device: Any) -> Any:
    """``device`` (a torch device, or its name) where it is one of torch's accelerators;
    None for the CPU, no device, or anything else (a device map)."""
    kind = getattr(device, "type", None)
    if kind is None and isinstance(device, str):
        kind = device.split(":", 1)[0]
    return device if kind in _ACCELERATOR_KINDS else None


def moved_from_cpu(value: Any, device: Any) -> Any:
    """``value`` moved to ``device`` (an :func:`accelerator`, or None) where it is a tensor
    held on the CPU: a copy of its own; None where nothing moves (no accelerator, a value
    on a device already, or not a tensor)."""
    if device is None or not _is_torch_tensor(value) or value.device.type != "cpu":
        return None
    return value.to(device)


def cpu_copies(values: list[Any]) -> list[Any]:
    """A private copy of each of ``values`` on the CPU: a device's torch tensors of one
    dtype and shape go to the host in one transfer, where a ``.to("cpu")`` each would copy
    and wait once a row; their copies are then rows of one CPU block (a holder counts it
    once: :func:`storage_of`). Rows that view one batch tensor in order move as that
    tensor. A device value of another kind is moved alone (``.to("cpu")``), anything else
    copied (:func:`private_copy`)."""
    out = list(values)
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, v in enumerate(values):
        if not on_device(v):
            out[i] = private_copy(v)
        elif _is_torch_tensor(v):
            groups.setdefault((v.device, v.dtype, tuple(v.shape)), []).append(i)
        elif hasattr(v, "to"):
            out[i] = compact(v.to("cpu"))
        else:
            out[i] = private_copy(v)
    for idx in groups.values():
        rows = [values[i].detach() for i in idx]
        if len(rows) == 1:
            out[idx[0]] = compact(rows[0].to("cpu"))
            continue
        block = _batch_of(rows)
        if block is None:
            import torch

            block = torch.stack(rows)
        for i, row in zip(idx, block.to("cpu").unbind(0)):
            out[i] = row
    return out


def _batch_of(rows: list[Any]) -> Any:
    """The contiguous ``(n, ...)`` tensor whose rows ``rows`` are, in order (a batch's
    ``unbind``), or None."""
    base = rows[0]._base
    if base is None or not base.is_contiguous() or base.dim() < 1 or base.shape[0] != len(rows):
        return None
    if any(r._base is not base for r in rows):
        return None
    step = base[0].numel() * base.element_size()
    start = base.data_ptr()
    if any(r.data_ptr() != start + i * step or not r.is_contiguous() for i, r in enumerate(rows)):
        return None
    return base


def compact(value: Any) -> Any:
    """``value`` itself when it owns exactly its bytes, else a compact copy.

    For results handed to one caller: a row viewed out of a batch tensor would keep
    the whole batch alive for as long as the caller holds it.
    """
    if _is_torch_tensor(value):
        found = _torch_storage(value)
        if found is not None and found[1] > int(value.numel()) * int(value.element_size()):
            return _clone_tensor(value)
        return value
    if _is_numpy_array(value):
        return value.copy() if _numpy_root(value)[1] > int(value.nbytes) else value
    return value
