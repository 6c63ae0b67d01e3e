"""A genlm-control program, written the way its documentation shows.

It imports only ``genlm.control`` (and, through it, ``genlm.backend`` /
``genlm.bytes``), so the same file runs on genlm-core + genlm-compat and on the
reference genlm-backend 0.3.1 + genlm-bytes 0.2.0 stack. ``bench_control.py`` runs it
in both environments and compares wall times.

Usage: python control_program.py MODEL_FOLDER WORKLOAD [--seed N]
  WORKLOAD ``regex``: PromptedLLM + BoolFSA through AWRS, SMC with 10 particles, 30 tokens;
  WORKLOAD ``bytes``: the ByteLLM potential (K=5 beam) scoring a sentence byte by byte.
Prints one JSON line with the timings and what was produced.

Each workload then runs a second time in the same process with the same seeds (AWRS is
seeded, so the particles take the same path): every next-token row is already in the
backend's output cache, so that wall time (``cached_rerun_s``) is the program's own work
with a near-free language model - a lower bound on what any backend can reach.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import time

REGEX = r" (SMC|Sequential Monte Carlo) is (fast|slow|great|simple) with (LMs|language models)\."
PROMPT = "Here is my honest opinion about inference methods:"
SENTENCE = " Montreal is a city in Canada."


class LMWait:
    """Wall time during which at least one next-token call is in flight.

    Wraps the language model's ``next_token_logprobs`` and
    ``batch_next_token_logprobs`` on the instance (both stacks expose them), so the
    report can separate the backend's share from the client's own work.
    """

    def __init__(self, lm: object) -> None:
        self.active = 0
        self.t0 = 0.0
        self.busy = 0.0
        self.calls = 0
        for name in ("next_token_logprobs", "batch_next_token_logprobs"):
            self._wrap(lm, name)

    def _wrap(self, lm: object, name: str) -> None:
        orig = getattr(lm, name)

        async def timed(*args, **kwargs):
            if self.active == 0:
                self.t0 = time.perf_counter()
            self.active += 1
            self.calls += 1
            try:
                return await orig(*args, **kwargs)
            finally:
                self.active -= 1
                if self.active == 0:
                    self.busy += time.perf_counter() - self.t0

        setattr(lm, name, timed)


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


async def regex_workload(model: str, seed: int, backend: str = "hf", opts: dict | None = None) -> dict:
    from genlm.control import AWRS, BoolFSA, PromptedLLM

    t0 = time.perf_counter()
    llm = PromptedLLM.from_name(model, backend=backend, **(opts or {}))
    llm.set_prompt_from_str(PROMPT)
    fsa = BoolFSA.from_regex(REGEX)
    load = time.perf_counter() - t0
    meter = LMWait(llm.model)

    async def run() -> tuple[float, object]:
        sampler = AWRS(llm, fsa.coerce(llm, f=b"".join), seed=seed)
        seed_everything(seed)
        t0 = time.perf_counter()
        seqs = await sampler.smc(n_particles=10, ess_threshold=0.5, max_tokens=30)
        wall = time.perf_counter() - t0
        await sampler.cleanup()
        return wall, seqs

    wall, seqs = await run()
    lm_wait, lm_calls = meter.busy, meter.calls
    rerun, again = await run()
    posterior = seqs.decoded_posterior
    texts = list(posterior)
    return {
        "workload": "regex",
        "load_s": load,
        "wall_s": wall,
        "lm_wait_s": lm_wait,
        "lm_calls": lm_calls,
        "cached_rerun_s": rerun,
        "rerun_same_result": dict(again.decoded_posterior) == dict(posterior),
        "n_sequences": len(texts),
        "all_match": all(re.fullmatch(REGEX, t) is not None for t in texts),
        "posterior": {t: float(p) for t, p in posterior.items()},
    }


async def bytes_workload(model: str, seed: int) -> dict:
    from genlm.bytes import BeamParams
    from genlm.control import ByteLLM

    t0 = time.perf_counter()
    params = BeamParams(K=5, eos_byte_strings=[b"<|endoftext|>"])
    byte_llm = ByteLLM.from_name(model, params, backend="hf")
    byte_llm.set_prompt_from_str("The city I like best:")
    load = time.perf_counter() - t0
    meter = LMWait(byte_llm.llm)
    data = [bytes([b]) for b in SENTENCE.encode()]

    async def run(potential: ByteLLM) -> tuple[float, list[float], float]:
        seed_everything(seed)
        t0 = time.perf_counter()
        logps = []
        for i in range(len(data)):
            w = await potential.logw_next(data[:i])
            logps.append(float(w[data[i]]))
        prefix = float(await potential.prefix(data))
        return time.perf_counter() - t0, logps, prefix

    wall, logps, prefix = await run(byte_llm)
    lm_wait, lm_calls = meter.busy, meter.calls
    await byte_llm.cleanup()
    # a fresh potential over the same language model: new beams, LM rows from its cache
    again = ByteLLM(byte_llm.llm, params)
    again.set_prompt_from_str("The city I like best:")
    rerun, logps2, _ = await run(again)
    await again.cleanup()
    return {
        "workload": "bytes",
        "load_s": load,
        "wall_s": wall,
        "lm_wait_s": lm_wait,
        "lm_calls": lm_calls,
        "cached_rerun_s": rerun,
        "rerun_same_result": logps2 == logps,
        "n_bytes": len(data),
        "sum_next_byte_logp": sum(logps),
        "prefix_logp": prefix,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("workload", choices=["regex", "bytes"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="hf", help="regex: genlm-backend's backend name (hf, vllm)")
    ap.add_argument("--opt", action="append", default=[], metavar="KEY=JSON", help="regex: a backend option")
    args = ap.parse_args()
    if args.workload == "regex":
        opts = {k: json.loads(v) for k, v in (o.split("=", 1) for o in args.opt)}
        out = asyncio.run(regex_workload(args.model, args.seed, args.backend, opts))
    else:
        out = asyncio.run(bytes_workload(args.model, args.seed))
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
