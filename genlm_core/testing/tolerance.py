"""How far two computations of one next-token row may differ: a bound derived from the
arithmetic, the same on every CPU and GPU.

Two paths through the same network (batched or alone, cached KV or a fresh prefill, a
decode kernel or a prefill kernel, another engine) compute the same real numbers and
differ only in how their floating-point sums are ordered and rounded. Which order a
machine takes depends on its SIMD width (AVX2, AVX-512, AMX), its thread count and its
kernels (CUDA), so the bound must not come from what one machine showed.

The model of the error (Higham & Mary's probabilistic rounding analysis: a sum of ``n``
terms rounded at unit roundoff ``u`` is off by at most ``lam * sqrt(n) * u`` times the
sum of the terms' magnitudes, except with probability ``2 exp(-lam^2 / 2)``), applied to
a network of ``layers`` blocks whose widest dot product has ``width`` terms:

* a row of logits passes ``depth = 6 * layers + 3`` sequential reductions (per block:
  the q/k/v projections, the attention scores, their weighted sum, the output
  projection, the MLP's two products; then the final norm, the head, the log-softmax),
  each rounded independently, so their errors add in quadrature;
* each is a dot product of at most ``width`` terms accumulated at ``u_acc`` (float32:
  every engine here accumulates 16-bit products in float32), and its result is stored at
  ``u_store`` (the dtype the rows are computed in);
* errors are relative to the size of the values: ``magnitude`` is the largest finite
  ``|logprob|`` of the row (logits spread over that range; at least 1).

So one path is within ``lam * magnitude * (u_store * sqrt(depth) + u_acc * sqrt(width *
depth))`` of the exact row, and two paths within the sum of their two bounds. ``lam`` is
4 (a sum is outside its bound with probability 7e-4; a row is outside only if the
whole chain is, far rarer). On the tiny test models (width 256, 2 layers) in float32 this
is 1.6e-5 per unit of magnitude per path: 4.7e-4 for two paths over a 15-nat row, against
1.4e-5 measured on AVX-512 and 1.0e-5 on an H100, the largest differences seen anywhere.

That bound holds each entry of a row (the tail included: the largest difference is
usually on an unlikely token). It cannot see a small error that every row shares: in
bfloat16 two correct paths may differ by a fifth of a nat on a row's tail, and so may a
path that scales every row's logits by 1.03. What tells them apart is the sign: rounding
errors are zero-mean and independent from one context to the next (the model's premise
above), a wrong scale moves every row the same way. So :func:`assert_rows_close` also
measures the rows' common logit scale, :func:`logit_scale`: the least-squares ``T`` with
``got - want ~ T * (want - its mean)`` where the probability mass is (weights
``exp(want)``), pooled over the distinct rows compared. A path's rounding moves one
row's scale by at most its relative error, ``u_store * sqrt(depth) + u_acc *
sqrt(width * depth)`` (:meth:`ModelShape.relative_error`: the bound above per unit of
magnitude, one standard deviation), so ``T`` of ``n`` independent rows is within
:func:`scale_bound` ``= lam * (e_1 + e_2) / sqrt(n)`` of 0, while a scale ``s`` gives
``T = s - 1`` whatever ``n``. docs/numerics.md derives both and lists what each catches.

Every comparison goes through :func:`assert_rows_close`, which records ``measured /
bound``. The worst ratios are listed at the end of a pytest run (the kit's plugin), and
``GENLM_TEST_HEADROOM=k`` makes every comparison require ``measured <= bound / k``: the
test command's second pass (another SIMD path, scripts/isa_env.sh) sets it, so a bound
that holds on one machine only by a small margin - which another machine's rounding may
cross - fails on every machine.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "UNIT_ROUNDOFF",
    "BoundExceeded",
    "ModelShape",
    "RowComparisons",
    "assert_backend_close",
    "assert_rows_close",
    "assert_tiny_close",
    "assert_within",
    "headroom",
    "logit_scale",
    "measuring",
    "model_shape",
    "row_atol",
    "row_diff",
    "row_magnitude",
    "row_spread_error",
    "rows_to_resolve",
    "scale_bound",
    "spread_bound",
    "tiny_shape",
]

#: unit roundoff (half an ulp of 1) of each dtype rows are computed in
UNIT_ROUNDOFF: dict[str, float] = {
    "float64": 2.0**-53,
    "float32": 2.0**-24,
    "float16": 2.0**-11,
    "bfloat16": 2.0**-8,
}
#: accumulation precision of dot products (float32 for every engine we test, 16-bit
#: products included)
U_ACC = UNIT_ROUNDOFF["float32"]
#: standard deviations of the probabilistic bound
LAM = 4.0


@dataclass(frozen=True)
class ModelShape:
    """What the bound needs of a network: its widest dot product and its block count.

    ``width`` 1 and ``layers`` 0 describe an exact table (a mock): no reduction at all."""

    width: int
    layers: int

    @property
    def depth(self) -> int:
        return 6 * self.layers + 3 if self.layers else 1

    def relative_error(self, dtype: str) -> float:
        """One computation's relative error in ``dtype``, one standard deviation: ``u_store
        * sqrt(depth) + u_acc * sqrt(width * depth)`` (the chain of rounded reductions)."""
        try:
            u_store = UNIT_ROUNDOFF[str(dtype).removeprefix("torch.")]
        except KeyError:
            raise ValueError(
                f"no unit roundoff known for dtype {dtype!r}; use one of {list(UNIT_ROUNDOFF)}"
            ) from None
        u_acc = min(U_ACC, u_store)  # float64 accumulates in float64
        return u_store * math.sqrt(self.depth) + u_acc * math.sqrt(self.width * self.depth)

    def one_path(self, dtype: str, magnitude: float) -> float:
        """How far one computation of a row in ``dtype`` can be from the exact row."""
        return LAM * max(float(magnitude), 1.0) * self.relative_error(dtype)


def _from_config(cfg: dict[str, Any]) -> ModelShape | None:
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    hidden = text.get("hidden_size") or text.get("n_embd") or text.get("d_model")
    layers = text.get("num_hidden_layers") or text.get("n_layer") or text.get("num_layers")
    if not hidden or not layers:
        return None
    inner = text.get("intermediate_size") or text.get("n_inner") or 4 * int(hidden)
    return ModelShape(width=max(int(hidden), int(inner)), layers=int(layers))


def _from_gguf(path: Path) -> ModelShape | None:
    from genlm_core.engine.gguf_metadata import read_gguf_metadata

    meta = read_gguf_metadata(path)
    arch = meta.architecture
    hidden = meta.get(f"{arch}.embedding_length")
    layers = meta.get(f"{arch}.block_count")
    if not hidden or not layers:
        return None
    inner = meta.get(f"{arch}.feed_forward_length") or 4 * int(hidden)
    return ModelShape(width=max(int(hidden), int(inner)), layers=int(layers))


def model_shape(source: Any) -> ModelShape:
    """The shape of a model: a :class:`ModelShape`, a model folder (its ``config.json``),
    a GGUF file, or a backend (its checkpoint, found as the conformance kit finds it;
    a backend that reads no model is an exact table). Raises ``ValueError`` naming what
    to pass when the shape cannot be read."""
    if isinstance(source, ModelShape):
        return source
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        shape = None
        if path.is_dir() and (path / "config.json").is_file():
            shape = _from_config(json.loads((path / "config.json").read_text()))
        elif path.is_file() and path.suffix == ".gguf":
            shape = _from_gguf(path)
        if shape is None:
            raise ValueError(
                f"cannot read a model's width and layer count from {str(path)!r}: pass a folder with "
                "a config.json, a .gguf file, or ModelShape(width=..., layers=...)"
            )
        return shape
    from genlm_core.testing.checkpoints import find_checkpoint

    found = find_checkpoint(source)
    if found.kind == "none":
        return ModelShape(width=1, layers=0)
    if found.path is None:
        raise ValueError(
            f"the checkpoint of {type(source).__name__} has no path ({found.why}): pass ModelShape(...)"
        )
    return model_shape(found.path)


def row_atol(shape: Any, magnitude: float, dtype: str = "float32", other_dtype: str | None = None) -> float:
    """The largest ``|a - b|`` between two computations of one row of logprobs whose
    largest finite ``|value|`` is ``magnitude``: one in ``dtype``, the other in
    ``other_dtype`` (default: the same), on a model of :func:`model_shape` ``shape``."""
    s = model_shape(shape)
    return s.one_path(dtype, magnitude) + s.one_path(other_dtype or dtype, magnitude)


def headroom() -> float:
    """The factor every comparison must stay below its bound by (``GENLM_TEST_HEADROOM``,
    default 1)."""
    raw = os.environ.get("GENLM_TEST_HEADROOM", "1")
    try:
        k = float(raw)
    except ValueError:
        raise ValueError(f"GENLM_TEST_HEADROOM must be a number >= 1, got {raw!r}") from None
    if not k >= 1:
        raise ValueError(f"GENLM_TEST_HEADROOM must be a number >= 1, got {raw!r}")
    return k


#: (test id, what, measured, bound) of every comparison of this process that held
RECORDED: list[tuple[str, str, float, float]] = []


class BoundExceeded(AssertionError):
    """A comparison of rows that failed: ``measured`` against ``bound`` (``what`` says
    which comparison and which statistic)."""

    def __init__(self, message: str, measured: float, bound: float, what: str) -> None:
        super().__init__(message)
        self.measured, self.bound, self.what = float(measured), float(bound), what

    @property
    def ratio(self) -> float:
        """``measured / bound`` (inf for a NaN or a zero bound)."""
        if math.isnan(self.measured) or self.bound <= 0:
            return math.inf
        return self.measured / self.bound


#: where :func:`measuring` collects comparisons instead of failing them (None: off)
_MEASURING: list[tuple[str, float, float]] | None = None


@contextlib.contextmanager
def measuring() -> Iterator[list[tuple[str, float, float]]]:
    """Inside the block no comparison fails: each is appended to the list yielded as
    ``(what, measured, bound)`` (a check then runs to its end; the defect catalogue's
    figures, :mod:`genlm_core.testing.defects`, are the largest ratios so seen)."""
    global _MEASURING
    outer, _MEASURING = _MEASURING, []
    try:
        yield _MEASURING
    finally:
        _MEASURING = outer


def assert_within(measured: float, bound: float, what: str, *, statistical: bool = False) -> float:
    """Record ``measured`` against ``bound`` and fail (:class:`BoundExceeded`) when it
    exceeds ``bound / headroom()``; a ``statistical`` bound (``lam`` standard deviations of
    a statistic whose correct values are about one: :func:`row_spread_error`) is held as
    it is, a headroom being no margin it can keep. Returns ``measured``."""
    if _MEASURING is not None:
        _MEASURING.append((what, float(measured), float(bound)))
        return float(measured)
    limit = bound if statistical else bound / headroom()
    if not measured <= limit:  # NaN fails too
        extra = "" if limit == bound else f" (the bound {bound:.3g} over headroom {headroom():g})"
        raise BoundExceeded(f"{what}: differs by {measured:.3g} > {limit:.3g}{extra}", measured, bound, what)
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
    RECORDED.append((test, what, float(measured), float(bound)))  # the comparisons that held
    return float(measured)


def row_magnitude(rows: Any) -> float:
    import torch

    finite = rows[torch.isfinite(rows)]
    return float(finite.abs().max()) if finite.numel() else 1.0


def row_diff(got: Any, want: Any, what: str = "rows") -> float:
    """The largest ``|got - want|`` over two (stacks of) rows, ``-inf`` matching ``-inf``
    only; NaN anywhere gives NaN (which fails every bound)."""
    import torch

    a = torch.as_tensor(got).detach().double().cpu()
    b = torch.as_tensor(want).detach().double().cpu()
    if a.shape != b.shape:
        raise AssertionError(f"{what}: shapes differ, {tuple(a.shape)} vs {tuple(b.shape)}")
    if a.isnan().any() or b.isnan().any():
        return math.nan
    inf_a, inf_b = torch.isneginf(a), torch.isneginf(b)
    if not torch.equal(inf_a, inf_b):
        raise AssertionError(f"{what}: -inf at different entries ({int((inf_a ^ inf_b).sum())} of them)")
    fin = ~inf_a
    return float((a[fin] - b[fin]).abs().max()) if bool(fin.any()) else 0.0


def logit_scale(got: Any, want: Any) -> tuple[float, float]:
    """``(T, n)``: the common logit scale of ``got`` against ``want`` (two rows or two
    stacks of rows of logprobs) and the number of independent rows it pools.

    Each row ``r`` of ``want`` gives its probability mass ``p = softmax(want_r)`` and its
    centred log-probabilities ``z = want_r - E_p[want_r]``; the difference ``d = got_r -
    want_r``, centred alike, has the least-squares scale ``t_r = E_p[d z] / E_p[z z]``
    (``got_r`` is ``want_r`` at logit scale ``1 + t_r``, up to normalisation). ``T`` pools
    them, each row weighted by ``v_r = E_p[z z]``: ``T = sum E_p[d z] / sum v_r``, and
    ``n = (sum v_r)^2 / sum v_r^2`` (the number of rows for equal weights). A row repeated
    with the same two values counts once; ``-inf`` entries of ``want`` (masked tokens)
    carry no mass. ``(0.0, 0.0)`` when no row has any spread."""
    import torch

    a = torch.as_tensor(got).detach().to("cpu", torch.float64)
    b = torch.as_tensor(want).detach().to("cpu", torch.float64)
    if a.shape != b.shape:
        raise AssertionError(f"shapes differ, {tuple(a.shape)} vs {tuple(b.shape)}")
    a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    seen: set[tuple[bytes, bytes]] = set()
    keep = []
    for i in range(b.shape[0]):  # a repeated row is one row, not n independent ones
        key = (a[i].numpy().tobytes(), b[i].numpy().tobytes())
        if key not in seen:
            seen.add(key)
            keep.append(i)
    a, b = a[keep], b[keep]
    finite = torch.isfinite(b)
    p = torch.softmax(b.masked_fill(~finite, -math.inf), dim=-1)
    d = (a - b).masked_fill(~finite, 0.0)
    bz = b.masked_fill(~finite, 0.0)
    z = bz - (p * bz).sum(-1, keepdim=True)
    dc = d - (p * d).sum(-1, keepdim=True)
    v = (p * z * z).sum(-1)
    c = (p * dc * z).sum(-1)
    total = float(v.sum())
    if not total > 0:
        return 0.0, 0.0
    return float(c.sum()) / total, total**2 / float((v * v).sum())


def scale_bound(shape: Any, n: float, dtype: str = "float32", other_dtype: str | None = None) -> float:
    """How far :func:`logit_scale` ``T`` of ``n`` independent rows may be from 0 when both
    computations are right: ``lam * (e_1 + e_2) / sqrt(n)``, ``e`` each path's
    :meth:`ModelShape.relative_error` (a path's rounding rescales a row by at most its
    relative error; independent zero-mean errors average out as ``1 / sqrt(n)``)."""
    s = model_shape(shape)
    return LAM * (s.relative_error(dtype) + s.relative_error(other_dtype or dtype)) / math.sqrt(max(n, 1.0))


def rows_to_resolve(shape: Any, dtype: str = "float32", scale: float = 0.03, ratio: float = 2.0) -> int:
    """How many independent rows a comparison needs for a logit scale of ``1 + scale`` to
    be ``ratio`` times :func:`scale_bound` (two paths in ``dtype``): 65 for the tiny models
    in bfloat16 at 1.03, 2 in float16, 1 in float32."""
    per_row = scale_bound(shape, 1.0, dtype)
    return max(1, math.ceil((ratio * per_row / scale) ** 2))


def assert_rows_close(
    got: Any,
    want: Any,
    shape: Any,
    *,
    dtype: str = "float32",
    other_dtype: str | None = None,
    what: str = "rows",
) -> float:
    """Assert two (stacks of) logprob rows are within :func:`row_atol` of each other,
    the magnitude taken from ``want`` (every entry: the tail), and that their common logit
    scale :func:`logit_scale` is within :func:`scale_bound` of 0 (pooled over the rows
    given: compare the rows of a check together, as well as one by one). ``got`` is
    computed in ``dtype``, ``want`` in ``other_dtype`` (default: the same). Returns the
    largest difference."""
    import torch

    diff = row_diff(got, want, what)
    bound = row_atol(shape, row_magnitude(torch.as_tensor(want).double()), dtype, other_dtype)
    assert_within(diff, bound, what)
    t, n = logit_scale(got, want)
    if n > 0:
        rows = f"{n:.0f} row" + ("" if round(n) == 1 else "s")
        assert_within(
            abs(t), scale_bound(shape, n, dtype, other_dtype), f"{what} (logit scale 1{t:+.3g}, {rows})"
        )
    if other_dtype is None or other_dtype == dtype:  # one network: see row_spread_error
        spread, row = row_spread_error(got, want)
        assert_within(
            spread,
            spread_bound(shape, dtype),
            f"{what} (row {row}'s spread error {spread:.3g})",
            statistical=True,
        )
    return diff


def row_spread_error(got: Any, want: Any) -> tuple[float, int]:
    """``(e, i)``: the largest, over rows, of a row's RMS difference relative to the row's
    spread, and its row: ``sqrt(mean (d - mean d)^2) / sqrt(mean (w - mean w)^2)`` over
    the finite entries of ``want``'s row ``w`` (``d = got - want``; centring drops the
    normalisation constant). A path's rounding reaches the logits through the LM head as
    an error on the last hidden state of relative size :meth:`ModelShape.relative_error`
    (one standard deviation), which the head maps to an error of that size relative to
    the logits' spread, on every entry at once. So this root-mean-square of thousands of
    entries is a per-row statistic of one standard deviation, where :func:`row_diff`'s
    worst entry is bounded at the tail's magnitude: it sees a row that is wrong everywhere
    by a fraction of a nat in bfloat16 (one row of a batch: a wrong KV column, a
    neighbour's position), which the worst entry's bound (1.5 nats for the tiny models)
    and the pooled scale (zero mean) do not. Comparisons within one dtype only: two
    dtypes hold two networks (bfloat16 weights are not float32's), whose difference is
    no rounding of sums."""
    import torch

    a = torch.as_tensor(got).detach().to("cpu", torch.float64)
    b = torch.as_tensor(want).detach().to("cpu", torch.float64)
    a, b = a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1])
    worst, where = 0.0, 0
    for i in range(b.shape[0]):
        fin = torch.isfinite(b[i]) & torch.isfinite(a[i])
        if int(fin.sum()) < 2:
            continue
        d, w = a[i][fin] - b[i][fin], b[i][fin]
        spread = float((w - w.mean()).pow(2).mean().sqrt())
        if not spread > 0:
            continue
        e = float((d - d.mean()).pow(2).mean().sqrt()) / spread
        if not e <= worst:  # NaN included
            worst, where = e, i
            if math.isnan(e):
                break
    return worst, where


def spread_bound(shape: Any, dtype: str = "float32") -> float:
    """How far :func:`row_spread_error` may be from 0 for two correct computations in
    ``dtype``: ``lam * 2 * e``, ``e`` one path's :meth:`ModelShape.relative_error` (each
    path's error one standard deviation of its relative size; a 4-sigma bound on their sum)."""
    return LAM * 2 * model_shape(shape).relative_error(dtype)


class RowComparisons:
    """The rows of one check, compared as they come and together: :meth:`add` compares a
    row (``close(got, want, what)``, e.g. :func:`assert_rows_close` bound to a model) and,
    each time the count of rows reaches 8, 16, 32..., all of them so far (the common logit
    scale of many rows is resolved far finer than one row's, and a check that fails should
    fail early); :meth:`finish` compares all of them. A handful of looks at a 4-sigma
    bound adds nothing worth counting to its false alarms."""

    def __init__(self, close: Any, what: str) -> None:
        self.close, self.what = close, what
        self.pairs: list[tuple[Any, Any]] = []
        self._next = 8

    def add(self, got: Any, want: Any, what: str) -> None:
        self.close(got, want, what)
        self.pairs.append((got, want))
        if len(self.pairs) >= self._next:
            self._next *= 2
            self.finish(f" (the first {len(self.pairs)})")

    def finish(self, which: str = "") -> None:
        import torch

        if self.pairs:
            got, want = (torch.stack([p[i].detach().float().cpu() for p in self.pairs]) for i in (0, 1))
            self.close(got, want, self.what + which)


def assert_backend_close(llm: Any, got: Any, want: Any, what: str = "rows") -> float:
    """:func:`assert_rows_close` for two computations of rows by one backend ``llm``
    (batched / alone, cached / uncached, a decode step / a prefill): the bound for its
    model (:func:`model_shape` of its checkpoint) and its dtype."""
    return assert_rows_close(got, want, model_shape(llm), dtype=str(llm.dtype), what=what)


def tiny_shape() -> ModelShape:
    """The shape of the offline tiny test models (:mod:`genlm_core.models.tiny`: Llama and
    GPT-2 alike, MLP width 4x the hidden size)."""
    from genlm_core.models.tiny import TINY_HIDDEN, TINY_LAYERS

    return ModelShape(width=4 * TINY_HIDDEN, layers=TINY_LAYERS)


def assert_tiny_close(got: Any, want: Any, what: str = "rows", dtype: str = "float32") -> float:
    """:func:`assert_rows_close` for two float32 computations of a tiny test model's rows."""
    return assert_rows_close(got, want, tiny_shape(), dtype=dtype, what=what)
