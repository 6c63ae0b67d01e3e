"""Eager passes over the KV pool: which rows share a pass, and one pass.

Each row of a pass is a context whose first ``depth`` columns the pool holds already (a
:class:`~genlm_hf.pool.KVSeq` forked from a kept one) and whose ``ctx[depth:]`` the model
runs now. :func:`run_pass` lays the rows out for :class:`~genlm_hf.attention.PoolPass`:

* new tokens right-padded to the longest suffix ``S``; position ids count each row's
  real tokens (``depth + j``); padded positions write and read the pool's pad slot;
* rows whose first pages are the same page ids share a span (:func:`shared_spans`): the
  columns all of them hold in those pages, read once for the group; one row whose kept
  past is long gets a span of its own (read as a view of the pool where its pages lie in
  order, not gathered);
* the rest of each row's columns (past the span, its new tokens included) are its
  private columns, gathered and masked per row.

Only the rows' last real positions go through the LM head where the model takes
``logits_to_keep``.

A pass right-pads every row's new tokens to the longest: ``n`` rows whose longest suffix
is ``S`` tokens cost ``n x S`` token positions, however few of them are real. Most calls
are even (a step's particles each run one token), but a call that mixes a few long
suffixes with many one-token rows (a prompt joining running particles) pads every row to
the long ones. :func:`pass_groups` splits such a call into passes of rows of similar
suffix length, the split that minimises the padded positions plus :data:`PASS_COST`
positions for each pass (a pass's fixed cost: every weight read, every kernel launched).

A model the pool cannot hold (:func:`kv_layout_problem`, :func:`pool_self_check`) runs each call's contexts whole in one
padded batch of its own forward (:func:`run_plain`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from genlm_hf.attention import PoolPass, SharedSpan, use_pool_attention
from genlm_hf.cache_names import output_cache
from genlm_hf.pool import PAD_SLOT, KVLayout, KVPool, KVSeq

__all__ = [
    "MIN_SPAN",
    "PASS_COST",
    "Layout",
    "PassRow",
    "device_ints",
    "extend_rows",
    "lay_out",
    "output_positions",
    "pass_groups",
    "kv_layout_problem",
    "pool_self_check",
    "probe_layout",
    "run_pass",
    "run_plain",
    "shared_spans",
    "span_of",
]

#: the fewest columns read as a shared span (shorter common prefixes are read per row)
MIN_SPAN = 32


@dataclass
class PassRow:
    """A context to run: ``seq`` holds its first ``depth`` columns before the pass, and
    all of them after it."""

    ctx: tuple[int, ...]
    depth: int
    #: None until the row forks its kept prefix (when its pass comes), and once it gave it back
    seq: KVSeq | None
    #: slots of the new columns (filled by :func:`run_pass`)
    new: list[int] = field(default_factory=list)
    #: the lengths of the prefixes of ``ctx`` (past ``depth``) whose logits the pass also
    #: hands back, before the row's own (contexts read off this row: genlm_core.engine.call_plan)
    read_off: list[int] = field(default_factory=list)
    #: whether the call asked for ``ctx`` itself (else a branch point, run for its KV)
    wanted: bool = True

    def release_fork(self) -> None:
        """Give back the row's pages (the prefix cache keeps its own references)."""
        if self.seq is not None:
            self.seq.release()
            self.seq = None

    @property
    def suffix(self) -> int:
        return len(self.ctx) - self.depth


def device_ints(values: list[Any], device: Any) -> torch.Tensor:
    """``values`` (ints, or lists of ints) as an int64 tensor on ``device``, copied without
    waiting for the device (from pageable memory the copy stages the bytes at once and
    queues behind the device's work)."""
    return torch.tensor(values, dtype=torch.long).to(device, non_blocking=True)


def shared_spans(rows: list[PassRow], page: int, min_span: int = MIN_SPAN) -> list[tuple[list[int], int]]:
    """The groups of rows that read a span, and the span's length: rows whose kept pasts
    begin with the same page, the span being the columns every row of the group holds in
    the pages they all have in common (at least ``min_span``)."""
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        if r.depth >= min_span:
            groups.setdefault(r.seq.pages[0], []).append(i)
    out = []
    for members in groups.values():
        ref = rows[members[0]].seq.pages
        common = len(ref)
        for m in members[1:]:
            pages = rows[m].seq.pages
            n = min(common, len(pages))
            k = 0
            while k < n and pages[k] == ref[k]:
                k += 1
            common = k
        length = min(common * page, min(rows[m].depth for m in members))
        if length >= min_span:
            out.append((members, length))
    return out


