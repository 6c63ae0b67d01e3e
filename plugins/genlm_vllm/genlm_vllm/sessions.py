"""Burst rows as vLLM streaming-input sessions: a row's KV stays in vLLM between steps.

vLLM 0.32's V1 scheduler keeps a *resumable* request (``Request.resumable``, what
``AsyncLLM.generate`` makes of a prompt given as an async generator of
``StreamingInput``) waiting with its KV blocks when a turn ends, and a later request
with the same id appends its tokens to the session: the scheduler computes those tokens
only, over the KV it kept. That is the public seam a burst needs (the anchors' branch
patches vLLM's sampler instead): each burst row is one session, each step is one turn of
``max_tokens=1`` whose prompt is the token the control drew at the previous step, and the
capture processor (:mod:`genlm_vllm.capture`) records the row of the turn's last position,
as it does for a ``forward`` call. The token vLLM samples in the turn is thrown away by the
next turn (the scheduler keeps computed tokens only).

What :class:`DecodeSessions` does at each step (``VLLMEngine.decode_step``: one turn of
every row's session, :meth:`DecodeSessions.take_turn`; a row is its handle):

* a live row whose context extends its session's by one token resumes it with that token;
* a row added mid-burst (a resampled particle re-added with its prefix) takes over a
  released session whose context is a prefix of its own (its parent's, usually: one
  token to run), or starts a session from its prompt (vLLM's prefix cache supplies the
  full blocks it holds);
* released sessions nobody took over are aborted (their full blocks stay in vLLM's prefix
  cache); so are the last ones when the burst ends (``VLLMEngine.end_burst``).

Another call on the engine (``forward``, ``sample``, a cache reset, a LoRA switch) closes
every session first: ``LLM.generate`` runs the engine until no request is unfinished, and
a waiting session is unfinished. The next step restarts the rows from their prompts
through the prefix cache, so results do not change; only speed does.

Sessions are driven through ``LLMEngine`` directly (``add_request`` is split in two so the
engine core gets its own copy of the prompt list: in-process, the output processor and
the scheduler would otherwise extend one list twice per turn).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from genlm_core.engine.contexts import Context
from genlm_vllm import _deprecated

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from vllm.v1.engine.llm_engine import LLMEngine

    from genlm_core.engine.kv_reuse import ComputeCounters

__all__ = ["DecodeSessions", "SessionEngine", "Session", "Turn", "fork_enabled", "run_turns"]


def fork_enabled(llm: Any) -> bool:
    """Whether the engine runs genlm's fork connector (:mod:`genlm_vllm.fork`)."""
    config = getattr(getattr(llm.llm_engine, "vllm_config", None), "kv_transfer_config", None)
    return bool(
        config is not None
        and config.kv_connector == "ForkConnector"
        and config.kv_connector_module_path == "genlm_vllm.fork"
    )


class SessionEngine(Protocol):
    """What the sessions read of the engine holding them (:class:`~genlm_vllm.engine.VLLMEngine`):
    its ``vllm.LLM``, the active adapter's ``LoRARequest``, its namespace of request ids and
    capture tags, the fetch of captured rows, its compute counters and its resident rows."""

    llm: Any
    lora_request: Any
    namespace: str
    counters: ComputeCounters
    resident: ResidentSessions | None

    def new_tags(self, n: int) -> list[str]: ...

    def fetch(self, tags: list[str]) -> tuple[torch.Tensor, list[int]]: ...


@dataclass
class Session:
    """One resumable vLLM request: ``context`` is what its KV holds after its last turn
    (the context whose row it returned last)."""

    request_id: str  # vLLM's internal id (the external one plus a random suffix)
    external_id: str
    context: Context
    lora: Any  # the LoRARequest it was started under


@dataclass
class Turn:
    """One row of an engine step: ``session`` resumed with ``tokens`` (None: a new request
    whose prompt is ``tokens``), leaving it at ``context``; a new request is a session
    (kept after its turn) when ``resumable``, else it ends with its turn. ``fork``: for a
    new request, a live session whose KV holds the prompt's first tokens (the session,
    how many): copied rather than prefilled where the engine forks (:mod:`genlm_vllm.fork`)."""

    session: Session | None
    tokens: Context
    context: Context
    resumable: bool = True
    fork: tuple[Session, int] | None = None


