"""One SIS program (``genlm_core.tools.sis``) for the library and the benchmarks.

Oracle: genlm-backend's README program, written out here as the README writes it
(particles as dicts, the masks from ``one_hot`` and a list of booleans, one seeded
generator), run on the same mock backend: the library's ``run_sis`` and the benchmarks'
``sis_workload.sis`` must draw the same tokens and weights. And the benchmarks' process
without genlm-core (the anchor venv) runs that same file.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

import genlm_core

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def sis_workload() -> Iterator[ModuleType]:
    """``benchmarks/sis_workload.py`` as the scripts import it (their folder on sys.path), undone after."""
    import importlib

    saved_path, saved = list(sys.path), sys.modules.pop("sis_workload", None)
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("sis_workload")
    finally:
        sys.path[:] = saved_path
        sys.modules.pop("sis_workload", None)
        if saved is not None:
            sys.modules["sis_workload"] = saved


async def readme_sis(
    llm: Any, prompt_ids: list[int], n: int, max_tokens: int, seed: int, min_len: int
) -> list:
    eos = llm.eos_token_ids[0]
    vocab = llm.byte_vocab
    valid = torch.tensor(
        [i == eos or min_len <= len(t) <= 10 for i, t in enumerate(vocab)], dtype=torch.float
    ).log()
    eos_only = torch.nn.functional.one_hot(torch.tensor(eos), len(vocab)).float().log()
    gen = torch.Generator().manual_seed(seed)
    particles = [{"context": [], "w": 0.0, "active": True} for _ in range(n)]

    async def extend(p: dict) -> None:
        logps = await llm.next_token_logprobs(prompt_ids + p["context"])
        masked = logps.float().cpu() + (eos_only if len(p["context"]) >= max_tokens else valid)
        log_z = masked.logsumexp(dim=-1)
        p["w"] += float(log_z)
        tok = int(torch.multinomial((masked - log_z).exp(), 1, generator=gen).item())
        if tok == eos:
            p["active"] = False
        else:
            p["context"].append(tok)

    while any(p["active"] for p in particles):
        await asyncio.gather(*[extend(p) for p in particles if p["active"]])
    return [(p["context"], p["w"]) for p in particles]


@pytest.mark.parametrize("seed", [0, 5])
def test_the_library_and_the_benchmark_run_the_readme_program(sis_workload: ModuleType, seed: int) -> None:
    from genlm_core.tools.sis import run_sis

    llm = genlm_core.load("mock", batch_size=64, cache_size=0)
    try:
        prompt = list(llm.tokenizer.encode("hello", add_special_tokens=False))
        want_lib = asyncio.run(readme_sis(llm, prompt, 12, 6, seed, min_len=1))
        lib = asyncio.run(run_sis(llm, "hello", n_particles=12, max_tokens=6, seed=seed))
        assert [(p.context, p.log_weight) for p in lib.particles] == want_lib
        assert lib.calls == sum(len(c) + 1 for c, _ in want_lib)  # a call per token and one for EOS

        want = asyncio.run(readme_sis(llm, prompt, 12, 6, seed, min_len=0))
        lengths = [len(t) for t in llm.byte_vocab]
        res = asyncio.run(
            sis_workload.sis(
                llm.next_token_logprobs,
                lengths,
                llm.eos_token_ids[0],
                prompt,
                n_particles=12,
                max_tokens=6,
                seed=seed,
            )
        )
        assert [(p.context, p.log_weight) for p in res["particles"]] == want
        assert res["calls"] == lib.calls and res["steps"] == max(len(c) for c, _ in want) + 1
    finally:
        llm.close()


def test_a_process_without_genlm_core_runs_the_same_file() -> None:
    code = f"""
import sys
sys.modules["genlm_core"] = None  # as in the anchor venv: genlm-core not importable
sys.path.insert(0, {str(BENCH)!r})
import sis_workload
module = sis_workload.program()
print(module.__name__, module.__file__)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    name, path = out.stdout.split()
    import genlm_core.tools.sis as sis

    assert name != sis.__name__ and Path(path).resolve() == Path(sis.__file__).resolve()