@dataclass
class Layout:
    """Where each row of a pass reads its columns: ``spans`` (the rows of each group and
    the span's length), ``shared[i]`` the span columns row ``i`` reads, ``private[i]`` the
    slots of its other columns (its new ones included)."""

    spans: list[tuple[list[int], int]]
    shared: list[int]
    private: list[list[int]]

    @property
    def width(self) -> int:
        """The most private columns of a row."""
        return max(map(len, self.private))


def extend_rows(rows: list[PassRow]) -> None:
    """Room in the pool for every row's new columns (``row.new``: their slots). The pool
    must have it (``KVPool.reserve``)."""
    for r in rows:
        if r.suffix < 1:
            raise ValueError("every row needs at least one uncached token")
        r.new = r.seq.extend(r.suffix)


def lay_out(rows: list[PassRow], page: int, min_span: int = MIN_SPAN, max_spans: int | None = None) -> Layout:
    """The rows' :class:`Layout` (after :func:`extend_rows`): the groups of
    :func:`shared_spans` (the ``max_spans`` reading the most columns, when bounded)."""
    spans = shared_spans(rows, page, min_span)
    if max_spans is not None:
        spans = sorted(spans, key=lambda g: -len(g[0]) * g[1])[:max_spans]
    shared = [0] * len(rows)
    for members, length in spans:
        for m in members:
            shared[m] = length
    private = [r.seq.slots(shared[i], r.seq.length) for i, r in enumerate(rows)]
    return Layout(spans, shared, private)