def _unstall(
    llm_engine: LLMEngine,
    on_stall: "Callable[[], bool] | None",
    sessions: "list[Session | None]",
    pending: Mapping[str, int],
    may_release: bool,
) -> bool:
    """Free what stalled turns may wait on: paused sessions of other calls first, then
    (``may_release``) this call's finished ones. True when something was ended."""
    if on_stall is not None and on_stall():
        return True
    if not may_release:
        return False
    done = [i for i, s in enumerate(sessions) if s is not None and s.external_id not in pending]
    if done:
        llm_engine.abort_request([sessions[i].request_id for i in done], internal=True)  # type: ignore[union-attr]
        for i in done:
            sessions[i] = None
    return bool(done)


#: consecutive engine steps that return nothing for a pending turn before ``on_stall``:
#: paused sessions hold KV blocks and request slots vLLM cannot preempt, so the call's
#: rows may wait for them forever (a small KV cache, a burst beside resident rows)
STALL_STEPS = 8


def run_turns(
    engine: SessionEngine,
    turns: list[Turn],
    *,
    read_prefix_cache: bool = True,
    on_stall: "Callable[[], bool] | None" = None,
    may_release: bool = False,
) -> "tuple[torch.Tensor, list[Session | None]]":
    """Run ``turns`` as one batch of ``max_tokens=1`` requests through ``LLMEngine``,
    stepping it until each has finished its turn (other sessions of the engine stay
    waiting: nothing here waits for them, as ``LLM.generate`` would). Returns the captured
    rows in order and each turn's session after it (None: a request that ended). Counts
    the tokens computed and read from the prefix cache in ``engine.counters``. ``on_stall``: called
    after :data:`STALL_STEPS` steps in a row with no output for a pending turn, to end
    paused sessions that may hold what the turns wait for; True when it ended some. If
    it ended none and ``may_release``, the sessions of this call's finished turns end
    (their rows are captured already; their session comes back None)."""
    from vllm.inputs.engine import tokens_input

    from genlm_vllm.capture import row_params

    llm_engine = engine.llm.llm_engine
    tasks = llm_engine.get_supported_tasks()
    tags = engine.new_tags(len(turns))
    pending: dict[str, int] = {}  # external id -> turn index
    new: dict[str, int] = {}  # external id -> its prompt length (requests started now)
    fed: dict[str, int] = {}  # external id -> tokens appended (sessions resumed now)
    kept: dict[str, int] = {}  # external id -> tokens its KV held (sessions resumed now)
    sessions: list[Session | None] = []
    added: list[str] = []  # internal ids: what a failure aborts
    try:
        for i, (turn, tag) in enumerate(zip(turns, tags)):
            s = turn.session
            fork = turn.fork if s is None and read_prefix_cache else None
            params = row_params(tag, read_prefix_cache, (fork[0].request_id, fork[1]) if fork else None)
            resumable = s is not None or turn.resumable
            request = llm_engine.input_processor.process_inputs(
                request_id=s.request_id if s is not None else f"{engine.namespace}-row-{next(_IDS)}",
                prompt=tokens_input(list(turn.tokens)),
                params=params,
                supported_tasks=tasks,
                lora_request=engine.lora_request,
                resumable=resumable,
            )
            if s is None:
                llm_engine.input_processor.assign_request_id(request)
                s = Session(request.request_id, request.external_req_id, (), engine.lora_request)
                new[s.external_id] = len(turn.tokens)
            else:
                request.external_req_id = s.external_id
                fed[s.external_id] = len(turn.tokens)
                kept[s.external_id] = len(turn.context) - len(turn.tokens)
            s.context = turn.context
            added.append(s.request_id)
            sessions.append(s if resumable else None)
            pending[s.external_id] = i
            llm_engine.output_processor.add_request(request, None, None, 0)
            # the engine core's own prompt list (see the module doc)
            core_request = copy.copy(request)
            core_request.prompt_token_ids = list(request.prompt_token_ids or ())
            llm_engine.engine_core.add_request(core_request)
        computed = reused = 0
        # every engine step computes at least one token of a pending turn while one can be
        # scheduled: past this many, none can (a bound on live sessions failed), and a
        # waiting session keeps has_unfinished_requests() true: raise rather than spin
        steps_left = sum(len(t.tokens) for t in turns) + 2 * len(turns) + 1000
        idle_steps = 0
        while pending:
            steps_left -= 1
            if not llm_engine.has_unfinished_requests() or steps_left < 0:
                raise RuntimeError(
                    f"vllm: {len(pending)} rows were dropped by the engine or never scheduled "
                    f"({llm_engine.get_num_unfinished_requests()} requests unfinished)"
                )
            outputs = llm_engine.step()
            idle_steps = 0 if any(o.request_id in pending for o in outputs) else idle_steps + 1
            if idle_steps >= STALL_STEPS and _unstall(llm_engine, on_stall, sessions, pending, may_release):
                idle_steps = 0
                steps_left += STALL_STEPS  # those steps waited on paused sessions, now ended
            for out in outputs:
                if out.request_id not in pending or not out.outputs or out.outputs[0].finish_reason is None:
                    continue  # a partial prefill's output (chunked), or not ours
                del pending[out.request_id]
                prompt = new.get(out.request_id)
                if prompt is None:  # a resumed session: its kept KV is reused
                    computed += fed[out.request_id]
                    reused += kept[out.request_id]
                else:
                    cached = int(getattr(out, "num_cached_tokens", None) or 0)
                    computed += prompt - cached
                    reused += cached
    except BaseException:
        try:  # the requests of a failed step: none is left waiting in the engine
            llm_engine.abort_request(added, internal=True)
        except Exception:  # noqa: BLE001 - an engine that died has no requests to keep
            pass
        raise
    out, missing = engine.fetch(tags)
    engine.counters.count(computed, reused)
    if missing:
        raise RuntimeError(f"vllm: no logits were captured for {len(missing)} of {len(turns)} rows")
    return out, sessions


