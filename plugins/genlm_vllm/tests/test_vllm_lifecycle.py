"""A second, short-lived tiny engine: preemption under KV pressure, then shutdown
(threads, child processes, the engine's memory) and a context-manager round trip; the
session's engine still works after it."""

from __future__ import annotations

import gc
import os
import random
import threading

import pytest
import torch
from oracles import max_abs_diff

import genlm_core


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
    from genlm_vllm.capture import TAG_KEY, pop_captured
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    threads_before, kids_before = _threads(), _children()
    # 6 KV blocks of 32 tokens: long decodes next to our prompts force preemptions.
    with genlm_core.load(
        "vllm",
        model=tiny_path,
        dtype="float32",
        enforce_eager=True,
        max_model_len=160,
        max_num_batched_tokens=64,
        engine_opts={"num_gpu_blocks_override": 6, "block_size": 32, "disable_log_stats": False},
    ) as llm:
        rng = random.Random(0)
        prompts, params, tags = [], [], []
        for i in range(8):
            if i % 2 == 0:  # a decode that grows from 1 block to 3
                p = [rng.randrange(3, 1000) for _ in range(10)]
                params.append(SamplingParams(max_tokens=80, ignore_eos=True, temperature=1.0))
            else:
                p = [rng.randrange(3, 1000) for _ in range(rng.randint(30, 100))]
                tags.append(f"lifecycle:{i}")
                params.append(SamplingParams(max_tokens=1, temperature=0.0, extra_args={TAG_KEY: tags[-1]}))
            prompts.append(p)
        with llm.batcher.model_lock:
            llm.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        preemptions = sum(m.value for m in llm.llm.get_metrics() if m.name == "vllm:num_preemptions")
        assert preemptions > 0
        rows = pop_captured(tags)
        ours = [p for i, p in enumerate(prompts) if i % 2]
        reference = tiny_backend.batch_next_token_logprobs_sync(ours)  # the other engine
        for row, ref in zip(rows, reference):
            assert max_abs_diff(torch.log_softmax(row.float(), -1), ref) <= 1e-4
        # the backend API on the same pressured engine
        got = llm.batch_next_token_logprobs_sync(ours)
        assert max_abs_diff(got, reference) <= 1e-4
    assert llm.llm is None
    # vLLM's parallel groups are process-global and an engine core's shutdown destroys
    # them: the backend keeps them while another in-process engine (tiny_backend) is open
    tiny_backend.clear_cache()  # an engine step, not the output cache
    again = tiny_backend.batch_next_token_logprobs_sync(ours)
    assert max_abs_diff(again, reference) <= 1e-4
    with pytest.raises(RuntimeError, match="closed"):
        llm.next_token_logprobs_sync([1, 2])
    llm.close()  # idempotent
    del llm
    gc.collect()
    assert _threads() <= threads_before, _threads() - threads_before
    assert _children() == kids_before
