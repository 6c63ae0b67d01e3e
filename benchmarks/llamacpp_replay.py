"""Our layer against raw llama.cpp, for bench_llamacpp.py: the recorder of a backend's
forward passes and llama.cpp calls, and the two replays of them (through the backend's
async API; through llama_cpp's low-level API alone on the same context), timed per step.
"""

from __future__ import annotations

import asyncio
import ctypes
import statistics
import sys
import time
from typing import Any


def log(msg: str) -> None:
    print(f"[bench_llamacpp {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Recorder:
    """Records the forward passes of a backend (the contexts of each engine call) and, for llamacpp, every llama.cpp call its engine makes, grouped by pass."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.steps: list[list[tuple[int, ...]]] = []
        self.ops: list[list[tuple[Any, ...]]] = []
        self.recording = False
        self.passes = 0  # forward passes, recorded or not
        # what the batcher's batch function calls: the core's KV reuse around the engine's
        # forward_rows for an engine that resumes from kept KV, else the engine's forward
        calls = llm.kv_calls if getattr(llm, "kv_calls", None) is not None else llm.engine
        forward = calls.forward

        def recorded_forward(contexts: list[tuple[int, ...]]) -> Any:
            self.passes += 1
            if self.recording:
                self.steps.append(list(contexts))
                self.ops.append([])
            return forward(contexts)

        calls.forward = recorded_forward
        context = getattr(llm.engine, "context", None)  # llama.cpp's (genlm_llamacpp.llama_context)
        if context is not None and hasattr(context, "decode"):
            self._wrap_context(context)

    def _op(self, op: tuple[Any, ...]) -> None:
        if self.recording and self.ops:
            self.ops[-1].append(op)

    def _wrap_context(self, context: Any) -> None:
        import numpy as np

        decode, seq_copy, seq_remove = context.decode, context.seq_copy, context.seq_remove

        def rec_decode(rows: Any) -> Any:
            if not self.recording:
                return decode(rows)
            op = (
                "decode",
                np.array([r.token for r in rows], dtype=np.int32),
                np.array([r.pos for r in rows], dtype=np.int32),
                [r.seq for r in rows],
                np.array([r.logits for r in rows], dtype=np.int8),
            )
            try:
                out = decode(rows)
            except Exception:
                self._op((*op, False))  # a decode that found no KV cells (retried after eviction)
                raise
            self._op((*op, True))
            return out

        def rec_copy(src: int, dst: int, n: int) -> None:
            self._op(("cp", src, dst, n))
            seq_copy(src, dst, n)

        def rec_remove(seq: int) -> None:
            self._op(("rm", seq))
            seq_remove(seq)

        context.decode, context.seq_copy, context.seq_remove = rec_decode, rec_copy, rec_remove

    def start(self) -> None:
        self.steps.clear()
        self.ops.clear()
        self.recording = True

    def stop(self) -> None:
        self.recording = False


# ---------------------------------------------------------------------- layer vs raw
def replay_ours(
    llm: Any, rec: Recorder, steps: list[list[tuple[int, ...]]], record: bool = True
) -> list[float]:
    """The recorded forward passes through the backend's async API from clean caches,
    timed per step; with ``record`` the engine's llama.cpp calls are recorded
    (``rec.ops``, per step; recording costs a little time)."""

    async def go() -> list[float]:
        times = []
        for contexts in steps:
            t0 = time.perf_counter()
            await asyncio.gather(*(llm.next_token_logprobs(c) for c in contexts))
            times.append(time.perf_counter() - t0)
        return times

    rec.stop()
    llm.clear_cache()
    if record:
        rec.start()
    before = rec.passes
    times = asyncio.run(go())
    rec.stop()
    if rec.passes - before != len(steps):
        raise RuntimeError(f"replay made {rec.passes - before} forward passes, the workload {len(steps)}")
    return times


class RawReplay:
    """Recorded llama.cpp calls on a context, with nothing but llama_cpp's C functions."""

    def __init__(self, ctx: Any, batch: Any, n_batch: int) -> None:
        import llama_cpp as L
        import numpy as np

        self.L, self.ctx, self.batch = L, ctx, batch
        self.mem = L.llama_get_memory(ctx)
        self.addr = {
            name: ctypes.addressof(getattr(batch, name).contents)
            for name in ("token", "pos", "n_seq_id", "logits")
        }
        self.seq_ptrs = [batch.seq_id[i] for i in range(n_batch)]
        self.ones = np.ones(n_batch, dtype=np.int32)

    def run(self, ops: list[list[tuple[Any, ...]]]) -> list[float]:
        """One pass from an empty KV cache; the time of each step."""
        L, ctx, mem, batch, addr = self.L, self.ctx, self.mem, self.batch, self.addr
        L.llama_memory_clear(mem, True)
        times = []
        for step in ops:
            t0 = time.perf_counter()
            for op in step:
                if op[0] == "decode":
                    _, tokens, pos, seqs, logits, ok = op
                    n = len(tokens)
                    ctypes.memmove(addr["token"], tokens.ctypes.data, 4 * n)
                    ctypes.memmove(addr["pos"], pos.ctypes.data, 4 * n)
                    ctypes.memmove(addr["n_seq_id"], self.ones.ctypes.data, 4 * n)
                    ctypes.memmove(addr["logits"], logits.ctypes.data, n)
                    for i, s in enumerate(seqs):
                        self.seq_ptrs[i][0] = s
                    batch.n_tokens = n
                    rc = L.llama_decode(ctx, batch)
                    if (rc == 0) != ok:
                        raise RuntimeError(f"raw replay: llama_decode returned {rc}, the recorded run {ok}")
                    if rc == 0:
                        for i in logits.nonzero()[0]:
                            L.llama_get_logits_ith(ctx, int(i))
                elif op[0] == "cp":
                    L.llama_memory_seq_cp(mem, op[1], op[2], 0, op[3])
                elif op[0] == "rm":
                    L.llama_memory_seq_rm(mem, op[1], -1, -1)
            times.append(time.perf_counter() - t0)
        return times


def layer_vs_raw(
    engine: str,
    workload: str,
    llm: Any,
    rec: Recorder,
    steps: list[list[tuple[int, ...]]],
    replays: int,
) -> dict:
    """Our layer and raw llama.cpp on the same batches, alternating ``replays`` times
    (so load from elsewhere hits both alike); per step the fastest of each."""
    log(f"{engine} {workload}: {len(steps)} forward passes, our layer and raw llama.cpp x{replays}")
    ours = replay_ours(llm, rec, steps)
    ops = [list(o) for o in rec.ops]  # what our layer asked llama.cpp to do
    # the same llama.cpp context (and batch buffer), driven without our layer; each
    # replay starts from an empty KV cache, ours from clean caches (clear_cache)
    eng = llm.engine.context  # the llama.cpp context (genlm_llamacpp.llama_context)
    raw_replay = RawReplay(eng.ctx, eng.batch, eng.n_batch)
    raw = raw_replay.run(ops)
    for _ in range(replays - 1):
        ours = [min(a, b) for a, b in zip(ours, replay_ours(llm, rec, steps, record=False))]
        raw = [min(a, b) for a, b in zip(raw, raw_replay.run(ops))]
    llm.clear_cache()  # the prefix cache's sequences no longer match the KV cache
    ratios = [o / r for o, r in zip(ours, raw) if r > 0]
    decodes = [op for step in ops for op in step if op[0] == "decode"]
    return {
        "steps": len(steps),
        "decodes": len(decodes),
        "tokens_decoded": sum(len(op[1]) for op in decodes),
        "llama_cpp_calls": sum(len(step) for step in ops),
        "ours_s": sum(ours),
        "raw_s": sum(raw),
        "ours_over_raw": sum(ours) / sum(raw),
        "median_step_ratio": statistics.median(ratios),
        "ours_ms_per_step": 1e3 * sum(ours) / len(ours),
        "raw_ms_per_step": 1e3 * sum(raw) / len(raw),
    }