_IDS = itertools.count()

#: the most tokens a row that starts afresh may extend the session it forks (as far as a
#: resident row's context may extend it: ``ResidentRows.max_gap``)
FORK_GAP = 16


class DecodeSessions:
    """The live sessions of one engine, keyed by burst handle (see the module doc)."""

    def __init__(self, engine: SessionEngine) -> None:
        """``engine``: the :class:`~genlm_vllm.engine.VLLMEngine` holding the sessions (its
        ``llm``, ``lora_request``, tags, ``fetch`` and counters)."""
        self.engine = engine
        self.live: dict[int, Session] = {}
        #: whether a row that starts afresh forks a session's KV (:mod:`genlm_vllm.fork`)
        self.forks = fork_enabled(engine.llm)
        #: sessions started from a prompt / resumed with new tokens / closed unfinished; rows
        #: that shared another row of their step (same context, no session of their own)
        self.started = 0
        self.resumed = 0
        self.sessions_closed = 0
        self.shared = 0

    #: deprecated: :attr:`sessions_closed` (genlm_vllm._deprecated)
    closed = _deprecated.sessions_closed

    # ------------------------------------------------------------------ one step
    def take_turn(self, rows: Mapping[int, Context], released: Collection[int]) -> "torch.Tensor":
        """One turn of every row's session: the logits of every row (in the order of
        ``rows``, never empty); ``released``: handles dropped since the last step, whose
        sessions a new row may take over (else they end)."""
        if not rows:
            raise ValueError(
                "DecodeSessions.take_turn: a decode step has rows; a burst ends with end_burst(released)"
            )
        free: list[Session] = [self.live.pop(h) for h in released if h in self.live]
        plan: list[tuple[int, Session | None, Context]] = []  # (handle, session, tokens to run)
        waiting: list[tuple[int, Context]] = []
        for h, ctx in rows.items():
            s = self.live.pop(h, None)
            if s is not None and self._extends(s, ctx):
                plan.append((h, s, ctx[len(s.context) :]))
            else:
                if s is not None:
                    free.append(s)
                waiting.append((h, ctx))
        for h, ctx in waiting:  # rows added: take over a released session where one fits
            best = max((s for s in free if self._extends(s, ctx)), key=lambda s: len(s.context), default=None)
            if best is not None:
                free.remove(best)
                plan.append((h, best, ctx[len(best.context) :]))
            else:
                plan.append((h, None, ctx))
        # a row that starts afresh forks the deepest session of the step holding a prefix of
        # it (a resampled particle's parent, continued by a sibling): its KV as it is now
        forks: dict[int, tuple[Session, int]] = {}
        if self.forks:
            held = {s.context: s for _, s, _ in plan if s is not None}
            for h, s, ctx in plan:
                src = None if s is not None else self._source(ctx, held)
                if src is not None:
                    forks[h] = (src, len(src.context))
        # a row that would start afresh on a context another row of the step runs (a burst's
        # first step: every particle on the prompt; a resampled particle's copies) shares that
        # row and holds no session until it diverges: then it forks the other's
        shared: dict[int, int] = {}  # handle -> the handle whose row it shares
        run: dict[Context, int] = {rows[h]: h for h, s, _ in plan if s is not None}
        for h, s, _ in plan:
            if s is None:
                other = run.setdefault(rows[h], h)
                if other != h:
                    shared[h] = other
        plan = [p for p in plan if p[0] not in shared]
        self._abort(free)
        order = {h: i for i, h in enumerate(rows)}
        plan.sort(key=lambda p: order[p[0]])
        try:
            out = self._run(plan, rows, forks)
        except BaseException:
            self.close_all()
            raise
        self.shared += len(shared)
        if not shared:
            return out
        where = {h: i for i, (h, _, _) in enumerate(plan)}
        return out[[where[shared.get(h, h)] for h in rows]]

    def end_burst(self, released: Collection[int]) -> None:
        """The burst ended: the sessions of ``released`` end (their full blocks stay in
        vLLM's prefix cache)."""
        self._abort([self.live.pop(h) for h in released if h in self.live])

    #: deprecated: :meth:`take_turn` and :meth:`end_burst` (genlm_vllm._deprecated)
    step = _deprecated.sessions_step

    def _source(self, ctx: Context, held: Mapping[Context, Session]) -> Session | None:
        """The session of ``held`` whose context is ``ctx``'s longest proper prefix at most
        :data:`FORK_GAP` tokens shorter (under the active adapter)."""
        for n in range(len(ctx) - 1, max(0, len(ctx) - 1 - FORK_GAP), -1):
            s = held.get(ctx[:n])
            if s is not None and s.lora is self.engine.lora_request:
                return s
        return None

    def _extends(self, s: Session, ctx: Context) -> bool:
        n = len(s.context)
        return s.lora is self.engine.lora_request and len(ctx) > n and ctx[:n] == s.context

    def _run(
        self,
        plan: list[tuple[int, Session | None, Context]],
        rows: Mapping[int, Context],
        forks: Mapping[int, tuple[Session, int]],
    ) -> "torch.Tensor":
        turns = [Turn(s, tokens, rows[h], fork=forks.get(h)) for h, s, tokens in plan]
        resident = self.engine.resident  # ordinary calls' paused rows: ended if the burst waits on them
        out, sessions = run_turns(
            self.engine, turns, on_stall=resident.end_idle if resident is not None else None
        )
        for (h, s, _), session in zip(plan, sessions):
            assert session is not None
            self.live[h] = session
            if s is None:
                self.started += 1
            else:
                self.resumed += 1
        return out

    # ------------------------------------------------------------------ ending
    def _abort(self, sessions: list[Session]) -> None:
        if sessions:
            self.engine.llm.llm_engine.abort_request([s.request_id for s in sessions], internal=True)
            self.sessions_closed += len(sessions)

    def close_all(self) -> None:
        """Abort every session (before another engine call, a cache reset or close)."""
        sessions, self.live = list(self.live.values()), {}
        try:
            self._abort(sessions)
        except Exception:  # noqa: BLE001 - an engine that died has no sessions to keep
            pass

    def stats(self) -> dict[str, int]:
        return {
            "decode_sessions": len(self.live),
            "decode_sessions_started": self.started,
            "decode_sessions_resumed": self.resumed,
            "decode_rows_shared": self.shared,
        }