def span_of(rows: list[PassRow], members: list[int], length: int, page: int, device: Any) -> SharedSpan:
    """The :class:`SharedSpan` of a group: a view of the pool where its pages lie in order,
    else its slots."""
    pages = rows[members[0]].seq.pages[: (length + page - 1) // page]
    span = SharedSpan(device_ints(members, device), length)
    if all(pages[i] == pages[0] + i for i in range(len(pages))):
        span.start = pages[0] * page
    else:
        span.slots = device_ints(rows[members[0]].seq.slots(0, length), device)
    return span


def run_pass(
    model: Any,
    pool: KVPool,
    rows: list[PassRow],
    layout: Layout,
    *,
    pad_id: int,
    logits_to_keep: bool,
) -> torch.Tensor:
    """Run every row's new tokens (extended and laid out): the rows' next-token logits
    ``(B, V')``."""
    device = pool.layout.device
    B = len(rows)
    S = max(r.suffix for r in rows)
    spans = [span_of(rows, members, length, pool.page, device) for members, length in layout.spans]
    U = layout.width
    ids, pos, write, flat = [], [], [], []
    for r, cols in zip(rows, layout.private):
        s, d = r.suffix, r.depth
        ids.append(list(r.ctx[d:]) + [pad_id] * (S - s))
        pos.append(list(range(d, d + s)) + [d + s - 1] * (S - s))
        write += r.new + [PAD_SLOT] * (S - s)
        flat += cols + [PAD_SLOT] * (U - len(cols))
    # mask [B, 1, S, U]: private column u of row i is the row's column shared[i] + u; query j
    # sits at column depth + j (a padded query repeats the last real one)
    width = torch.tensor([len(c) for c in layout.private])
    first = torch.tensor(layout.shared)
    depth = torch.tensor([r.depth for r in rows])
    suffix = torch.tensor([r.suffix for r in rows])
    u = torch.arange(U)
    qcol = depth[:, None] + torch.minimum(torch.arange(S)[None, :], suffix[:, None] - 1)  # [B, S]
    kcol = first[:, None] + u[None, :]  # [B, U]
    allowed = (u[None, None, :] < width[:, None, None]) & (kcol[:, None, :] <= qcol[:, :, None])
    mask = torch.zeros(allowed.shape, dtype=torch.float32).masked_fill_(~allowed, float("-inf"))
    run = PoolPass(
        pool,
        write=device_ints(write, device),
        private=device_ints(flat, device),
        mask=mask.unsqueeze(1).to(device, non_blocking=True),
        shared=spans,
    )
    kwargs: dict[str, Any] = {
        "input_ids": device_ints(ids, device),
        "position_ids": device_ints(pos, device),
        "use_cache": False,
    }
    if any(r.read_off for r in rows):
        return _run_with_read_offs(model, run, rows, kwargs, pool.layout.layers)
    last = [r.suffix - 1 for r in rows]
    cols = last
    if logits_to_keep:  # only the rows' last positions go through the LM head
        keep = sorted(set(last))
        if keep == [S - 1]:
            kwargs["logits_to_keep"] = 1
            cols = [0] * B
        else:
            kwargs["logits_to_keep"] = device_ints(keep, device)
            where = {k: j for j, k in enumerate(keep)}
            cols = [where[c] for c in last]
    with use_pool_attention(model, run, pool.layout.layers):
        logits = model(**kwargs).logits
    if logits.shape[1] == 1:
        return logits[:, 0]
    return logits[torch.arange(B, device=logits.device), device_ints(cols, logits.device)]


def output_positions(rows: list[PassRow]) -> tuple[list[int], list[int]]:
    """The (row, position) of every logits row a pass hands back: each row's read-off
    prefixes (shortest first), then the row itself."""
    which, where = [], []
    for i, r in enumerate(rows):
        for n in [*r.read_off, len(r.ctx)]:
            if not r.depth < n <= len(r.ctx):
                raise ValueError(f"a prefix of {n} tokens is not run by a row from column {r.depth}")
            which.append(i)
            where.append(n - 1 - r.depth)
    return which, where


def _run_with_read_offs(
    model: Any, run: PoolPass, rows: list[PassRow], kwargs: dict[str, Any], layers: int
) -> torch.Tensor:
    """A pass that hands back several positions of some rows: the hidden states of exactly
    those positions go through the LM head (a hook on its input), not every position of
    every row."""
    which, where = output_positions(rows)
    device = kwargs["input_ids"].device
    rows_at, cols_at = device_ints(which, device), device_ints(where, device)
    head = model.get_output_embeddings()
    if head is None:  # no LM head module to gather before: every position's logits
        with use_pool_attention(model, run, layers):
            logits = model(**kwargs).logits
        return logits[rows_at.to(logits.device), cols_at.to(logits.device)]

    def gather(_module: Any, args: tuple[Any, ...]) -> tuple[Any, ...]:
        hidden = args[0]
        return (hidden[rows_at, cols_at].unsqueeze(0), *args[1:])

    if "logits_to_keep" in _forward_parameters(model):
        kwargs["logits_to_keep"] = 0  # every position reaches the hook, which keeps the wanted ones
    handle = head.register_forward_pre_hook(gather)
    try:
        with use_pool_attention(model, run, layers):
            logits = model(**kwargs).logits
    finally:
        handle.remove()
    return logits[0]


def _forward_parameters(model: Any) -> Any:
    import inspect

    return inspect.signature(model.forward).parameters


def probe_layout(model: Any, pad_id: int) -> KVLayout:
    """The model's KV layout, read from the cache of a one-token pass (whatever the
    architecture names its heads)."""
    device = model.device
    with torch.inference_mode():
        cache = output_cache(
            model(input_ids=torch.full((1, 1), pad_id, dtype=torch.long, device=device), use_cache=True)
        )
    keys = cache.layers[0].keys
    return KVLayout(len(cache.layers), keys.shape[1], keys.shape[3], keys.dtype, keys.device)


def supports_kv_reuse(model: Any) -> bool:
    """Whether every layer caches plain full-attention KV (no sliding window, no recurrent state)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    if getattr(model.config, "is_encoder_decoder", False):
        return False
    try:
        cache = DynamicCache(config=model.config)
    except Exception:  # noqa: BLE001 - unusual configs: run without KV reuse
        return False
    return bool(cache.layers) and all(type(layer) is DynamicLayer for layer in cache.layers)


def kv_layout_problem(model: Any) -> str | None:
    """Why ``model``'s KV cannot live in the pool (None: it can): its cache must be plain
    full-attention KV. A property of the architecture: such a model runs every call whole."""
    if not supports_kv_reuse(model):
        return "its cache is not plain full-attention KV (sliding window, recurrent state or encoder-decoder)"
    return None


def pool_self_check(model: Any, pad_id: int) -> str | None:
    """Why a pass over the pool does not give ``model``'s own row (None: it does): a
    3-token context computed as 2 tokens, then 1 more over their kept columns, against one
    uncached pass. A guard against an attention the pool does not implement (a layer that
    does not go through transformers' attention interface, a new transformers release),
    loose enough for any dtype's rounding: a failure is a bug, never rounding."""
    try:
        layout = probe_layout(model, pad_id)
        pool = KVPool(layout, None)
        ctx = (pad_id, pad_id, pad_id)
        first = PassRow(ctx[:2], 0, KVSeq(pool))
        with torch.inference_mode():
            extend_rows([first])
            run_pass(model, pool, [first], lay_out([first], pool.page), pad_id=pad_id, logits_to_keep=False)
            second = PassRow(ctx, 2, first.seq.fork())  # type: ignore[union-attr]
            extend_rows([second])
            got = run_pass(
                model, pool, [second], lay_out([second], pool.page), pad_id=pad_id, logits_to_keep=False
            )
            ids = torch.tensor([list(ctx)], device=layout.device)
            want = model(input_ids=ids, use_cache=False).logits[0, -1]
    except Exception as exc:  # noqa: BLE001 - an attention the pool cannot take
        return f"a pass over the KV pool raised {type(exc).__name__}: {exc}"
    got, want = got[0].float(), want.float()
    off = float((got - want).abs().max())
    if not off <= 0.1 * (1.0 + float(want.abs().max())):
        return f"a pass over the KV pool gave logits {off:.3g} away from the model's own forward"
    return None


def run_plain(
    model: Any, contexts: Sequence[tuple[int, ...]], *, pad_id: int, logits_to_keep: bool
) -> torch.Tensor:
    """The next-token logits of ``contexts`` run whole, right-padded in one batch of the
    model's own forward (its attention mask hides the padding; positions count from 0)."""
    device = model.device
    n = max(map(len, contexts))
    ids = [list(c) + [pad_id] * (n - len(c)) for c in contexts]
    mask = [[1] * len(c) + [0] * (n - len(c)) for c in contexts]
    kwargs: dict[str, Any] = {"use_cache": False}
    logits = model(
        input_ids=device_ints(ids, device), attention_mask=device_ints(mask, device), **kwargs
    ).logits
    last = device_ints([len(c) - 1 for c in contexts], logits.device)
    return logits[torch.arange(len(contexts), device=logits.device), last]


#: the fixed cost of one more pass, in token positions: a split must save more padding
#: than this. On the CPU a pass of SmolLM2-135M costs about 20 rows' worth of compute
#: (16 and 64 one-token rows: 77 and 182 ms) and on a GPU an eager pass's launches cost
#: far more than a position; 512 splits only where padding clearly dominates
PASS_COST = 512


def pass_groups(suffixes: Sequence[int], pass_cost: int = PASS_COST) -> list[list[int]]:
    """The rows (indices into ``suffixes``, each row's number of new tokens) of each pass:
    ``[list(range(n))]`` (one pass, the call's order; none without rows) unless splitting saves more padded
    positions than ``pass_cost`` a pass. Groups are contiguous in suffix order (an optimal
    split always is: the rows of one pass cost its longest suffix each), longest last."""
    n = len(suffixes)
    if n == 0:
        return []  # no rows, no pass
    if n < 2 or n * max(suffixes) - sum(suffixes) <= pass_cost:
        return [list(range(n))]
    order = sorted(range(n), key=lambda i: suffixes[i])
    s = [suffixes[i] for i in order]
    # best[k]: the least cost of the k shortest rows; cut[k]: where its last pass starts
    best = [0] * (n + 1)
    cut = [0] * (n + 1)
    for k in range(1, n + 1):
        best[k], cut[k] = min((best[j] + pass_cost + (k - j) * s[k - 1], j) for j in range(k))
    groups = []
    k = n
    while k:
        groups.append(order[cut[k] : k])
        k = cut[k]
    groups.reverse()
    return groups if len(groups) > 1 else [list(range(n))]
