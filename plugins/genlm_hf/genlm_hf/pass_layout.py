"""Where each row of a pass over the KV pool writes and reads its columns.

Each row of a pass is a context whose first ``depth`` columns the pool holds already (a
:class:`~genlm_hf.pool.KVSeq` forked from a kept one) and whose ``ctx[depth:]`` the model
runs now (:class:`PassRow`). Before the pass each row takes room for its new columns
(:func:`extend_rows`: their slots), then :func:`lay_out` says where every row reads:

* rows whose first pages are the same page ids share a span (:func:`shared_spans`): the
  columns all of them hold in those pages, read once for the group; one row whose kept
  past is long gets a span of its own;
* the rest of each row's columns (past the span, its new tokens included) are its
  private columns, gathered and masked per row.

Both passes read a :class:`Layout`: the eager pass (:mod:`genlm_hf.eager_pass`) and the
static step (:mod:`genlm_hf.step`, at most one span). Host-side lists only: no tensor is
made here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from genlm_hf.pool import KVSeq

__all__ = ["MIN_SPAN", "Layout", "PassRow", "extend_rows", "lay_out", "shared_spans"]

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


@dataclass
class Layout:
    """Where each row of a pass writes and reads its columns: ``new[i]`` the slots of row
    ``i``'s new columns (where the pass writes their KV), ``spans`` (the rows of each
    group and the span's length), ``shared[i]`` the span columns row ``i`` reads,
    ``private[i]`` the slots of its other columns (its new ones included)."""

    new: list[list[int]]
    spans: list[tuple[list[int], int]]
    shared: list[int]
    private: list[list[int]]

    @property
    def width(self) -> int:
        """The most private columns of a row."""
        return max(map(len, self.private))


def extend_rows(rows: list[PassRow]) -> list[list[int]]:
    """Room in the pool for every row's new columns: their slots, a list per row. The pool
    must have it (``KVPool.shortfall``: the core made room)."""
    new = []
    for r in rows:
        if r.suffix < 1:
            raise ValueError("every row needs at least one uncached token")
        new.append(r.seq.extend(r.suffix))
    return new


def shared_spans(rows: list[PassRow], min_span: int = MIN_SPAN) -> list[tuple[list[int], int]]:
    """The groups of rows that read a span, and the span's length: rows whose kept pasts
    begin with the same page, the span being the columns every row of the group holds in
    the pages they all have in common, within its kept past (at least ``min_span``)."""
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        if r.depth >= min_span:
            groups.setdefault(r.seq.pages[0], []).append(i)
    out = []
    for members in groups.values():
        first = rows[members[0]].seq
        common = first.shared_columns(rows[m].seq for m in members[1:])
        length = min(common, min(rows[m].depth for m in members))
        if length >= min_span:
            out.append((members, length))
    return out


def lay_out(
    rows: list[PassRow], new: list[list[int]], min_span: int = MIN_SPAN, max_spans: int | None = None
) -> Layout:
    """The :class:`Layout` of ``rows`` once extended (``new``: what :func:`extend_rows`
    returned for them): the groups of :func:`shared_spans` (the ``max_spans`` reading the
    most columns, when bounded)."""
    spans = shared_spans(rows, min_span)
    if max_spans is not None:
        spans = sorted(spans, key=lambda g: -len(g[0]) * g[1])[:max_spans]
    shared = [0] * len(rows)
    for members, length in spans:
        for m in members:
            shared[m] = length
    private = [r.seq.slots(shared[i], r.seq.length) for i, r in enumerate(rows)]
    return Layout(new, spans, shared, private)
