"""genlm-hf's peak memory at a long-prompt shape, from a harness of its own (issue 69, item 8).

The long-prompt benchmark reads its peak RSS inside its own worker (its workload module,
its prefix tree, its progress file). This harness shares none of that: a fresh process
that imports torch and genlm-core, loads genlm-hf through the public API
(``genlm_core.load("hf", model=...)``, its defaults), and runs its own SIS written here
(every particle's ``next_token_logprobs`` gathered each step, a token drawn from the row,
``--tokens`` steps from the ``--prompt``), with ``--threads`` threads. It reads the
process's ``VmRSS``/``VmHWM`` at each phase and says where the peak goes:

  python, torch, genlm-core   RSS after the imports (before the model)
  model                       the model's tensors (parameters + buffers, their bytes) and
                              the load's RSS growth
  KV pool                     genlm-hf's pool: reserved bytes and bytes touched (pages
                              written: what is resident of it)
  the run                     RSS growth over the run beyond the pool's touched bytes
                              (rows, logits, activations, the caches)
  allocator                   glibc's ``mallinfo2``: bytes malloc holds free (``fordblks``:
                              returned to no one) after the run, and the RSS after
                              ``malloc_trim(0)`` (what the allocator gives back)

Output: ``rss_hf.json`` and ``rss_hf.md`` in ``$GENLM_BENCH_OUT`` or ``benchmarks/out``.
The target (issue 69, item 8): peak RSS <= 1.5 GB (1.5e9 bytes) at 907 x 32 x 30.

Usage::

    .venv/bin/python benchmarks/bench_rss_hf.py                       # 907 x 32 x 30, 2 threads
    .venv/bin/python benchmarks/bench_rss_hf.py --prompt 4096 --particles 64
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
#: the target, bytes (1.5 GB)
TARGET_BYTES = 1.5e9


def status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _libc() -> Any:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def mallinfo() -> dict[str, int]:
    libc = _libc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        return {}
    libc.mallinfo2.restype = _Mallinfo2
    m = libc.mallinfo2()
    return {name: int(getattr(m, name)) for name, _ in _Mallinfo2._fields_}


def malloc_trim() -> bool:
    libc = _libc()
    return bool(libc is not None and hasattr(libc, "malloc_trim") and libc.malloc_trim(0) is not None)


async def sis(llm: Any, prompt: list[int], particles: int, tokens: int, seed: int) -> int:
    """Own SIS: each step, every live particle's row gathered, one token drawn from it."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    eos = set(getattr(llm, "eos_token_ids", []) or [])
    contexts = [list(prompt) for _ in range(particles)]
    live = list(range(particles))
    calls = 0
    for _ in range(tokens):
        if not live:
            break
        rows = await asyncio.gather(*[llm.next_token_logprobs(contexts[i]) for i in live])
        calls += len(rows)
        nxt = []
        for i, row in zip(live, rows):
            p = torch.as_tensor(row).float().cpu().exp()
            tok = int(torch.multinomial(p, 1, generator=gen))
            contexts[i].append(tok)
            if tok not in eos:
                nxt.append(i)
        live = nxt
    return calls


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompt", default="907", help="a prompt of long_prompts.PROMPTS")
    p.add_argument("--particles", type=int, default=32)
    p.add_argument("--tokens", type=int, default=30)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", type=Path, default=None)
    p.add_argument("--options", default="{}", help="more genlm_core.load options, JSON")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    phases: dict[str, dict[str, int]] = {}

    def mark(name: str) -> None:
        phases[name] = {"rss": status("VmRSS"), "peak": status("VmHWM")}

    mark("python")
    import torch

    import genlm_core
    from genlm_core import models

    torch.set_num_threads(args.threads)
    mark("imports")
    sys.path.insert(0, str(HERE))
    from long_prompts import PROMPTS

    folder = args.model or models.smollm2_path(progress=False)
    t0 = time.perf_counter()
    llm = genlm_core.load("hf", model=str(folder), **json.loads(args.options))
    load_s = time.perf_counter() - t0
    mark("load")
    prompt = [int(i) for i in llm.tokenizer.encode(PROMPTS[args.prompt].text(), add_special_tokens=False)]
    t0 = time.perf_counter()
    calls = asyncio.run(sis(llm, prompt, args.particles, args.tokens, args.seed))
    run_s = time.perf_counter() - t0
    mark("run")
    eng = llm.stats().get("engine", {})
    model_bytes = 0
    model = getattr(getattr(llm, "engine", None), "model", None)
    if model is not None:
        seen: set[int] = set()
        for t in list(model.parameters()) + list(model.buffers()):
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                model_bytes += t.numel() * t.element_size()
        for m in model.modules():  # packed linear weights are opaque tensors, not parameters
            packed = getattr(m, "packed", None)
            if isinstance(packed, torch.Tensor):
                model_bytes += packed.numel() * packed.element_size()
    info = mallinfo()
    trimmed = malloc_trim()
    mark("after malloc_trim")
    peak = phases["run"]["peak"]
    result = {
        "shape": f"{args.prompt}x{args.particles}x{args.tokens}",
        "prompt_tokens": len(prompt),
        "threads": args.threads,
        "calls": calls,
        "load_s": load_s,
        "run_s": run_s,
        "phases": phases,
        "model_bytes": model_bytes,
        "kv_pool_bytes": eng.get("kv_pool_bytes"),
        "kv_pool_bytes_touched": eng.get("kv_pool_bytes_touched"),
        "kv_pool_bytes_in_use": eng.get("kv_pool_bytes_in_use"),
        "tokens_computed": eng.get("tokens_computed"),
        "mallinfo_after_run": info,
        "malloc_trimmed": trimmed,
        "peak_bytes": peak,
        "target_bytes": TARGET_BYTES,
        "met": peak <= TARGET_BYTES,
    }
    gb = 1e9
    touched = result["kv_pool_bytes_touched"] or 0
    rows = [
        ("python alone", phases["python"]["rss"]),
        ("after importing torch and genlm-core", phases["imports"]["rss"]),
        (
            f"after the load ({load_s:.1f} s); the model's tensors {model_bytes / gb:.3f} GB",
            phases["load"]["rss"],
        ),
        (f"peak after the run ({calls} calls, {run_s:.1f} s)", peak),
        (
            f"RSS after the run; KV pool touched {touched / gb:.3f} GB of {((result['kv_pool_bytes'] or 0) / gb):.3f} reserved",
            phases["run"]["rss"],
        ),
        (
            f"malloc's free bytes held after the run (fordblks {info.get('fordblks', 0) / gb:.3f} GB); RSS after malloc_trim",
            phases["after malloc_trim"]["rss"],
        ),
    ]
    md = (
        f"## genlm-hf's memory at {result['shape']} (bench_rss_hf.py, own SIS, public API, {args.threads} threads)\n\n"
        "| phase | RSS GB |\n|---|---:|\n"
        + "\n".join(f"| {what} | {v / gb:.3f} |" for what, v in rows)
        + f"\n\npeak RSS **{peak / gb:.3f} GB** (target <= {TARGET_BYTES / gb} GB: {'met' if result['met'] else 'not met'}); "
        f"the run's growth over the load {(peak - phases['load']['rss']) / gb:.3f} GB, of which the pool's touched pages "
        f"{touched / gb:.3f} GB\n"
    )
    out = args.out or Path(os.environ.get("GENLM_BENCH_OUT") or HERE / "out") / "rss_hf.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    out.with_suffix(".md").write_text(md)
    print(md)
    return result


if __name__ == "__main__":
    main()
