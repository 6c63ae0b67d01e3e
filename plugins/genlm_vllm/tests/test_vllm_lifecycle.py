"""A second, short-lived tiny engine: preemption under KV pressure, then shutdown
(threads, child processes, the engine's memory) and a context-manager round trip; the
session's engine still works after it."""

from __future__ import annotations

import gc
import os
import threading

import pytest
import torch
from oracles import preemption_engine_opts, run_preemption_workload

import genlm_core
from genlm_core.testing.tolerance import assert_tiny_close


def _threads() -> set[str]:
    # tqdm's monitor thread is a library daemon started by vLLM's progress bars
    return {t.name for t in threading.enumerate() if t.name != "tqdm_monitor"}


def _children() -> list[int]:
    me = os.getpid()
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == me:
                        kids.append(int(entry))
            except OSError:
                continue
    return kids


def test_preemption_then_clean_shutdown(tiny_path, tiny_backend) -> None:
    threads_before, kids_before = _threads(), _children()
    # 6 KV blocks of 32 tokens: long decodes next to our prompts force preemptions.
    with genlm_core.load(
        "vllm",
        model=tiny_path,
        dtype="float32",
        enforce_eager=True,
        max_model_len=160,
        max_num_batched_tokens=64,
        engine_opts=preemption_engine_opts(),
    ) as llm:
        ours, rows, preempted = run_preemption_workload(llm, "lifecycle")
        assert preempted > 0
        reference = tiny_backend.batch_next_token_logprobs_sync(ours)  # the other engine
        for row, ref in zip(rows, reference):
            assert_tiny_close(torch.log_softmax(row[: ref.shape[0]].float(), -1), ref)
        # the backend API on the same pressured engine
        got = llm.batch_next_token_logprobs_sync(ours)
        assert_tiny_close(got, reference)
    assert llm.llm is None
    # vLLM's parallel groups are process-global and an engine core's shutdown destroys
    # them: the backend keeps them while another in-process engine (tiny_backend) is open
    tiny_backend.clear_cache()  # an engine step, not the output cache
    again = tiny_backend.batch_next_token_logprobs_sync(ours)
    assert_tiny_close(again, reference)
    with pytest.raises(RuntimeError, match="closed"):
        llm.next_token_logprobs_sync([1, 2])
    llm.close()  # idempotent
    del llm
    gc.collect()
    assert _threads() <= threads_before, _threads() - threads_before
    assert _children() == kids_before
