"""The core's row copies run no OpenMP parallel region on the caller's thread.

Once two threads of a process own OpenMP pools, libgomp throttles its spinning (more pool
threads than cores) and every small parallel op of either thread gets slower: one
``clone`` of a row on the event loop's thread made every later CPU forward pass on the
batcher's worker 30-36% slower (``genlm_core.engine.memory._clone_tensor``). ``genlm serve``
always runs passes on the worker, and copies a row for a context's second caller on the
loop. This test watches which threads enter a parallel region: a shim preloaded into a
child process wraps libgomp's ``GOMP_parallel`` (torch's bundled libgomp is reached by
symbol) and reports each thread's first region. No clock is read.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
#include <sys/syscall.h>
typedef void (*par_t)(void (*)(void *), void *, unsigned, unsigned);
static __thread int seen = 0;
void GOMP_parallel(void (*fn)(void *), void *data, unsigned n, unsigned flags) {
    static par_t real = 0;
    if (!real) real = (par_t)dlsym(RTLD_NEXT, "GOMP_parallel");
    if (!seen) {
        seen = 1;
        fprintf(stderr, "GOMP_FIRST_REGION %ld\n", (long)syscall(SYS_gettid));
        fflush(stderr);
    }
    real(fn, data, n, flags);
}
"""

CHILD = textwrap.dedent(
    """
    import asyncio, sys, threading
    import numpy as np
    import torch
    from genlm_core.config import BackendConfig
    from genlm_core.engine import Engine, Token
    from genlm_core.engine.backend import BaseLogprobBackend
    from genlm_core.engine.memory import compact, private_copies, private_copy

    torch.set_num_threads(2)
    V = 49_152  # a row of SmolLM2's vocabulary: above torch's grain for a parallel copy

    class Rows(Engine):
        config_class = BackendConfig
        supports = frozenset()
        def __init__(self):
            self.tokenizer = None
            self.byte_vocab = [Token(i, i.to_bytes(2, "big")) for i in range(V)]
            self.eos_token_ids = [0]
        def forward(self, contexts):
            rng = np.random.default_rng(len(contexts))
            return torch.from_numpy(rng.random((len(contexts), V), dtype=np.float32))
        forward_uncached = forward

    llm = BaseLogprobBackend(Rows(), BackendConfig(batch_size=8), name="rows")
    llm.batcher.run_in_thread = True  # as genlm serve runs it: passes on the batcher's worker

    async def main():
        a, b = [1, 2, 3], [1, 2, 4]
        # a context's second caller gets a copy; the next call of it is a cache hit (a copy)
        rows = await asyncio.gather(*(llm.next_token_logprobs(c) for c in (a, a, b)))
        rows.append(await llm.next_token_logprobs(a))
        private_copies(rows)
        compact(torch.from_numpy(np.ones((4, V), dtype=np.float32))[1])
        private_copy(torch.from_numpy(np.ones(V, dtype=np.float64)))
        assert all(r.shape == (V,) for r in rows)

    asyncio.run(main())
    print("LOOP_THREAD", threading.get_native_id(), file=sys.stderr, flush=True)
    if len(sys.argv) > 1:  # the control: a parallel op on this thread is seen
        torch.ones(1 << 17).exp()
    llm.close()
    """
)


def _under_shim(tmp_path: Path, child: str, *args: str, **env: str) -> list[str]:
    """The stderr lines of ``python -c child *args`` with the shim preloaded."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the GOMP_parallel shim")
    src, lib = tmp_path / "shim.c", tmp_path / "shim.so"
    src.write_text(SHIM)
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(src), "-ldl"], check=True)
    out = subprocess.run(
        [sys.executable, "-c", child, *args],
        env={**os.environ, "LD_PRELOAD": str(lib), **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stderr.splitlines()


def _ids(lines: list[str], tag: str) -> list[int]:
    return [int(line.split()[1]) for line in lines if line.startswith(tag)]


def _first_regions(tmp_path: Path, *args: str) -> tuple[set[int], int]:
    lines = _under_shim(tmp_path, CHILD, *args, OMP_NUM_THREADS="2")
    return set(_ids(lines, "GOMP_FIRST_REGION")), _ids(lines, "LOOP_THREAD")[0]


@pytest.mark.skipif(sys.platform != "linux", reason="LD_PRELOAD and libgomp: Linux")
def test_row_copies_run_no_parallel_region_on_the_callers_thread(tmp_path: Path) -> None:
    regions, loop = _first_regions(tmp_path)
    assert regions, "the worker's pass (the core's log_softmax of 8 x 49k floats) runs in parallel"
    assert loop not in regions, "a row copy on the event loop's thread ran an OpenMP parallel region"


@pytest.mark.skipif(sys.platform != "linux", reason="LD_PRELOAD and libgomp: Linux")
def test_the_shim_sees_a_parallel_op_on_the_loop_thread(tmp_path: Path) -> None:
    """The control: the same child, plus one parallel ``exp`` on that thread, is seen."""
    regions, loop = _first_regions(tmp_path, "control")
    assert loop in regions


CUDA_CHILD = textwrap.dedent(
    """
    import asyncio, sys, threading
    import torch
    import genlm_core
    from genlm_core.tools.sis import run_sis

    llm = genlm_core.load("hf", model=sys.argv[1], device="cuda", dtype="float32", batch_size=8)
    # the program's own work (masking, logsumexp, sampling) runs on this thread, in parallel
    asyncio.run(run_sis(llm, "Montreal is", n_particles=8, max_tokens=12, seed=0))
    llm.clear_cache()
    asyncio.run(run_sis(llm, "Montreal is", n_particles=8, max_tokens=12, seed=1))
    torch.ones(1 << 17).exp()  # a parallel op on this thread, as a program over a 49k vocabulary runs
    for t in threading.enumerate():
        print("PY_THREAD", t.native_id, t.name, file=sys.stderr, flush=True)
    print("LOOP_THREAD", threading.get_native_id(), file=sys.stderr, flush=True)
    llm.close()
    """
)


@pytest.mark.cuda
@pytest.mark.skipif(sys.platform != "linux", reason="LD_PRELOAD and libgomp: Linux")
def test_a_gpu_engine_leaves_the_programs_thread_the_only_openmp_pool(
    tmp_path: Path,
) -> None:  # pragma: no cover - GPU
    """On a GPU the forward passes run on the batcher's worker and the program's own CPU
    work (a SIS particle's masking, logsumexp and sampling over the vocabulary) on its
    event loop. If the worker ran a parallel CPU op too, the process would own two OpenMP
    pools and libgomp would throttle the program's small parallel ops (see the module):
    no Python thread but the program's enters a parallel region."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (the cuda marker deselects this test on such machines)")
    from genlm_core.testing.models import tiny_llama

    lines = _under_shim(tmp_path, CUDA_CHILD, str(tiny_llama()))
    regions = set(_ids(lines, "GOMP_FIRST_REGION"))
    loop = _ids(lines, "LOOP_THREAD")[0]
    python = {int(ln.split()[1]): ln.split(maxsplit=2)[2] for ln in lines if ln.startswith("PY_THREAD")}
    assert loop in regions  # the program's own parallel op: the shim sees it
    others = {python[t] for t in regions & set(python) if t != loop}
    assert not others, f"threads other than the program's ran OpenMP parallel regions: {sorted(others)}"