class ResidentSessions:
    """Ordinary calls' rows kept as vLLM streaming-input sessions between calls (the
    resident path: ``VLLMConfig.resident``). The core's
    :class:`~genlm_core.engine.resident.ResidentRows` decides which context continues
    which live row; this class runs the call's turns and ends the sessions it drops.

    Bounds: at most ``resident_rows`` rows, at most the engine's ``max_num_seqs`` less one
    less a burst's live sessions (a paused session holds one of vLLM's request slots:
    with every slot held nothing new is scheduled), and their KV blocks at most half of the
    KV cache (a paused session's blocks cannot be preempted), counting the full blocks rows
    share through the prefix cache once. Rows idle for
    ``resident_idle_s`` end at the next engine call."""

    def __init__(self, engine: SessionEngine, max_rows: int, idle_s: float | None) -> None:
        from genlm_core.engine.resident import ResidentRows

        self.engine = engine
        llm_engine = engine.llm.llm_engine
        self.max_seqs = int(llm_engine.vllm_config.scheduler_config.max_num_seqs)
        cache = llm_engine.vllm_config.cache_config
        blocks = getattr(cache, "num_gpu_blocks", None)
        block_size = int(getattr(cache, "block_size", None) or 16)
        # rows started from one prompt share its full KV blocks (prefix-cache hits): a shared
        # prompt counts once, not once per row (64 particles of a 907-token prompt hold 7
        # shared blocks and 2 of their own each, not 64 x 1107 tokens)
        shared = bool(cache.enable_prefix_caching)
        self.rows = ResidentRows(max_rows, idle_s, block_size=block_size if shared else None)
        #: tokens the rows may hold at once (None: the KV cache's size is unknown)
        self.token_budget = int(blocks) * block_size // 2 if blocks else None
        #: whether the engine forks a live row's KV (:mod:`genlm_vllm.fork`): a context that
        #: starts afresh copies the blocks of the row holding its prefix (a particle's parent)
        self.forks = fork_enabled(engine.llm)

    def key(self) -> Any:
        """What a row is computed under: the adapter (its name and fresh id; vLLM's
        ``LoRARequest`` compares by name only)."""
        lora = self.engine.lora_request
        return None if lora is None else (lora.lora_name, lora.lora_int_id)

    def capacity(self, burst_rows: int) -> int:
        return max(0, self.max_seqs - 1 - burst_rows)

    def forward(self, contexts: list[Context], burst_rows: int) -> "torch.Tensor":
        """The rows of ``contexts`` (a duplicate gets its first occurrence's row)."""
        unique = list(dict.fromkeys(contexts))
        key = self.key()
        self._end(self.rows.expire())
        plan = self.rows.plan(unique, key, self.capacity(burst_rows), self.token_budget)
        self._end(plan.evicted)
        forks = self.forks
        turns = [
            Turn(
                p.row.state if p.row is not None else None,
                p.new_tokens,
                p.context,
                p.keep,
                (p.source.state, p.source_depth) if forks and p.source is not None else None,
            )
            for p in plan.placements
        ]
        try:
            out, sessions = run_turns(self.engine, turns, on_stall=self.end_idle, may_release=True)
        except BaseException:  # run_turns ended the call's requests; the rest too
            self.close_all()
            raise
        for p, session in zip(plan.placements, sessions):
            p.keep = p.keep and session is not None  # a row released to unstall the call
        self.rows.commit(plan, sessions, key)
        if len(unique) < len(contexts):
            where = {c: i for i, c in enumerate(unique)}
            out = out[[where[c] for c in contexts]]
        return out

    def end_idle(self) -> bool:
        """The call's turns wait on what paused rows hold (KV blocks, request slots): end
        the rows this call does not continue (its continued rows are out of the index
        until commit). True when some were ended."""
        idle = self.rows.shrink(0)
        self._end(idle)
        return bool(idle)

    def make_room(self, burst_rows: int) -> None:
        """Before a burst step of ``burst_rows`` rows: end the least recently used rows
        that would leave it no request slot."""
        self._end(self.rows.shrink(self.capacity(burst_rows)))

    def _end(self, rows: list[Any]) -> None:
        sessions = [r.state for r in rows if r.state is not None]
        if sessions:
            self.engine.llm.llm_engine.abort_request([s.request_id for s in sessions], internal=True)

    def close_all(self) -> None:
        """End every row (before ``LLM.generate``, a cache reset, close)."""
        try:
            self._end(self.rows.clear())
        except Exception:  # noqa: BLE001 - an engine that died has no sessions to keep
            pass

    def stats(self) -> dict[str, Any]:
        return self.rows.stats()
