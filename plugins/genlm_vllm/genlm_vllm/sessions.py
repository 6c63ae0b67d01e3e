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

What :class:`DecodeSessions` does at each step (``VLLMEngine.decode_step``):

* a live row whose context extends its session's by one token resumes it with that token;
* a row added mid-burst (a resampled particle re-added with its prefix) takes over a
  released session whose context is a prefix of its own (its parent's, usually: one
  token to run), or starts a session from its prompt (vLLM's prefix cache supplies the
  full blocks it holds);
* released sessions nobody took over are aborted (their full blocks stay in vLLM's prefix
  cache).

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
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["DecodeSessions", "Session"]

Context = tuple[int, ...]


@dataclass
class Session:
    """One resumable vLLM request: ``context`` is what its KV holds after its last turn
    (the context whose row it returned last)."""

    request_id: str  # vLLM's internal id (the external one plus a random suffix)
    external_id: str
    context: Context
    lora: Any  # the LoRARequest it was started under


class DecodeSessions:
    """The live sessions of one engine, keyed by burst handle (see the module doc)."""

    def __init__(self, engine: Any) -> None:
        """``engine``: the :class:`~genlm_vllm.engine.VLLMEngine` holding the sessions (its
        ``llm``, ``lora_request``, tags, ``fetch`` and counters)."""
        self.engine = engine
        self.live: dict[int, Session] = {}
        self._ids = itertools.count()
        #: sessions started from a prompt / resumed with new tokens / closed unfinished
        self.started = 0
        self.resumed = 0
        self.closed = 0

    # ------------------------------------------------------------------ one step
    def step(self, rows: Mapping[int, Context], released: Collection[int]) -> "torch.Tensor | None":
        """The logits of every row (in the order of ``rows``); None for an empty step."""
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
        self._abort(free)
        if not plan:
            return None
        order = {h: i for i, h in enumerate(rows)}
        plan.sort(key=lambda p: order[p[0]])
        try:
            return self._run(plan, rows)
        except BaseException:
            self.close_all()
            raise

    def _extends(self, s: Session, ctx: Context) -> bool:
        n = len(s.context)
        return s.lora is self.engine.lora_request and len(ctx) > n and ctx[:n] == s.context

    def _run(
        self, plan: list[tuple[int, Session | None, Context]], rows: Mapping[int, Context]
    ) -> "torch.Tensor":
        from vllm import SamplingParams
        from vllm.inputs.engine import tokens_input

        from genlm_vllm.capture import TAG_KEY

        engine = self.engine
        llm_engine = engine.llm.llm_engine
        tasks = llm_engine.get_supported_tasks()
        tags = engine._new_tags(len(plan))
        pending: dict[str, int] = {}
        new: dict[str, int] = {}  # external id -> its prompt length (sessions started now)
        fed: dict[str, int] = {}  # external id -> tokens appended (sessions resumed now)
        for (h, s, tokens), tag in zip(plan, tags):
            params = SamplingParams(
                max_tokens=1,
                temperature=0.0,
                ignore_eos=True,
                detokenize=False,
                extra_args={TAG_KEY: tag},
            )
            request = llm_engine.input_processor.process_inputs(
                request_id=s.request_id if s is not None else f"{engine._namespace}-burst-{next(self._ids)}",
                prompt=tokens_input(list(tokens)),
                params=params,
                supported_tasks=tasks,
                lora_request=engine.lora_request,
                resumable=True,
            )
            if s is None:
                llm_engine.input_processor.assign_request_id(request)
                s = Session(request.request_id, request.external_req_id, (), engine.lora_request)
                new[s.external_id] = len(tokens)
                self.started += 1
            else:
                request.external_req_id = s.external_id
                fed[s.external_id] = len(tokens)
                self.resumed += 1
            s.context = rows[h]
            self.live[h] = s
            pending[s.external_id] = h
            llm_engine.output_processor.add_request(request, None, None, 0)
            # the engine core's own prompt list (see the module doc)
            core_request = copy.copy(request)
            core_request.prompt_token_ids = list(request.prompt_token_ids or ())
            llm_engine.engine_core.add_request(core_request)
        computed = reused = 0
        while pending:
            if not llm_engine.has_unfinished_requests():
                raise RuntimeError(f"vllm: {len(pending)} burst rows were dropped by the engine")
            for out in llm_engine.step():
                h = pending.get(out.request_id)
                if h is None or not out.outputs or out.outputs[0].finish_reason is None:
                    continue  # a partial prefill's output (chunked), or not ours
                del pending[out.request_id]
                prompt = new.get(out.request_id)
                if prompt is None:
                    computed += fed[out.request_id]
                else:
                    cached = int(getattr(out, "num_cached_tokens", None) or 0)
                    computed += prompt - cached
                    reused += cached
        out, missing = engine.fetch(tags)
        engine.forward_calls += 1
        engine.tokens_computed += computed
        engine.tokens_reused += reused
        if missing:
            raise RuntimeError(f"vllm: no logits were captured for {len(missing)} of {len(plan)} burst rows")
        return out

    # ------------------------------------------------------------------ ending
    def _abort(self, sessions: list[Session]) -> None:
        if sessions:
            self.engine.llm.llm_engine.abort_request([s.request_id for s in sessions], internal=True)
            self.closed += len(sessions)

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
        }
