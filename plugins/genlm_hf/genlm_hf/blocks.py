"""The state of :mod:`genlm_hf.resident`'s live rows: the blocks they sit in, and one
call's plan of where each of its contexts runs and which row it takes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from genlm_core.engine.resident import ResidentRow
from genlm_hf.static import StaticSlot

__all__ = ["PENDING", "Block", "CallPlan"]


@dataclass(eq=False)
class Block:
    """A static slot of live rows: row ``i`` holds ``owners[i]``'s context (``None``: a
    free row) in columns ``[0, lengths[i])``."""

    slot: StaticSlot
    lengths: list[int]
    owners: list[ResidentRow | None]

    @property
    def rows(self) -> int:
        return self.slot.bucket[0]

    def free(self) -> list[int]:
        return [i for i, o in enumerate(self.owners) if o is None]


@dataclass
class CallPlan:
    """One call's bookkeeping: where each context's row comes from and runs."""

    #: placement index -> (block, row) of the contexts that run in a static step
    static: dict[int, tuple[Block, int]] = field(default_factory=dict)
    #: placement index -> (block, row) of eager contexts whose KV is copied into a row
    eager_rows: dict[int, tuple[Block, int]] = field(default_factory=dict)
    #: placement index -> (depth, payload) of the contexts run eagerly; the payload is a
    #: tensor, or a live row read when the context's pass runs
    eager: dict[int, tuple[int, Any]] = field(default_factory=dict)
    #: placement index -> where a joining context's KV is copied from (a live row, or a
    #: tensor), read when it is copied
    joins: dict[int, Any] = field(default_factory=dict)
    #: rows this call uses (never evicted by it)
    busy: set[int] = field(default_factory=set)
    #: id of a block -> how many of the call's continued rows it holds
    homes: dict[int, int] = field(default_factory=dict)
    #: continued rows moved to the call's home block: (placement index, from, to)
    moves: list[tuple[int, tuple[Block, int], tuple[Block, int]]] = field(default_factory=list)
    #: id of a row evicted while the call places its rows -> its KV
    evicted: dict[int, torch.Tensor] = field(default_factory=dict)


#: a row taken by a context of the running call (its owner is set at commit)
PENDING: Any = object()
