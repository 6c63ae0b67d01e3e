"""The main job (`genlm demo`): what genlm-core does, on a real model, with no model hub.

1. Autobatched sequential importance sampling (genlm-backend's README example):
   prompt "Montreal is", 10 particles; strings with normalised probabilities and
   how many next-token calls were batched into how many forward passes.
2. A byte-level continuation (beam over tokenizations) and the bits per byte of a
   sentence.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

__all__ = ["byte_demo", "sis_demo", "main"]

SENTENCE = "The quick brown fox jumps over the lazy dog."


async def byte_demo(
    llm: Any,
    prompt: str,
    n_bytes: int = 40,
    k: int = 5,
    bpb_text: str | None = None,
    show_dist: bool = False,
    progress: bool = True,
) -> str:
    """Greedy byte-level continuation of ``prompt`` (beam width ``k``), optionally the
    next-byte distribution after the prompt and the bits per byte of ``bpb_text``
    (progress bars on stderr, like :func:`sis_demo`)."""
    from genlm_core.bytes import BeamParams, ByteBeamState

    lines = []
    async with await ByteBeamState.initial(llm, BeamParams(K=k, prune_threshold=0.0)) as beam:
        t0 = time.perf_counter()
        out = await beam.greedy(prompt.encode("utf-8"), n_bytes, progress=progress)
        dt = time.perf_counter() - t0
        lines.append(f"Byte-level greedy continuation (K={k}, {n_bytes} bytes max, {dt:.1f} s):")
        lines.append(f"  {out.decode('utf-8', errors='replace')!r}")
        if show_dist:
            after = await beam.prefill(prompt.encode("utf-8"), progress=progress)
            dist = await after.logp_next()
            lines.append(f"Next-byte distribution after {prompt!r}:")
            lines.append("  " + dist.pretty(10).replace("\n", "\n  "))
        if bpb_text:
            bpb = await beam.bits_per_byte(bpb_text.encode("utf-8"), progress=progress)
            lines.append(f"Bits per byte of {bpb_text!r}: {bpb:.3f}")
    return "\n".join(lines)


async def sis_demo(llm: Any, prompt: str, particles: int, max_tokens: int, seed: int) -> str:
    """Autobatched SIS from ``prompt`` (progress bar on stderr); its report."""
    from genlm_core.tools.sis import run_sis

    result = await run_sis(
        llm, prompt, n_particles=particles, max_tokens=max_tokens, seed=seed, progress=True
    )
    return result.report()


async def _run(llm: Any, args: argparse.Namespace) -> None:
    print(
        f"\n== Autobatched SIS: prompt {args.prompt!r}, {args.particles} particles, "
        f"up to {args.max_tokens} tokens =="
    )
    print(await sis_demo(llm, args.prompt, args.particles, args.max_tokens, args.seed))
    print("\n== Byte-level language model ==")
    print(await byte_demo(llm, "An apple a day keeps the", n_bytes=args.n_bytes, k=5, bpb_text=SENTENCE))


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The demo's options (``genlm demo`` and ``python -m genlm_core.tools.demo``)."""
    from genlm_core.tools.cli_options import POSITIVE, SEED, add_model_arguments

    add_model_arguments(ap)
    ap.add_argument("--prompt", default="Montreal is")
    ap.add_argument("--particles", type=POSITIVE, default=10)
    ap.add_argument("--max-tokens", type=POSITIVE, default=20)
    ap.add_argument("--n-bytes", type=POSITIVE, default=30)
    ap.add_argument("--seed", type=SEED, default=0)


def run(args: argparse.Namespace) -> int:
    """Load the model ``args`` name (default: the embedded SmolLM2) and run the demo."""
    import genlm_core
    from genlm_core import models
    from genlm_core.tools.cli_options import parse_opts

    opts = parse_opts(args.opt)
    model = args.model or str(models.smollm2_path(progress=True))
    reg = genlm_core.resolve(args.backend)
    print(
        f"Backend: {reg.name} ({reg.distribution} {reg.version})"
        + (
            f", chosen for this machine: {genlm_core.explain_auto()['device']}"
            if args.backend == "auto"
            else ""
        )
    )
    print(f"Model: {model}" + (f"; options {opts}" if opts else ""))
    t0 = time.perf_counter()
    llm = genlm_core.load(args.backend, model=model, **opts)
    print(f"Loaded in {time.perf_counter() - t0:.1f} s; vocabulary of {len(llm.byte_vocab)} tokens")
    try:
        asyncio.run(_run(llm, args))
    finally:
        llm.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    from genlm_core.engine.progress import show_notes

    ap = argparse.ArgumentParser(prog="genlm demo", description=__doc__)
    add_arguments(ap)
    args = ap.parse_args(argv)
    with show_notes():  # what the model load is doing, on stderr (as `genlm demo` does)
        return run(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
