"""What passes between the core and an engine that resumes contexts from kept KV.

KV reuse runs one way. The core owns the prefix cache, its lookups, its budget and what
it releases (:mod:`genlm_core.engine.kv_calls`); the engine computes. An engine that can
resume a context from the KV state of a prefix declares the capability ``"resume"`` and:

* says once, when the backend takes it, how its KV is kept: :meth:`Engine.kv_policy
  <genlm_core.engine.contract.Engine.kv_policy>` returns a :class:`KVPolicy` (the budget,
  which kept contexts the core releases first, whether it reads nested contexts off a row);
* computes rows: :meth:`Engine.forward_rows <genlm_core.engine.contract.Engine.forward_rows>`
  receives :class:`ResumeRow` values (a context, the depth it resumes from and the
  engine's own payload for that depth, as the engine returned it before) and returns a
  :class:`RowsOut`: the rows' scores and the payloads of the contexts it computed, which
  the core keeps or hands back;
* may say what a payload costs (``kv_size``), which engine resource it reads
  (``kv_owner``), how to free such a resource (``release_kv``) and how much room a set of
  rows lacks (``kv_shortfall``): the core makes room by releasing kept contexts, by its
  own rule, before it hands the rows over.

The engine never reads the cache, never stores into it and never evicts from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["KVPolicy", "ResumeRow", "RowsOut"]

Context = tuple[int, ...]


@dataclass(frozen=True)
class KVPolicy:
    """How an engine's KV is kept, declared once (:meth:`Engine.kv_policy
    <genlm_core.engine.contract.Engine.kv_policy>`).

    Args:
        problem: why this model cannot resume from kept KV (recurrent or sliding-window
            layers), or None. Reuse asked for then warns and stays off.
        budget: the prefix cache's bound in the unit ``kv_size`` counts (None: no bound,
            the engine bounds its own memory and says so through ``kv_shortfall``; 0: keep
            nothing between calls).
        budget_option: the load() option that sets ``budget`` (named when it is too small).
        release: which kept contexts the core releases when the engine lacks room:
            ``"resident"`` (the default) the shared prompt and a fixed subset of particles
            stay, the youngest lineage goes first, leaves only, and a call's rows run oldest
            lineage first when they do not fit together
            (:mod:`genlm_core.engine.kv_resident`: the cost past the budget is bounded by
            its arithmetic); ``"lru"`` the least recently used; ``"leaves"`` the least
            recently used that no kept context extends (a prompt that particles share stays
            while they do: where a kept context reads its prefix's memory, releasing the
            prefix frees nothing). ``"lru"`` and ``"leaves"`` recompute every particle's
            tail each step once a call's rows run in parts (each part releases the
            others').
        read_off: the engine hands back the rows of contexts nested in a row's context
            (:attr:`ResumeRow.read_off`), so a call's nested contexts run once.
        branch_tokens: the fewest new tokens several contexts of a call must share for the
            core to run their common prefix first, once (None: never).
        drops_kv: a failed call or an uncached one leaves the engine with no KV at all (the
            core then forgets what it kept).
    """

    problem: str | None = None
    budget: int | None = None
    budget_option: str = "kv_cache_bytes"
    release: Literal["resident", "lru", "leaves"] = "resident"
    read_off: bool = False
    branch_tokens: int | None = None
    drops_kv: bool = False

    def __post_init__(self) -> None:
        if self.release not in ("resident", "lru", "leaves"):
            raise ValueError(f"KVPolicy.release is {self.release!r}: use 'resident', 'lru' or 'leaves'")
        if self.branch_tokens is not None and self.branch_tokens < 1:
            raise ValueError(f"KVPolicy.branch_tokens is {self.branch_tokens}: use None or a count >= 1")


@dataclass(frozen=True)
class ResumeRow:
    """A context for the engine to compute, resuming from kept KV.

    ``payload`` is the engine's own value for the first ``depth`` tokens of ``context``
    (as it returned it in :attr:`RowsOut.kept`; None with ``depth`` 0: from the start). The
    payload may hold more than ``depth`` tokens (a longer kept context): the engine reads
    its first ``depth`` only and never changes them. ``read_off`` holds the lengths of
    proper prefixes of ``context`` (each past ``depth``) whose rows the engine hands back
    too, before the row's own; ``wanted`` False: the row is computed for its KV only (a
    prefix several contexts share) and has no row in the output.
    """

    context: Context
    depth: int = 0
    payload: Any = None
    read_off: tuple[int, ...] = ()
    wanted: bool = True

    @property
    def new_tokens(self) -> int:
        return len(self.context) - self.depth


@dataclass
class RowsOut:
    """What :meth:`Engine.forward_rows <genlm_core.engine.contract.Engine.forward_rows>`
    returns: ``rows``, per :class:`ResumeRow` in order, its read-off contexts' scores and
    then its own (a row computed for its KV only too: the core drops it), as one tensor or
    a sequence of rows; ``kept``, the payload
    of every context the engine can resume from later, ``(context, payload)``: the core
    keeps them in its prefix cache, or hands their owners back (``release_kv``) when it
    does not."""

    rows: Any
    kept: Sequence[tuple[Context, Any]] = field(default_factory=list)
    #: the context tokens the model ran and resumed, where they differ from the rows' new
    #: tokens and depths (an engine that pads rows to a common start recomputes some)
    computed: int | None = None
    reused: int | None = None
