"""Resident rows: the auto-batched calls of a program (SIS, SMC, the byte beam) continued
in place on static KV buffers, one static decode step a call (issue 44).

A program's particles call ``next_token_logprobs`` once a step, each on its context of the
step before plus one token, and the batcher hands their distinct contexts to
:meth:`HFEngine.forward <genlm_hf.backend.HFEngine.forward>` in one call. The eager path
(:func:`genlm_hf.kv.forward_rows`) looks each context's prefix up in the prefix cache,
copies it into a fresh batch buffer, runs the model with shapes that change every call,
and copies every row's KV back out. Here the rows stay where they are:

* every context of a call is placed by the core's
  :class:`~genlm_core.engine.resident.ResidentRows` (``max_gap=1``): a context one token
  longer than a live row's context *continues* that row (the same adapter only);
* the live rows sit in :class:`Block`\\ s, each a :class:`~genlm_hf.static.StaticSlot` of a
  bucket ``(B, C)``: row ``i`` of the slot holds its context's KV in columns
  ``[0, lengths[i])``;
* a call runs one static step (:meth:`StaticSlot.run`, a replayed CUDA graph on CUDA) per
  block that has rows in it: a continued row runs its new token at column
  ``lengths[i]``; every other row of the block runs the pad token at its own column
  ``lengths[i]``, past its context (masked for it, and overwritten when the row next
  runs), so absent rows are left as they were;
* a context that continues no row but whose context minus its last token has KV anywhere
  (a row another context continues, as after SMC resampling or in a beam; a row evicted
  by this call; the prefix cache) *joins*: that KV is copied into a free row of a block
  and the context runs in the block's step;
* the other contexts (a new prompt, a prefix several tokens back) run on the eager path
  from the deepest of the prefix cache's and the live rows' prefixes, in one pass (or in
  passes of similar suffix lengths, :mod:`genlm_hf.passes`, when one pass would pad a few
  long prompts' tokens onto many short suffixes), and their KV is copied into free rows
  from each pass's buffer;
* a context that finds no row to sit in (the static buffers are at
  ``static_decode_bytes``) runs on the eager path and its KV goes to the prefix cache,
  as without the static path.

Placement: new rows go to the block where most of the call's continued rows are, then
any block with a free row; a full block grows its batch bucket (a copy, up to the
engine's ``batch_size``); else a new block is made; when the bound refuses both, the
least recently used row of a block that this call does not use is evicted. An evicted
row's KV goes to the prefix cache (so a later context still finds it). Two particles
holding one context after resampling each get a row: the first continues it, the second
joins by a copy. Columns: a block whose longest row outgrows its bucket moves to the next
one (a copy per doubling; past the bound if it must, as a burst's batches do).

Rows stay until they are evicted, a burst starts (:meth:`ResidentBlocks.flush`: its
batches need the buffers), the caches are cleared, an adapter is switched, or the engine
closes; each flush sends the rows' KV to the prefix cache.
"""

from __future__ import annotations

from typing import Any

import torch

from genlm_core.engine.contexts import Context
from genlm_core.engine.resident import ResidentRow, ResidentRows
from genlm_hf.blocks import PENDING, Block, CallPlan
from genlm_hf.kv import Row, device_ints
from genlm_hf.passes import PASS_COST, pass_groups
from genlm_hf.static import StaticDecoder, batch_bucket, column_bucket

__all__ = ["ResidentBlocks"]

#: the deepest a fresh context's prefix is looked for among the live rows, in tokens back
_PREFIX_GAP = 16


