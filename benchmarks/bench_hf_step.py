"""The hf backend's own step against the raw transformers forward, in one run.

An SIS-like step: ``B`` rows, each a context of ``--past`` tokens whose KV is cached and
one new token. Three ways to get the ``B`` next-token rows, timed in turns (round robin,
so drift on a shared machine hits all three alike):

  raw      transformers alone: the model on the ``B`` new tokens with the batch's past
           in a ``DynamicCache`` (cropped back to the past after each step), the LM head
           on the last position, ``log_softmax`` in float32 of the first ``vocab`` logits
           (the least work that gives the same rows);
  step     the hf backend as SIS runs it: ``B`` concurrent ``next_token_logprobs`` calls
           (its batcher, KV lookup and assembly, the forward, each row's KV stored, the
           rows normalised and put in its output cache, every caller its own row);
  batch    ``batch_next_token_logprobs_sync`` of the ``B`` contexts (the rows stacked).

After the turns, ``step_alone_ms``: the step again, ``--repeat`` times one after another
(no other way's call between two steps, as a program's loop runs them).

Each new step asks new tokens, so no output cache answers; the backend's KV reuse finds
every past. Reported per ``B``: the median wall time and the median CPU time of the
process (all threads: the work done, much less disturbed by other jobs than the wall
time), the backend's time in its model call (forward hooks) and the ratios to raw. The
rows of ``raw`` and ``step`` are compared once (the bound derived from the arithmetic,
:mod:`genlm_core.testing.tolerance`: the batch runs with an attention mask and
padding-free KV slots; the same sums, another order). The batch dependence: the first
:data:`ALONE` rows of that step against each context run alone (a fresh single-row
forward), with the smallest of their derived bounds (``batch_vs_alone_*``).

``--grow`` runs the step as a SIS/SMC program does: each way keeps its own ``B`` row
contexts (``step``'s, ``batch``'s and raw's, all started from the same pasts) and every
call extends each row by one new token, so a way's call ``N`` asks contexts of ``past + N``
tokens (the warmup calls count); raw's ``DynamicCache`` grows (never cropped). That is
the shape of a program's particles: each call forks its rows' pages and writes one
column each (``genlm_hf.pool``; the decode step, ``genlm_hf.step``, on CUDA by default).
The backend is loaded with ``batch_size=max(64, B)`` in both modes; under ``--grow``
the ``step`` and ``batch`` ways each keep ``B`` contexts. Before timing, raw and
``step`` run once on the same one-token extension (``batch`` once on another token of its
own, so every way starts the timed calls at the same length), and those rows are compared.
Every result row records ``grow``; ``--grow`` writes ``hf_step_grow.*`` (with the engine's
decode-step and pool counters) instead of ``hf_step.*``.

``--options`` passes more load() options as JSON (``'{"cache_size": 0}'``: the step
without the output cache, whose copy of each row a GPU makes in the step).

``--device``, ``--dtype`` and ``--model`` pick where and what (default: the embedded
SmolLM2-135M, float32, on the CPU); on a GPU every timed call ends with
``torch.cuda.synchronize()``, the forward hooks synchronise too (the model time is the
kernels', not their launch), and each row records ``torch.cuda.max_memory_allocated``.
A comparison of the rows that fails is recorded in its row (``rows_check``) and makes
the exit status 1, after the results are written.

Results: ``benchmarks/out/hf_step.json`` and ``hf_step.md`` (``hf_step_grow.*`` under
``--grow``; both name the device and dtype). Run on a quiet machine.

Usage::

    .venv/bin/python benchmarks/bench_hf_step.py                 # SmolLM2-135M, 16 and 64 rows
    .venv/bin/python benchmarks/bench_hf_step.py --quick         # tiny model, smoke run
    .venv/bin/python benchmarks/bench_hf_step.py --grow          # contexts growing, as SIS's
    python benchmarks/bench_hf_step.py --device cuda --dtype bfloat16 --model DIR
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import verdicts  # noqa: E402
from common import device_info, load_options, write_results  # noqa: E402

TARGET = 1.1
#: rows of a step compared with their contexts run alone (the batch dependence)
ALONE = 8
#: graph_account.py's figures, in the table where measured
ACCOUNT = (
    "account_bucket",
    "graph_replay_ms",
    "step_host_ms",
    "step_kernels",
    "step_kernel_ms",
    "eager_step_ms",
    "compile_s",
    "compiled_graph_replay_ms",
    "compiled_kernels",
    "compiled_kernel_ms",
    "compiled_step_ms",
    "compiled_max_abs_diff",
    "compiled_error",
)
#: the hf engine's counters recorded under --grow (the decode step's and the pool's)
RESIDENT = (
    "static_steps",
    "static_captured",
    "static_capture_failed",
    "static_declined",
    "pool_passes",
    "span_rows",
    "kv_pool_copied_columns",
    "fused_decode",
)


#: host_account.py's figures, in the table where measured (host_ops_top: in the JSON)
HOST = (
    "host_step_ms",
    "host_validate_ms",
    "host_batch_ms",
    "host_forward_ms",
    "host_model_step_ms",
    "host_normalise_ms",
    "host_device_wait_ms",
    "host_row_check_ms",
    "host_row_copies_ms",
    "host_cache_ms",
    "host_outside_batch_ms",
    "host_before_batch_ms",
    "host_after_batch_ms",
    "host_per_row_us",
    "host_ops",
    "host_new_segments",
)


def log(msg: str) -> None:
    print(f"[bench_hf_step {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def measure(args: argparse.Namespace, rows: int) -> dict[str, Any]:
    import torch
    from genlm_hf.cache_names import cache_kwarg, output_cache
    from transformers import DynamicCache

    import genlm_core

    cuda = torch.device(args.device).type == "cuda"
    grow = args.grow

    def sync() -> None:  # a GPU runs the kernels after the call returns: time them whole
        if cuda:
            torch.cuda.synchronize(args.device)

    if cuda:
        torch.cuda.reset_peak_memory_stats(args.device)
    extra: dict[str, Any] = {"static_decode": args.static_decode} if args.static_decode else {}
    if args.fused_decode:
        extra["fused_decode"] = args.fused_decode == "on"
    if args.forward_thread:
        extra["forward_thread"] = args.forward_thread == "on"
    extra.update(args.options)
    llm = genlm_core.load(
        "hf", model=args.model, dtype=args.dtype, device=args.device, batch_size=max(64, rows), **extra
    )
    model, vocab = llm.engine.model, llm.vocab_size
    gen = torch.Generator().manual_seed(rows)
    # --shared-prompt: every row's past starts with the same prompt (particles of one prompt)
    prompt = tuple(torch.randint(100, vocab - 100, (args.shared_prompt,), generator=gen).tolist())
    pasts = [
        prompt + tuple(torch.randint(100, vocab - 100, (args.past,), generator=gen).tolist())
        for _ in range(rows)
    ]
    if prompt:  # the prompt computed once first, as a program asks it before its particles
        llm.next_token_logprobs_sync(list(prompt))
    llm.batch_next_token_logprobs_sync(pasts)  # the pasts' KV, in the backend's cache
    with torch.inference_mode():
        ids = torch.tensor(pasts, device=model.device)
        cache: DynamicCache = output_cache(model(input_ids=ids, use_cache=True))

    def raw(tok: int) -> Any:
        with torch.inference_mode():
            if not grow:  # the fixed past: every step asks it again; under --grow it grows
                cache.crop(args.shared_prompt + args.past)
            out = model(
                input_ids=torch.full((rows, 1), tok, device=model.device),
                **{cache_kwarg(model): cache},
                use_cache=True,
                logits_to_keep=1,
            )
            row = torch.log_softmax(out.logits[:, -1, :vocab].to(torch.float32), dim=-1)
            sync()
            return row

    async def step_async(ctxs: list[tuple[int, ...]]) -> list[Any]:
        return await asyncio.gather(*(llm.next_token_logprobs(c) for c in ctxs))

    loop = asyncio.new_event_loop()  # one loop for every step, as a program keeps its own

    # each way's own row contexts: the pasts, and under --grow every call's token after them
    ctxs = {"step": list(pasts), "batch": list(pasts)}

    def asked(way: str, tok: int) -> list[tuple[int, ...]]:
        new = [c + (tok,) for c in ctxs[way]]
        if grow:
            ctxs[way] = new
        return new

    def step(tok: int) -> Any:
        return loop.run_until_complete(step_async(asked("step", tok)))

    def batch(tok: int) -> Any:
        return llm.batch_next_token_logprobs_sync(asked("batch", tok))

    want = raw(vocab - 1)  # (under --grow: raw and step both now at the pasts + this token)
    got = torch.stack(step(vocab - 1))
    if grow:  # batch to the same length on a token of its own (step's rows would answer it)
        batch(vocab - 2)
    # the same network in another batch layout: the bound derived from the arithmetic
    from genlm_core.testing.tolerance import assert_backend_close, row_diff

    try:
        max_diff = assert_backend_close(llm, got, want, "the backend's rows against transformers'")
        rows_check, detail = "ok", ""
    except AssertionError as e:  # recorded, and the exit status says so after the results
        max_diff, rows_check, detail = row_diff(got, want), "FAILED", str(e)
        log(f"rows check failed: {detail}")
    # batch dependence: the first rows of that batch against each context run alone
    # (a fresh single-row forward in the backend's dtype), and the derived bound for them
    from genlm_core.testing.tolerance import model_shape, row_atol, row_magnitude

    k = min(rows, ALONE)
    alone = torch.stack([llm.next_token_logprobs_uncached(list(p) + [vocab - 1]) for p in pasts[:k]])
    alone_diff = row_diff(got[:k], alone)
    alone_bound = min(
        row_atol(model_shape(llm), row_magnitude(r), str(llm.dtype)) for r in alone.to(torch.float32)
    )
    in_model: list[float] = []
    timing = [False]

    def timed() -> bool:  # never inside a CUDA graph's capture: a sync there breaks it
        return timing[0] and not (cuda and torch.cuda.is_current_stream_capturing())

    def pre(*_: Any) -> None:
        if timed():
            sync()
            in_model.append(-time.perf_counter())

    def post(*_: Any) -> None:
        if timed():
            sync()
            in_model[-1] += time.perf_counter()

    hooks = [model.register_forward_pre_hook(pre), model.register_forward_hook(post)]
    fused = getattr(getattr(llm.engine, "step", None), "fused", None)
    if fused is not None:  # genlm_hf.fused runs a Llama's decode step without model.forward
        step_fn = fused.step

        def fused_step(*a: Any) -> Any:
            pre()
            try:
                return step_fn(*a)
            finally:
                post()

        fused.step = fused_step
    ways = {"raw": raw, "step": step, "batch": batch}
    wall: dict[str, list[float]] = {w: [] for w in ways}
    cpu: dict[str, list[float]] = {w: [] for w in ways}
    model_s: list[float] = []
    tok = 1000 if vocab > 2000 else vocab // 4  # the tiny models have 1,024 tokens
    for rep in range(args.warmup + args.repeat):
        for name, fn in ways.items():
            tok += 1
            timing[0] = name == "step"
            in_model.clear()
            sync()
            c0, w0 = time.process_time(), time.perf_counter()
            fn(tok)
            sync()
            w1, c1 = time.perf_counter(), time.process_time()
            if rep >= args.warmup:
                wall[name].append(w1 - w0)
                cpu[name].append(c1 - c0)
                if name == "step":
                    model_s.append(sum(in_model))
    timing[0] = False
    # the step alone: the same number of steps again, one after another (no raw or batch
    # call between them, as a program's loop runs): on the H200 the round robin's 135M step
    # took 7.3 ms where the host account's steps, one after another, took 5.9
    alone_s: list[float] = []
    for _ in range(args.repeat):
        tok += 1
        sync()
        w0 = time.perf_counter()
        step(tok)
        sync()
        alone_s.append(time.perf_counter() - w0)
    for h in hooks:
        h.remove()
    if fused is not None:
        del fused.step  # the class's own again
    engine = llm.stats().get("engine", {})  # (read before close: the timed steps' counters)
    account: dict[str, Any] = {}
    if args.graph_account or args.compile_probe:  # the largest block's step alone
        from graph_account import account as graph_account

        account.update(graph_account(llm, compile_probe=args.compile_probe))
    if args.host_account:  # the step's host part, by stage: more steps, after the graph's
        # account (whose bucket is then the timed steps')
        from host_account import account as host_account

        new_tokens = iter(range(100, vocab))  # (contexts grow, so any token is a new context)

        def next_step() -> None:
            step(next(new_tokens))

        account.update(host_account(llm, next_step, rows))
    llm.close()
    pending = asyncio.all_tasks(loop)  # the batcher's worker, told to stop by close()
    for task in pending:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    loop.close()
    out: dict[str, Any] = {
        "rows": rows,
        "past": args.past,
        "shared_prompt": args.shared_prompt,
        "grow": grow,
        "max_abs_diff": max_diff,
        "rows_check": rows_check,
        "batch_vs_alone_max_abs_diff": alone_diff,
        "batch_vs_alone_bound": alone_bound,
        "batch_vs_alone_rows": k,
    }
    if detail:
        out["rows_check_detail"] = detail
    if grow:  # the contexts' length at the last timed call; how the engine placed the rows
        out["last_len"] = args.shared_prompt + args.past + 1 + args.warmup + args.repeat
        out.update({k: engine[k] for k in RESIDENT if k in engine})
    if cuda:
        out["gpu_max_allocated_mb"] = torch.cuda.max_memory_allocated(args.device) / 2**20
    for name in ways:
        out[f"{name}_ms"] = 1e3 * statistics.median(wall[name])
        out[f"{name}_cpu_ms"] = 1e3 * statistics.median(cpu[name])
    out["step_alone_ms"] = 1e3 * statistics.median(alone_s)
    out["step_model_ms"] = 1e3 * statistics.median(model_s)
    out["step_outside_model_ms"] = out["step_ms"] - out["step_model_ms"]
    out.update(account)
    if "graph_replay_ms" in account:  # the host's part of a step: the rest
        out["step_host_ms"] = out["step_ms"] - account["graph_replay_ms"]
    for name in ("step", "batch"):
        out[f"{name}_over_raw"] = out[f"{name}_ms"] / out["raw_ms"]
        out[f"{name}_over_raw_cpu"] = out[f"{name}_cpu_ms"] / out["raw_cpu_ms"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2-135M)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ... (default: cpu)")
    ap.add_argument("--dtype", default="float32", help="the model's dtype (float32, bfloat16, float16)")
    ap.add_argument("--rows", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--past", type=int, default=20, help="cached tokens before each row's new one")
    ap.add_argument(
        "--shared-prompt",
        type=int,
        default=0,
        help="a prompt of this many tokens before every row's past (particles of one prompt: "
        "genlm-hf holds and reads it once; raw transformers holds it in every row)",
    )
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads")
    ap.add_argument("--quick", action="store_true", help="tiny model, 4 and 16 rows, 4 repeats")
    ap.add_argument(
        "--static-decode",
        choices=["auto", "on", "off"],
        default=None,
        help="the hf engine's static_decode (default: its own, auto: on CUDA only)",
    )
    ap.add_argument(
        "--fused-decode",
        choices=["on", "off"],
        default=None,
        help="the hf engine's fused_decode (default: on; a Llama's static step in fewer kernels)",
    )
    ap.add_argument(
        "--forward-thread",
        choices=["on", "off"],
        default=None,
        help="the batches in the batcher's worker thread or on the event loop (default: the engine's: "
        "a thread on a GPU, inline on the CPU)",
    )
    ap.add_argument(
        "--options",
        type=load_options,
        default={},
        help="more load() options for the backend, as JSON (e.g. '{\"cache_size\": 0}': no output cache)",
    )
    ap.add_argument(
        "--grow",
        action="store_true",
        help="each way's row contexts grow by one token a call, as SIS's do (writes hf_step_grow.*)",
    )
    ap.add_argument(
        "--graph-account",
        action="store_true",
        help="after the steps, the largest decode-step bucket's step alone: graph replay, kernels (graph_account.py)",
    )
    ap.add_argument(
        "--host-account",
        action="store_true",
        help="after the steps, a few more with timers around the backend's stages (host_account.py)",
    )
    ap.add_argument(
        "--compile-probe",
        action="store_true",
        help="with --graph-account: that step under torch.compile too (compile time, kernels, replay)",
    )
    args = ap.parse_args(argv)
    if args.quick:
        sys.path.insert(0, str(HERE.parent / "tests"))
        import model_paths

        args.model = args.model or str(model_paths.tiny_llama())
        args.rows, args.repeat, args.warmup = [4, 16], 4, 1
    if args.model is None:
        from genlm_core import models

        args.model = str(models.smollm2_path(progress=True))
    import torch

    torch.set_num_threads(args.threads)
    results = []
    for rows in args.rows:
        shape = f"growing from {args.past} + 1" if args.grow else f"of {args.past} + 1"
        log(f"{rows} rows {shape} tokens ({args.model}, {args.device} {args.dtype}, {args.threads} threads)")
        results.append(measure(args, rows))
    device = device_info(args.device, args.dtype, args.model)
    name = "hf_step_grow" if args.grow else "hf_step"
    resident = [k for k in RESIDENT if k in results[0]]
    write_results(
        name,
        results,
        {"config": vars(args), "target": f"step / raw <= {TARGET}"},
        device=device,
        title=f"{name} (grow: {str(args.grow).lower()})",
        cols=[
            "rows",
            "grow",
            *(["last_len"] if args.grow else []),
            "raw_ms",
            "step_ms",
            "step_alone_ms",
            "batch_ms",
            "step_over_raw",
            "batch_over_raw",
            "step_over_raw_cpu",
            "step_model_ms",
            "step_outside_model_ms",
            *(["gpu_max_allocated_mb"] if "gpu_max_allocated_mb" in results[0] else []),
            *resident,
            "rows_check",
            "max_abs_diff",
            "batch_vs_alone_max_abs_diff",
            "batch_vs_alone_bound",
            *[k for k in ACCOUNT if any(k in r for r in results)],
            *[k for k in HOST if any(k in r for r in results)],
        ],
    )
    failed = [r["rows"] for r in results if r["rows_check"] != "ok"]
    if failed:
        log(f"the rows' comparison failed at {failed} rows (see rows_check)")
    return 1 if failed else 0


def headline(result: dict) -> list[dict]:
    """The summary's rows from ``hf_step.json`` (or ``hf_step_grow.json``): the backend's
    step over raw transformers."""
    out = []
    for r in result["rows"]:
        shape = f"growing from {r['past']}+1" if r.get("grow") else f"of {r['past']}+1"
        out.append(
            verdicts.row(
                f"hf step, {r['rows']} rows {shape} tokens: wall ms, backend vs raw transformers",
                r["step_ms"],
                r["raw_ms"],
                r["step_over_raw"],
                f"<= {TARGET}",
                r["step_over_raw"] <= TARGET,
            )
        )
    return out


if __name__ == "__main__":
    sys.exit(main())
