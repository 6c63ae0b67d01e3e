"""Bursts vs steps: the SIS program as per-step calls and as one burst (docs/bursts.md).

The steps program is genlm-backend's README SIS (``sis_workload.sis``: each particle
awaits its own ``next_token_logprobs`` and draws its own token). The burst runs the same
SIS (the same length mask, EOS forced after ``max_tokens``, weights ``log Z`` of the
masked row) as an ``EngineControl`` whose ``draw`` handles every live row of a step at
once: ``burst`` draws them with ``genlm_core.engine.sampling.draw_rows`` (as
docs/bursts.md writes a control), ``burst_multinomial`` with the steps program's own
``torch.multinomial`` (what the burst gains without the batched sampler). All from
clean caches, SmolLM2-135M: hf float32 (its decode batches keep the KV between steps)
and llama.cpp on its f16 GGUF (the core's decode step over its sequences); with
``--engines vllm``, vLLM-CPU float32 (each row a streaming-input session).
``--model``, ``--device`` and ``--dtype`` choose hf's (and vLLM's) model folder, device and
dtype (default: the embedded SmolLM2, float32, CPU; llama.cpp keeps its SmolLM2 f16 GGUF).
On a GPU the draws run on the rows' device (``burst_multinomial`` copies the rows to the
CPU first, as the steps program does), and the engine clock synchronises after each call.
The results name the device and dtype.

Before the timed runs, one untimed run of ``steps`` and one of ``burst`` at the same
particle count (on a GPU: the static step's graphs captured; every run then starts from
cleared caches, which keep them). Where a step's time goes: ``engine_s`` is the time inside the engine's ``forward`` or
``decode_step`` (measured by wrapping them), ``draw_s`` the burst control's draws, and
``other_s`` the rest (batcher, row copies, the program, its draws in ``steps``).

    .venv/bin/python benchmarks/bench_burst.py                  # 16 and 64 particles x 20 tokens
    .venv/bin/python benchmarks/bench_burst.py --quick          # hf, 16 x 8, one run
    python benchmarks/bench_burst.py --engines hf --device cuda --dtype bfloat16 --model DIR
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import verdicts  # noqa: E402
from common import device_info, write_results  # noqa: E402
from sis_workload import sis  # noqa: E402

ENGINES = ("hf", "f16")  # the default run
#: vllm: SmolLM2 float32 on vLLM-CPU, its rows as streaming-input sessions (genlm_vllm.sessions)
#: vllm_nonresident: the same with resident=False (each call a new request: the path
#: before genlm_vllm's resident rows), for before/after in one run
CHOICES = ENGINES + ("vllm", "vllm_nonresident")
#: steps: the README SIS, each particle drawing its own token (torch.multinomial);
#: burst: the same SIS as a control drawing every row of a step at once (draw_rows);
#: burst_multinomial: that control drawing with the steps program's torch.multinomial
MODES = ("steps", "burst", "burst_multinomial")
PROMPT = "Here is a short story about a robot who learns to paint:"
TARGETS = {16: 1.3, 64: 1.5}


def log(msg: str) -> None:
    print(f"[bench_burst {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def load(engine: str, args: argparse.Namespace) -> Any:
    import genlm_core
    from genlm_core import models

    model = args.model or str(models.smollm2_path(progress=False))
    if engine == "hf":
        extra = {"static_decode": args.static_decode} if args.static_decode else {}
        return genlm_core.load("hf", model=model, dtype=args.dtype, device=args.device, **extra)
    if engine in ("vllm", "vllm_nonresident"):
        return genlm_core.load("vllm", model=model, dtype=args.dtype, resident=engine == "vllm")
    from genlm_llamacpp.convert import smollm2_f16_gguf_path

    return genlm_core.load(
        "llamacpp", model=str(smollm2_f16_gguf_path(progress=True)), n_threads=args.threads
    )


class EngineClock:
    """Seconds spent inside the engine's ``forward``/``forward_rows`` and its own ``decode_step`` (wrapped on
    the instance; a call inside another counts once). ``sync``: called after each
    outermost call (a GPU's ``torch.cuda.synchronize``: the kernels' time, not their launch)."""

    def __init__(self, engine: Any, sync: Any = None) -> None:
        self.seconds = 0.0
        self._depth = 0
        self._sync = sync
        names = ["forward"]
        if "resume" in engine.supports:  # rows the core hands an engine resuming from kept KV
            names.append("forward_rows")
        if "decode" in engine.supports:  # a decode step of the engine's own
            names.append("decode_step")
        for name in names:
            setattr(engine, name, self._timed(getattr(engine, name)))

    def _timed(self, inner: Any) -> Any:
        def timed(*args: Any) -> Any:
            self._depth += 1
            t0 = time.perf_counter()
            try:
                return inner(*args)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    if self._sync is not None:
                        self._sync()
                    self.seconds += time.perf_counter() - t0

        return timed


class SISControl:
    """The SIS of ``sis_workload.sis`` as an EngineControl: one batched draw a step."""

    def __init__(
        self,
        n: int,
        prompt: list[int],
        lengths: list[int],
        eos: int,
        max_tokens: int,
        seed: int,
        sampler: str = "rows",
    ) -> None:
        import torch

        from genlm_core.tools.sis import eos_mask, length_mask

        # the steps program's masks (sis_workload.sis): tokens of at most 10 bytes, then EOS
        self.valid = length_mask(lengths, eos, 10, min_token_length=0)
        self.eos_only = eos_mask(len(lengths), eos)
        self.eos, self.max_tokens = eos, max_tokens
        self.gen = torch.Generator().manual_seed(seed)
        self.length = [0] * n
        self.log_w = [0.0] * n
        self.adds = [(i, list(prompt), None) for i in range(n)]
        self.aborts: list[int] = []
        self.draw_s = 0.0
        self.sampler = sampler

    def draw(self, logits: Any, handles: list[int]) -> Any:
        import torch

        t0 = time.perf_counter()
        if self.valid.device != logits.device:  # the masks on the rows' device, once
            self.valid, self.eos_only = self.valid.to(logits.device), self.eos_only.to(logits.device)
        mask = torch.stack(
            [self.eos_only if self.length[h] >= self.max_tokens else self.valid for h in handles]
        )
        masked = logits + mask
        if self.sampler == "rows":  # one batched inverse-CDF draw, log Z with it (draw_rows)
            from genlm_core.engine.sampling import draw_rows

            drawn, log_z = draw_rows(masked, self.gen, with_log_mass=True)
        else:  # the steps program's sampler, on all rows at once (on the CPU, as it runs)
            masked = masked.float().cpu()
            log_z = masked.logsumexp(dim=-1, keepdim=True)
            drawn = torch.multinomial((masked - log_z).exp(), 1, generator=self.gen).view(-1)
        for h, tok, z in zip(handles, drawn.tolist(), log_z.view(-1).tolist()):
            self.log_w[h] += z
            if tok == self.eos:
                self.aborts.append(h)
            else:
                self.length[h] += 1
        self.draw_s += time.perf_counter() - t0
        return drawn

    def drain_adds(self) -> list:
        out, self.adds = self.adds, []
        return out

    def drain_aborts(self) -> list[int]:
        out, self.aborts = self.aborts, []
        return out

    def on_burst_end(self) -> None:
        pass


def one_run(
    llm: Any, clock: EngineClock, mode: str, n: int, prompt: list[int], args: argparse.Namespace, seed: int
) -> dict:
    lengths = [len(t) for t in llm.byte_vocab]
    eos = llm.eos_token_ids[0]
    llm.clear_cache()
    clock.seconds = 0.0
    t0 = time.perf_counter()
    if mode == "steps":
        res = asyncio.run(
            sis(
                llm.next_token_logprobs,
                lengths,
                eos,
                prompt,
                n_particles=n,
                max_tokens=args.max_tokens,
                seed=seed,
            )
        )
        calls, draw_s = res["calls"], None
    else:
        sampler = "multinomial" if mode == "burst_multinomial" else "rows"
        control = SISControl(n, prompt, lengths, eos, args.max_tokens, seed, sampler)
        report = llm.run_burst(control, max_steps=args.max_tokens + 2)
        calls, draw_s = report.rows_drawn, control.draw_s
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "calls": calls, "engine_s": clock.seconds, "draw_s": draw_s}


def measure(llm: Any, engine: str, n: int, prompt: list[int], args: argparse.Namespace) -> list[dict]:
    import torch

    sync = None
    if engine == "hf" and torch.device(args.device).type == "cuda":

        def sync() -> None:
            torch.cuda.synchronize(args.device)

    clock = EngineClock(llm.engine, sync)
    rows = []
    # warm-up at the timed runs' particle count: their batches land in the same buckets, so
    # on a GPU the static step's graphs are captured here (clear_cache keeps them), as a
    # program's later runs find them; the timed runs are the steady state
    one_run(llm, clock, "steps", n, prompt, args, seed=99)
    one_run(llm, clock, "burst", n, prompt, args, seed=99)
    for mode in MODES:
        runs = [one_run(llm, clock, mode, n, prompt, args, seed=args.seed + r) for r in range(args.repeats)]
        rate = statistics.median(r["calls"] / r["wall_s"] for r in runs)
        mid = sorted(runs, key=lambda r: r["calls"] / r["wall_s"])[len(runs) // 2]
        per_call = {
            k: (mid[k] / mid["calls"] * 1e3 if mid[k] is not None else None) for k in ("engine_s", "draw_s")
        }
        other = mid["wall_s"] - mid["engine_s"] - (mid["draw_s"] or 0.0)
        rows.append(
            {
                "engine": engine,
                "particles": n,
                "mode": mode,
                "calls_per_s": rate,
                "calls": mid["calls"],
                "wall_s": mid["wall_s"],
                "engine_ms_per_call": per_call["engine_s"],
                "draw_ms_per_call": per_call["draw_s"],
                "other_ms_per_call": other / mid["calls"] * 1e3,
                "runs": [r["calls"] / r["wall_s"] for r in runs],
            }
        )
        log(f"{engine} n={n} {mode}: {rate:.1f} calls/s ({rows[-1]})")
    rate = {r["mode"]: r["calls_per_s"] for r in rows}
    for mode in MODES[1:]:
        rows.append({"engine": engine, "particles": n, "mode": f"{mode}/steps", "calls_per_s": rate[mode] / rate["steps"],
                     "steps_calls_per_s": rate["steps"], "burst_calls_per_s": rate[mode]})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", nargs="+", default=list(ENGINES), choices=CHOICES)
    p.add_argument("--model", default=None, help="hf/vllm model folder (default: the embedded SmolLM2-135M)")
    p.add_argument("--device", default="cpu", help="hf's device: cpu, cuda, cuda:1, ... (default: cpu)")
    p.add_argument("--dtype", default="float32", help="hf's and vLLM's dtype (float32, bfloat16, float16)")
    p.add_argument(
        "--static-decode",
        choices=["auto", "on", "off"],
        default=None,
        help="hf's static_decode (default: the engine's, auto: on CUDA only)",
    )
    p.add_argument("--particles", nargs="+", type=int, default=[16, 64])
    p.add_argument("--max-tokens", type=int, default=20)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="hf, 16 particles x 8 tokens, one run")
    args = p.parse_args(argv)
    if args.quick:
        args.engines, args.particles, args.max_tokens, args.repeats = ["hf"], [16], 8, 1
    import torch

    torch.set_num_threads(args.threads)
    rows: list[dict] = []
    for engine in args.engines:
        llm = load(engine, args)
        try:
            prompt = llm.tokenizer.encode(PROMPT)
            for n in args.particles:
                rows += measure(llm, engine, n, prompt, args)
        finally:
            llm.close()
    result = {"rows": rows, "targets": {str(k): v for k, v in TARGETS.items()}, "max_tokens": args.max_tokens}
    hf_device = args.device if "hf" in args.engines else "cpu"  # llama.cpp and vLLM-CPU: the CPU
    device = device_info(hf_device, args.dtype, args.model or "SmolLM2-135M-Instruct")
    if "f16" in args.engines:
        device["dtype"] = f"{args.dtype} (hf, vllm); llama.cpp: its f16 GGUF"
    device["engines"] = args.engines
    result["config"] = dict(vars(args))
    cols = ["engine", "particles", "mode", "calls_per_s", "calls", "wall_s", "engine_ms_per_call",
            "draw_ms_per_call", "other_ms_per_call"]  # fmt: skip
    write_results("burst", [{c: r.get(c) for c in cols} for r in rows], result, cols, device=device)
    return result


def smoke(result: dict) -> list[str]:
    """Both modes ran for every engine and size and drew rows."""
    problems = []
    for r in result.get("rows", []):
        if "/" not in r["mode"] and not r.get("calls"):
            problems.append(f"burst {r['engine']} n={r['particles']} {r['mode']}: no rows drawn")
    if not any(r["mode"] == "burst/steps" for r in result.get("rows", [])):
        problems.append("burst: no burst/steps ratio")
    return problems


def headline(result: dict) -> list[dict]:
    """Burst over steps (calls/s) per engine and particle count, judged against the targets."""
    out = []
    for r in result.get("rows", []):
        if r["mode"] != "burst/steps":  # the target: the control as docs/bursts.md writes it
            continue
        want = result.get("targets", {}).get(str(r["particles"]))
        out.append(
            verdicts.row(
                f"burst vs steps, SIS {r['particles']} x {result.get('max_tokens')} ({r['engine']}), calls/s",
                r.get("burst_calls_per_s"),
                r.get("steps_calls_per_s"),
                r["calls_per_s"],
                f">= {want}x" if want else "",
                r["calls_per_s"] >= want if want else None,
            )
        )
    return out


if __name__ == "__main__":
    main()