class ResidentBlocks:
    """The live rows of one hf engine's ordinary calls (see the module doc)."""

    def __init__(self, engine: Any, decoder: StaticDecoder) -> None:
        self.engine = engine
        self.decoder = decoder
        # the rows themselves bound nothing: the buffers' bytes do (a row no block can take
        # runs eagerly), so the index's own bound is only a backstop
        self.calls = 0  # the index's clock: rows' last_used is the call that used them last
        self.index = ResidentRows(1 << 20, max_gap=1, clock=lambda: self.calls)
        #: the latest call some row was used in before its last use (:meth:`_stale`)
        self.settled = 0
        self.blocks: list[Block] = []
        self.joined = 0  # contexts whose KV was copied into a row (from a row, a pass, the cache)
        self.eager_runs = 0  # contexts run on the eager path
        self.eager_passes = 0  # the eager passes they ran in
        #: the cost of one more eager pass in token positions (:func:`pass_groups`)
        self.pass_cost = PASS_COST
        self.flushed = 0  # rows whose KV went to the prefix cache (evicted, flushed)
        self.grown = 0  # blocks moved to a larger bucket

    def __len__(self) -> int:
        return len(self.index)

    # ------------------------------------------------------------------ one call
    def forward(self, contexts: list[Context], key: Any) -> torch.Tensor:
        """The logits of the distinct ``contexts`` ``(n, V')``, in their order (see the
        module doc); every context's KV is kept (in a row, or in the prefix cache)."""
        try:
            return self._forward(contexts, key)
        except BaseException:
            self.flush(store=False)  # a call that failed half way leaves no row it touched
            raise

    def _forward(self, contexts: list[Context], key: Any) -> torch.Tensor:
        kv = self.engine.kv
        self.calls += 1
        plan = self.index.plan(contexts, key)
        placements = plan.placements
        sources: dict[Context, Any] = {}  # context -> its KV: a live row, or a tensor
        for row in plan.evicted:
            kept = sources[row.context] = self._evict(row)
            if len(row.context) > 1:
                sources.setdefault(row.context[:-1], kept)
        call = CallPlan()
        fresh = []
        for j, p in enumerate(placements):
            if p.row is not None:
                self.settled = max(self.settled, p.row.last_used)
                block, i = p.row.state
                call.static[j] = (block, i)
                call.busy.add(id(p.row))
                sources[p.row.context] = p.row
            else:
                fresh.append(j)
        if fresh:
            for ctx, row in self.index.rows.items():
                if row.key == key:
                    sources.setdefault(ctx, row)
            # a row's columns hold every prefix of its context: the one a token back is the
            # context it held before its last step (a particle's sibling forks from it)
            for src in list(sources.values()):
                if isinstance(src, ResidentRow) and len(src.context) > 1:
                    sources.setdefault(src.context[:-1], src)
            cached = kv.lookup([placements[j].context for j in fresh])
            for j, (depth, payload) in zip(fresh, cached):
                ctx = placements[j].context
                source = self._deepest(ctx, depth, sources)
                if source is not None:
                    depth, payload = len(source[0]), source[1]
                if depth == len(ctx) - 1 and placements[j].keep:
                    call.joins[j] = payload if source is None else source[1]
                else:
                    call.eager[j] = (depth, payload if source is None else self._pending(source[1], depth))
            self._place(placements, call)
        self._gather(placements, call)
        logits = self._run(placements, call)
        self._commit(plan, call, key)
        computed = sum(len(placements[j].context) - d for j, (d, _) in call.eager.items())
        computed += len(call.static)
        kv.count(computed, sum(len(p.context) for p in placements) - computed)
        return logits

    @staticmethod
    def _deepest(ctx: Context, depth: int, sources: dict[Context, Any]) -> tuple[Context, Any] | None:
        """The live (or just evicted) row holding the longest proper prefix of ``ctx``
        deeper than the prefix cache's ``depth`` (at most :data:`_PREFIX_GAP` back):
        ``(prefix, source)``, or None."""
        for n in range(len(ctx) - 1, max(depth, len(ctx) - 1 - _PREFIX_GAP), -1):
            prefix = ctx[:n]
            src = sources.get(prefix)
            if src is not None:
                return prefix, src
        return None

    @staticmethod
    def _view(src: Any, depth: int, evicted: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
        """The first ``depth`` columns of a source's KV ``[n_layers, 2, heads, depth, dim]``:
        a live row's (a view of its block; its copy if the call evicted it) or a tensor's."""
        if isinstance(src, ResidentRow):
            if evicted and id(src) in evicted:
                src = evicted[id(src)]
            else:
                block, i = src.state
                return block.slot.kv[:, :, i, :, :depth]
        return src[:, :, :, :depth]

    @classmethod
    def _pending(cls, src: Any, depth: int) -> Any:
        """An eager context's prefix KV as the call keeps it until its pass runs: a live
        row itself (read by :meth:`_view` when its pass runs, since placement may evict it
        and an earlier pass copy another context's KV into its row), else a tensor's first
        ``depth`` columns; None for no prefix (a one-token context's)."""
        if src is None or isinstance(src, ResidentRow):
            return src
        return cls._view(src, depth)

    # ------------------------------------------------------------------ placement
    def _place(self, placements: list[Any], call: CallPlan) -> None:
        """A row for every fresh context to keep (joins first): ``call.static`` for joins,
        ``call.eager_rows`` for eager ones; a join without a row runs eagerly."""
        want = [j for j in call.joins] + [j for j in call.eager if placements[j].keep]
        if not want:
            return
        homes = call.homes
        for block, _ in call.static.values():
            homes[id(block)] = homes.get(id(block), 0) + 1
        order = sorted(self.blocks, key=lambda b: -homes.get(id(b), 0))
        longest = max(len(placements[j].context) for j in want)
        for n, j in enumerate(want):
            spot = self._free_row(order, len(want) - n, longest, call)
            if spot is None:
                placements[j].keep = False
                if j in call.joins:  # no row: it runs from its prefix on the eager path
                    depth = len(placements[j].context) - 1
                    call.eager[j] = (depth, self._pending(call.joins.pop(j), depth))
                continue
            block, i = spot
            block.owners[i] = PENDING
            if j in call.joins:
                call.static[j] = spot
            else:
                call.eager_rows[j] = spot
            if block not in order:
                order.insert(0, block)
            homes.setdefault(id(block), 0)

    def _free_row(
        self, order: list[Block], needed: int, longest: int, call: CallPlan
    ) -> tuple[Block, int] | None:
        """A row for a new context: in the home block (``order[0]``, the one holding most of
        the call's continued rows), then in the others, a free row or a stale one's (see
        :meth:`_stale`); else a larger home block, a new block, and when the bound refuses
        both, the least recently used row the call does not use; None when none is left."""
        cap = self.decoder.batch_size
        home = order[:1] if order and id(order[0]) in call.homes else []
        for block in [*home, *(b for b in order if b not in home)]:
            free = block.free()
            if free:
                return block, free[0]
            if (spot := self._take_idle(block, call, stale_only=True)) is not None:
                return spot
        if home and home[0].rows < cap:  # the home block grows
            block = home[0]
            if self._regrow(block, batch_bucket(block.rows + needed, cap), block.slot.bucket[1]):
                return block, block.free()[0]
        block = self._new_block(min(needed, cap), longest)
        if block is not None:
            self.blocks.append(block)
            return block, 0
        for block in order:  # no room for more buffers
            if (spot := self._take_idle(block, call)) is not None:
                return spot
        return None

    def _gather(self, placements: list[Any], call: CallPlan) -> None:
        """When the call's static rows sit in several blocks (particles resampled across
        calls), move the continued rows of the blocks holding fewest of them into the block
        holding most, where it has room (free or stale rows, or growth): a copy of a row
        costs far less than a step of another block."""
        by_block: dict[int, tuple[Block, list[int]]] = {}
        for j, (block, _) in call.static.items():
            by_block.setdefault(id(block), (block, []))[1].append(j)
        if len(by_block) < 2:
            return
        groups = sorted(by_block.values(), key=lambda g: len(g[1]))
        home = groups[-1][0]
        cap = self.decoder.batch_size
        for _block, js in groups[:-1]:
            movable = [j for j in js if placements[j].row is not None and j not in call.joins]
            if len(movable) < len(js):
                continue  # a joining row stays where it was placed: the block steps anyway
            spots: list[tuple[Block, int]] = []
            for _ in js:
                spot = self._home_row(home, call, cap)
                if spot is None:
                    break
                home.owners[spot[1]] = PENDING
                spots.append(spot)
            if len(spots) < len(js):
                for _, k in spots:
                    home.owners[k] = None
                continue
            for j, spot in zip(js, spots):
                call.moves.append((j, call.static[j], spot))
                call.static[j] = spot

    def _home_row(self, home: Block, call: CallPlan, cap: int) -> tuple[Block, int] | None:
        free = home.free()
        if free:
            return home, free[0]
        spot = self._take_idle(home, call, stale_only=True)
        if spot is not None:
            return spot
        if home.rows < cap and self._regrow(home, batch_bucket(home.rows + 1, cap), home.slot.bucket[1]):
            return home, home.free()[0]
        return None

    def _stale(self, row: ResidentRow) -> bool:
        """Whether ``row`` died, as far as the calls tell: a row used in the same call as
        ``row`` was last has been continued since, and ``row`` was not (a program's step
        uses each live particle once; the batcher puts the particles of a step in the same
        calls, step after step, so one waiting for a later call of this step is not
        stale). A row taken for stale that was not is found in the prefix cache."""
        return row.last_used <= self.settled

    def _take_idle(self, block: Block, call: CallPlan, stale_only: bool = False) -> tuple[Block, int] | None:
        """Evict ``block``'s least recently used row that ``call`` does not use (a stale one
        only, if ``stale_only``); its row."""
        idle = [
            o
            for o in block.owners
            if isinstance(o, ResidentRow) and id(o) not in call.busy and (not stale_only or self._stale(o))
        ]
        if not idle:
            return None
        row = min(idle, key=lambda o: o.last_used)
        del self.index.rows[row.context]
        call.evicted[id(row)] = self._evict(row, drop=False)
        return block, row.state[1]

    def _new_block(self, rows: int, longest: int) -> Block | None:
        C = column_bucket(longest + 1, self.decoder.max_columns)
        if C is None:
            return None
        B = batch_bucket(rows, self.decoder.batch_size)
        slot = self.decoder.slot((B, C), self.decoder.kv_layout())
        if slot is None:
            return None
        return Block(slot, [0] * B, [None] * B)

    def _regrow(self, block: Block, B: int, C: int, force: bool = False) -> bool:
        """Move ``block`` to a slot of bucket ``(B, C)`` (its rows copied); False when the
        bound refuses it (unless ``force``)."""
        old = block.slot
        slot = self.decoder.slot((B, C), self.decoder.kv_layout(), force=force)
        if slot is None:
            return False
        b, c = old.bucket
        slot.kv[:, :, :b, :, :c].copy_(old.kv)
        block.slot = slot
        self.decoder.give_back(old)
        extra = B - len(block.owners)
        block.owners += [None] * extra
        block.lengths += [0] * extra
        self.grown += 1
        return True

    # ------------------------------------------------------------------ running
    def _run(self, placements: list[Any], call: CallPlan) -> torch.Tensor:
        engine = self.engine
        parts: list[torch.Tensor] = []
        order: list[int] = []
        eager = list(call.eager)
        # contexts of very different suffix lengths in passes of their own (genlm_hf.passes);
        # each pass's KV leaves the shared workspace before the next pass reuses it
        suffixes = [len(placements[j].context) - call.eager[j][0] for j in eager]
        for group in pass_groups(suffixes, self.pass_cost):
            idx = [eager[g] for g in group]
            rows = []
            for j in idx:
                depth, src = call.eager[j]
                if isinstance(src, ResidentRow):
                    src = self._view(src, depth, call.evicted)
                rows.append(Row(placements[j].context, depth, src))
            logits, slots = engine.run_rows(rows, workspace=engine.workspace)
            self.eager_passes += 1
            P = slots.filled
            for n, (j, r) in enumerate(zip(idx, rows)):
                spot = call.eager_rows.get(j)
                length = len(r.ctx)
                src = slots.buf[:, :, n, :, P - r.depth : P - r.depth + length]
                if spot is None:
                    engine.kv.store(r.ctx, src.clone(memory_format=torch.contiguous_format))
                    continue
                block, i = spot
                self._fit(block, length)
                block.slot.kv[:, :, i, :, :length].copy_(src)
                block.lengths[i] = length
            self.eager_runs += len(rows)
            parts.append(logits)
            order += idx
        for j, (block, i), (dst, k) in call.moves:  # continued rows gathered in one block
            n = block.lengths[i]
            self._fit(dst, n + 1)
            dst.slot.kv[:, :, k, :, :n].copy_(block.slot.kv[:, :, i, :, :n])
            dst.lengths[k] = n
            block.owners[i], block.lengths[i] = None, 0
            placements[j].row.state = (dst, k)  # where a join reading it finds it now
        for j, source in call.joins.items():
            block, i = call.static[j]
            depth = len(placements[j].context) - 1
            self._fit(block, depth + 1)
            if depth:
                block.slot.kv[:, :, i, :, :depth].copy_(self._view(source, depth, call.evicted))
            block.lengths[i] = depth
            self.joined += 1
        by_block: dict[int, tuple[Block, list[int]]] = {}
        for j, (block, _) in call.static.items():
            by_block.setdefault(id(block), (block, []))[1].append(j)
        for block, js in by_block.values():
            self._fit(block, max(block.lengths) + 1)
            tokens = [self.engine.pad_id] * block.rows
            for j in js:
                tokens[call.static[j][1]] = placements[j].context[-1]
            out = self.decoder.run(block.slot, tokens, list(block.lengths))
            picked = [call.static[j][1] for j in js]
            parts.append(out.index_select(0, device_ints(picked, out.device)))
            for i in picked:
                block.lengths[i] += 1
            order += js
        # every part is a tensor of its own (never a view of a static output, which the
        # next replay overwrites)
        logits = parts[0] if len(parts) == 1 else torch.cat(parts)
        if order != list(range(len(order))):
            inverse = [0] * len(order)
            for n, j in enumerate(order):
                inverse[j] = n
            logits = logits.index_select(0, device_ints(inverse, logits.device))
        return logits

    def _fit(self, block: Block, columns: int) -> None:
        """``block``'s bucket holds ``columns`` columns (moved to a longer one if not, past
        the bound if it must: its rows cannot go back to the eager path)."""
        B, C = block.slot.bucket
        if columns <= C:
            return
        want = column_bucket(columns, self.decoder.max_columns)
        if want is None:  # the core bounds contexts by the model's positions: unreachable
            raise RuntimeError(f"hf: a resident row reached {columns} columns, past the model's positions")
        if not self._regrow(block, B, want):
            self._regrow(block, B, want, force=True)

    def _commit(self, plan: Any, call: CallPlan, key: Any) -> None:
        spots = {**call.static, **call.eager_rows}
        states = [spots.get(j) for j in range(len(plan.placements))]
        self.index.commit(plan, states, key)
        for j, p in enumerate(plan.placements):
            spot = spots.get(j)
            if spot is None:
                continue
            block, i = spot
            block.owners[i] = self.index.rows[p.context]
        for block in [b for b in self.blocks if all(o is None for o in b.owners)]:
            self._drop(block)  # its rows moved or left

    # ------------------------------------------------------------------ leaving
    def _evict(self, row: ResidentRow, drop: bool = True) -> torch.Tensor:
        """``row``'s KV out of its block (to the prefix cache, and returned); its row freed,
        and its block given back when that was its last row (unless not ``drop``)."""
        block, i = row.state
        n = len(row.context)
        payload = block.slot.kv[:, :, i, :, :n].clone(memory_format=torch.contiguous_format)
        self.engine.kv.store(row.context, payload)
        block.owners[i] = None
        block.lengths[i] = 0
        self.flushed += 1
        if drop and all(o is None for o in block.owners):
            self._drop(block)
        return payload

    def _drop(self, block: Block) -> None:
        if block in self.blocks:
            self.blocks.remove(block)
            self.decoder.give_back(block.slot)

    def flush(self, store: bool = True) -> None:
        """Every row out (its KV to the prefix cache when ``store``), every block given back."""
        for row in self.index.clear():
            if store:
                self._evict(row)
        for block in list(self.blocks):
            self._drop(block)

    def stats(self) -> dict[str, int]:
        out = self.index.stats()
        out.update(
            resident_joined=self.joined,
            resident_eager=self.eager_runs,
            resident_eager_passes=self.eager_passes,
            resident_flushed=self.flushed,
            resident_grown=self.grown,
            resident_blocks=len(self.blocks),
        )
        return out
