"""Linear layers on the CPU through oneDNN, their weights packed once.

On the CPU torch computes a float32 ``nn.Linear`` with MKL's ``sgemm``, repacking the
weight into the kernel's blocked layout on every call; on AMD CPUs MKL also takes a
slower code path. oneDNN's matmul over a weight packed once at load
(``torch.ops.mkldnn._reorder_linear_weight``, the layout torch's own compiler uses when
it freezes a CPU model, then ``torch.ops.mkldnn._linear_pointwise``) computes the same
product 2-4x faster at the shapes a decode step and a prompt take (docs/numerics.md has
the figures; ``bench_hf_step`` measures them on a machine). The sums are ordered
differently: the rows differ from MKL's by float32 rounding, within the bounds every
test derives (:mod:`genlm_core.testing.tolerance`).

:func:`pack_linears` swaps every plain ``nn.Linear`` (and transformers' ``Conv1D``, GPT-2's
linear layers) of a float32 or bfloat16 CPU model for a :class:`PackedLinear` holding its
packed weight; the dense weight goes (no weight is held twice, except a head tied to the
input embedding, which the embedding keeps). :func:`unpack_linears` swaps them back,
exactly (the packed weight reordered back to the dense layout): LoRA adapters (peft)
inject themselves into ``nn.Linear`` layers only.

:func:`packing_problem` checks, once, that this torch has the operators and that they
agree with ``torch.nn.functional.linear`` on a random product: a torch without them, or
one that computes them wrongly, keeps MKL.
"""

from __future__ import annotations

from typing import Any

import torch

from genlm_hf.host_memory import drop_pages

__all__ = ["PackedLinear", "pack_linears", "packing_problem", "unpack_linears"]

#: dtypes whose CPU linear layers are packed
PACKED_DTYPES = (torch.float32, torch.bfloat16)


class PackedLinear(torch.nn.Module):
    """``y = x W^T + b`` over a weight packed for oneDNN (see the module doc)."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        transposed: bool = False,
        tied: torch.nn.Parameter | None = None,
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        #: the weight in oneDNN's blocked layout (an opaque mkldnn tensor, not a parameter)
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), None)
        self.bias = None if bias is None else bias.detach()
        #: the layer it replaced stored ``W^T`` (transformers' ``Conv1D``)
        self.transposed = transposed
        #: the parameter the replaced layer shared with another module (a head tied to the
        #: input embedding), which it shares again once unpacked
        self.tied = tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def dense_weight(self) -> torch.Tensor:
        """The weight in the dense layout of the layer it replaced (``(out, in)``, or
        ``(in, out)`` for a ``Conv1D``)."""
        w = self.packed.to_dense()
        return w.t().contiguous() if self.transposed else w

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
        )


def _conv1d_class() -> type | None:
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # pragma: no cover - every transformers 5 has it
        return None
    return Conv1D


def packing_problem(model: Any) -> str | None:
    """Why ``model``'s linear layers cannot be packed here, or None."""
    device = torch.device(model.device)
    if device.type != "cpu":
        return f"the model runs on {device.type}, not the CPU"
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    if dtype not in PACKED_DTYPES:
        return f"the model computes in {dtype}, not float32 or bfloat16"
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return "this torch has no oneDNN linear operators"
    try:
        gen = torch.Generator().manual_seed(0)
        w = torch.randn(48, 64, generator=gen).to(dtype)
        x = torch.randn(5, 64, generator=gen).to(dtype)
        got = PackedLinear(w, None)(x).float()
        want = torch.nn.functional.linear(x.float(), w.float())
    except Exception as exc:  # noqa: BLE001 - any failure of the operators: keep MKL
        return f"oneDNN's linear failed here ({exc!r})"
    # 64 products of |x w| ~ 1: float32 rounding is ~1e-5 of the sum, bfloat16's ~1e-2 of it
    tol = 1e-4 if dtype == torch.float32 else 0.1
    scale = float(want.abs().max()) + 1.0
    if not float((got - want).abs().max()) <= tol * scale:
        return "oneDNN's linear disagreed with torch.nn.functional.linear here"
    return None


def pack_linears(model: Any) -> int:
    """Swap the model's plain linear layers for :class:`PackedLinear` (see the module
    doc); returns how many were packed. Call only when :func:`packing_problem` is None."""
    conv1d = _conv1d_class()
    owners: dict[int, int] = {}  # id of a weight -> the modules holding it
    for module in model.modules():
        for p in module.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1
    found = [
        (parent, name)
        for parent in model.modules()
        for name, child in parent.named_children()
        if type(child) is torch.nn.Linear or (conv1d is not None and type(child) is conv1d)
    ]
    mapped = _checkpoint_mappings()
    for parent, name in found:  # one at a time: the dense weight goes as its packed one comes
        child = getattr(parent, name)
        linear = type(child) is torch.nn.Linear
        w = child.weight
        tied = w if owners.get(id(w), 0) > 1 else None
        setattr(
            parent, name, PackedLinear(w if linear else w.t(), child.bias, transposed=not linear, tied=tied)
        )
        # packing read every page of the weight: those of a mapped checkpoint go back to the
        # OS (a tied embedding's too: a lookup reads a few rows, which the kernel reads
        # again from the file)
        _drop_file_pages(w, mapped)
        del child, w
    return len(found)


def _checkpoint_mappings() -> list[tuple[int, int]]:
    """The address ranges of the safetensors files this process maps (Linux; none elsewhere)."""
    try:
        with open("/proc/self/maps") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[1].endswith("p") and parts[5].endswith(".safetensors"):
            lo, hi = parts[0].split("-")
            out.append((int(lo, 16), int(hi, 16)))
    return out


def _drop_file_pages(weight: torch.Tensor, mapped: list[tuple[int, int]]) -> None:
    """Give the OS back the pages of a packed layer's dense weight when they are pages of a
    mapped checkpoint (transformers maps safetensors files, and the mapping lives while any
    of its tensors does - the embedding, the norms: without this, every packed weight would
    stay resident twice). They are pages of a private, unmodified file mapping, which the
    kernel reads again from the file if anything touches them."""
    if not mapped or weight.device.type != "cpu":
        return
    start = weight.data_ptr()
    end = start + weight.numel() * weight.element_size()
    if any(lo <= start and end <= hi for lo, hi in mapped):
        drop_pages(start, end)


def unpack_linears(model: Any) -> int:
    """Swap every :class:`PackedLinear` of the model back for the layer it replaced, with
    the same weights; returns how many."""
    conv1d = _conv1d_class()
    swaps = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if isinstance(child, PackedLinear):
                weight = (
                    child.tied
                    if child.tied is not None
                    else torch.nn.Parameter(child.dense_weight(), requires_grad=False)
                )
                if child.transposed and conv1d is not None:
                    layer: torch.nn.Module = conv1d(child.out_features, child.in_features)
                else:
                    layer = torch.nn.Linear(
                        child.in_features, child.out_features, bias=child.bias is not None
                    )
                layer = layer.to(dtype=weight.dtype)
                layer.weight = weight
                if child.bias is not None:
                    layer.bias = torch.nn.Parameter(child.bias, requires_grad=False)
                swaps.append((parent, name, layer))
    for parent, name, layer in swaps:
        setattr(parent, name, layer)
    return len(swaps)
