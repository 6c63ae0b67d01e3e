"""Real-engine tests of the vLLM backend on the tiny Llama (one shared engine)."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import threading

import pytest
import torch
from conftest import TINY_BUDGET
from genlm_vllm.capture import CAPTURED, INSTANCES
from oracles import genlm_hf_oracle, hf_oracle, vllm_dict_oracle

import genlm_core
from genlm_core.testing.tolerance import assert_tiny_close


def _ids(backend, n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    special = set(backend.eos_token_ids) | set(getattr(backend.tokenizer, "all_special_ids", []) or [])
    pool = [i for i in range(len(backend.byte_vocab)) if i not in special]
    return [rng.choice(pool) for _ in range(n)]


def _mixed_batch(backend) -> list[list[int]]:
    """Mixed lengths (1..90), a repeated prompt, prompts sharing prefixes."""
    base = _ids(backend, 90, 0)
    batch = [
        base[:1],
        base[:7],
        _ids(backend, 23, 1),
        base[:40],
        base[:41],  # shares 40 tokens with the previous one
        _ids(backend, 3, 2),
        base[:7],  # repeated
        base[:90],  # alone larger than a step's budget
        base[:40] + _ids(backend, 12, 3),  # shared prefix, different continuation
    ]
    return batch


def test_registration_is_light_and_never_auto_on_cpu() -> None:
    code = (
        "import sys, genlm_core\n"
        "rows = {r['name']: r for r in genlm_core.list_backends()}\n"
        "r = rows['vllm']\n"
        "assert r['devices'] == ['cuda', 'cpu'], r\n"
        "assert r['priority'] == {'cuda': 100, 'cpu': -10}, r\n"
        "assert r['distribution'] == 'genlm-vllm', r\n"
        "assert 'vllm' not in sys.modules and 'torch' not in sys.modules\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]


def test_config_rejects_unknown_keys_and_builds_engine_kwargs() -> None:
    from genlm_vllm.capture import CaptureLogitsProcessor
    from genlm_vllm.config import VLLMConfig
    from genlm_vllm.launch import engine_kwargs

    from genlm_core.engine import Checkpoint

    with pytest.raises(ValueError, match="tensor_parallel_size"):
        VLLMConfig.build("vllm", model="m", tensor_parallel_size=2)
    cfg = VLLMConfig.build(
        "vllm",
        model="m",
        max_model_len=64,
        engine_opts={"tensor_parallel_size": 2, "enable_prefix_caching": False},
    )
    kw = engine_kwargs(cfg, "cuda")  # an LLM started by hand: the checkpoint read and placed here
    assert kw["tensor_parallel_size"] == 2 and kw["enable_prefix_caching"] is False
    assert kw["dtype"] == "float32"  # "m" declares none: the config's default_dtype
    assert kw["max_model_len"] == 64 and kw["gpu_memory_utilization"] == 0.9
    assert kw["logits_processors"] == [CaptureLogitsProcessor]
    assert engine_kwargs(VLLMConfig.build("vllm", model="m"), "cpu")["enable_prefix_caching"] is True
    with pytest.raises(ValueError, match="model="):
        engine_kwargs(VLLMConfig(), "cpu")
    # the core's checkpoint decides the model (model=None resolved) and tokenizer, its placement the dtype
    read = Checkpoint("folder", "/ckpt/model", tokenizer="/ckpt/tok")
    kw = engine_kwargs(VLLMConfig(dtype="auto"), "cpu", "bfloat16", checkpoint=read)
    assert (kw["model"], kw["tokenizer"], kw["dtype"]) == ("/ckpt/model", "/ckpt/tok", "bfloat16")


def test_matches_dict_oracle_and_transformers(tiny_backend, tiny_path) -> None:
    batch = _mixed_batch(tiny_backend)
    tiny_backend.clear_cache()
    got = tiny_backend.batch_next_token_logprobs_sync(batch)
    assert got.shape == (len(batch), len(tiny_backend.byte_vocab)) and got.dtype == torch.float32
    assert got.device.type == tiny_backend.device
    oracle = vllm_dict_oracle(tiny_backend, batch)
    hf = hf_oracle(tiny_path, batch, len(tiny_backend.byte_vocab))
    ghf = genlm_hf_oracle(tiny_path, batch)
    for i in range(len(batch)):
        assert_tiny_close(got[i], oracle[i], str(i))
        assert_tiny_close(got[i], hf[i], str(i))
        assert_tiny_close(got[i], ghf[i], str(i))
    assert torch.equal(got[1], got[6])  # repeated prompt
    assert not torch.allclose(got[3], got[4])  # different contexts really differ


async def test_async_mixed_batch_matches_oracle(tiny_backend) -> None:
    batch = _mixed_batch(tiny_backend)
    tiny_backend.clear_cache()
    rows = await asyncio.gather(*(tiny_backend.next_token_logprobs(c) for c in batch))
    oracle = vllm_dict_oracle(tiny_backend, batch)
    for i, row in enumerate(rows):
        assert_tiny_close(row, oracle[i], str(i))


def test_batch_larger_than_step_budget_needs_several_steps(tiny_backend) -> None:
    batch = [_ids(tiny_backend, n, 10 + n) for n in (5, 60, 17, 33, 2, 48, 31, 64, 9, 26, 40, 12)]
    assert sum(map(len, batch)) > 8 * TINY_BUDGET
    tiny_backend.clear_cache()
    procs = list(INSTANCES)
    steps0 = sum(p.steps for p in procs)
    got = tiny_backend.batch_next_token_logprobs_sync(batch)
    steps = sum(p.steps for p in procs) - steps0
    assert steps >= sum(map(len, batch)) // TINY_BUDGET  # the engine split the work
    oracle = vllm_dict_oracle(tiny_backend, batch)
    for i, ctx in enumerate(batch):
        assert_tiny_close(got[i], oracle[i], str(i))
        single = tiny_backend.next_token_logprobs_uncached(ctx)  # alone, no prefix cache
        assert_tiny_close(got[i], single, str(i))
    assert not CAPTURED  # nothing left behind in the registry


async def test_concurrent_sample_and_logprobs(tiny_backend) -> None:
    ctxs = [_ids(tiny_backend, n, 30 + n) for n in (3, 9, 14, 6, 20, 11)]
    prompts = [_ids(tiny_backend, n, 50 + n) for n in (4, 8)]
    tiny_backend.clear_cache()
    expected = vllm_dict_oracle(tiny_backend, ctxs)
    ref_samples = [
        tiny_backend.sample_sync(p, 6, eos_token_ids=[], seed=5 + i) for i, p in enumerate(prompts)
    ]
    tiny_backend.clear_cache()

    jobs = []
    for _ in range(3):
        jobs += [tiny_backend.next_token_logprobs(c) for c in ctxs]
        jobs += [tiny_backend.sample(p, 6, eos_token_ids=[], seed=5 + i) for i, p in enumerate(prompts)]
        tiny_backend.clear_cache()
    results = await asyncio.gather(*jobs)
    k = 0
    for _ in range(3):
        for i in range(len(ctxs)):
            assert_tiny_close(results[k], expected[i])
            k += 1
        for i in range(len(prompts)):
            assert results[k] == ref_samples[i]
            k += 1

    # threads calling the sync API at the same time as the event loop
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        try:
            for c in ctxs:
                tiny_backend.next_token_logprobs_uncached(c)
            tiny_backend.sample_sync(prompts[0], 3, eos_token_ids=[], seed=seed)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(2)]
    for t in threads:
        t.start()
    rows = await tiny_backend.batch_next_token_logprobs(ctxs)
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(len(ctxs)):
        assert_tiny_close(rows[i], expected[i])


async def test_sampling_semantics(tiny_backend) -> None:
    p = _ids(tiny_backend, 5, 70)
    greedy = await tiny_backend.sample(p, 5, eos_token_ids=[], temperature=0.0)
    ctx = list(p)
    for tok in greedy:  # greedy sampling follows the argmax of our own distributions
        assert tok == int(torch.argmax(tiny_backend.next_token_logprobs_sync(ctx)))
        ctx.append(tok)
    assert await tiny_backend.sample(p, 0, eos_token_ids=[]) == []
    a = await tiny_backend.batch_sample([p, p, p], 4, eos_token_ids=[], seed=11)
    assert a[0] == await tiny_backend.sample(p, 4, eos_token_ids=[], seed=11)
    assert a[2] == await tiny_backend.sample(p, 4, eos_token_ids=[], seed=13)
    # a seeded prompt longer than a step's budget (vLLM CPU generators cannot rewind)
    long_p = _ids(tiny_backend, 3 * TINY_BUDGET + 5, 71)
    s1 = await tiny_backend.sample(long_p, 3, eos_token_ids=[], seed=3)
    assert s1 == await tiny_backend.sample(long_p, 3, eos_token_ids=[], seed=3) and len(s1) == 3
    with pytest.raises(ValueError):
        await tiny_backend.sample(p, -1)
    with pytest.raises(ValueError):
        await tiny_backend.sample([-3], 2)


async def test_bad_inputs_fail_alone(tiny_backend) -> None:
    good = _ids(tiny_backend, 6, 80)
    limit = tiny_backend.max_context_length
    assert limit == 255 and tiny_backend.engine.max_positions == 256  # the core's N - 1
    too_long = _ids(tiny_backend, limit + 1, 81)
    tiny_backend.next_token_logprobs_sync(_ids(tiny_backend, limit, 82))  # the longest allowed works
    for bad in ([], [-1], [len(tiny_backend.byte_vocab)], [1.5], "text", too_long, [[1, 2]]):
        with pytest.raises(ValueError):
            tiny_backend.next_token_logprobs_sync(bad)
        with pytest.raises(ValueError):
            await tiny_backend.next_token_logprobs(bad)
    results = await asyncio.gather(
        tiny_backend.next_token_logprobs(good),
        tiny_backend.next_token_logprobs(too_long),
        return_exceptions=True,
    )
    assert isinstance(results[1], ValueError) and not isinstance(results[0], BaseException)
    assert_tiny_close(results[0], tiny_backend.next_token_logprobs_uncached(good))


def test_clear_error_without_vllm_or_device(monkeypatch) -> None:
    import importlib.util

    import vllm.platforms
    from genlm_vllm import launch
    from genlm_vllm.config import VLLMConfig
    from genlm_vllm.engine import VLLMEngine

    from genlm_core.engine import BaseLogprobBackend, Checkpoint

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real_find_spec(n, *a)
    )
    with pytest.raises(RuntimeError, match=r"pip install \"genlm-vllm\[cpu\]\""):  # the registry's check
        genlm_core.load("vllm", model="whatever")
    with pytest.raises(ImportError, match=r"pip install \"genlm-vllm\[cpu\]\""):  # the engine's own
        BaseLogprobBackend.from_checkpoint(
            Checkpoint("folder", "whatever"), VLLMConfig(model="whatever"), engine_class=VLLMEngine
        )
    monkeypatch.undo()

    class NoDevice:
        device_type = ""

        def is_cuda_alike(self) -> bool:
            return False

        def is_cpu(self) -> bool:
            return False

    monkeypatch.setattr(vllm.platforms, "current_platform", NoDevice())
    with pytest.raises(RuntimeError, match="no supported device"):
        launch.engine_device()

    class CPUBuild(NoDevice):
        def is_cpu(self) -> bool:
            return True

    monkeypatch.setattr(vllm.platforms, "current_platform", CPUBuild())
    with pytest.raises(ValueError, match="this vLLM runs on 'cpu', but the backend was placed on 'cuda'"):
        VLLMEngine.dtypes_on("cuda")  # a CPU build of vLLM on a machine with a GPU


def test_engine_stats_count_prefix_cache_hits(tiny_backend) -> None:
    """``stats()["engine"]`` counts the prompt tokens vLLM read from its prefix cache
    (whole 32-token blocks: ``RequestOutput.num_cached_tokens``) and those it computed, so
    a lost prefix cache shows in the counters (the benchmark smoke reads them)."""
    ctx = _ids(tiny_backend, 70, 3)
    tiny_backend.next_token_logprobs_sync(ctx)
    with tiny_backend.engine_lock:  # else ctx + [5] continues ctx's live row (resident path)
        tiny_backend.engine.close_sessions()
    before = dict(tiny_backend.stats()["engine"])
    tiny_backend.next_token_logprobs_sync(ctx + [5])
    after = tiny_backend.stats()["engine"]
    assert after["forward_calls"] - before["forward_calls"] == 1
    assert after["tokens_reused"] - before["tokens_reused"] == 64  # the two full blocks of ctx
    assert after["tokens_computed"] - before["tokens_computed"] == 71 - 64
    tiny_backend.next_token_logprobs_uncached(ctx + [6])  # reads no block
    last = tiny_backend.stats()["engine"]
    assert last["tokens_reused"] == after["tokens_reused"]
    assert last["tokens_computed"] - after["tokens_computed"] == 71


def test_engine_counters_are_the_cores(tiny_backend) -> None:
    """vLLM's ``stats()["engine"]`` counters are the core's (:class:`ComputeCounters`, what
    KV reuse counts on the other engines): the same keys, counted through one object, and
    the backend's ``forward_calls`` / ``tokens_*`` read them."""
    from genlm_core.engine.kv_reuse import ComputeCounters

    engine = tiny_backend.engine
    assert isinstance(engine.counters, ComputeCounters)
    keys = set(ComputeCounters().stats())
    ctx = _ids(tiny_backend, 9, 4)
    tiny_backend.clear_cache()
    before = {k: tiny_backend.stats()["engine"][k] for k in keys}
    tiny_backend.next_token_logprobs_sync(ctx)
    after = tiny_backend.stats()["engine"]
    assert {k: after[k] for k in keys} == engine.counters.stats()
    assert after["forward_calls"] == before["forward_calls"] + 1 == tiny_backend.forward_calls
    assert (
        after["tokens_computed"]
        + after["tokens_reused"]
        - before["tokens_computed"]
        - before["tokens_reused"]
        == 9
    )
    assert (tiny_backend.tokens_computed, tiny_backend.tokens_reused) == (
        after["tokens_computed"],
        after["tokens_reused"],
    )


def test_deprecated_backend_module_still_works(tiny_backend) -> None:
    """``genlm_vllm.backend`` keeps its names for a release, each warning: ``VLLMBackend``
    (an alias of the core's backend over ``VLLMEngine``; its rows are the backend's) and
    the names re-exported from ``launch`` and ``lifecycle``."""
    from genlm_vllm import backend as vb
    from genlm_vllm import launch, lifecycle
    from genlm_vllm.engine import VLLMEngine

    from genlm_core.engine import BaseLogprobBackend

    for name, module in [
        ("EngineDiedError", lifecycle),
        ("INSTALL_HINT", launch),
        ("VLLMNotInstalledError", launch),
        ("engine_kwargs", launch),
        ("check_dtype", launch),
    ]:
        with pytest.warns(DeprecationWarning, match=rf"genlm_vllm.backend.{name} .*{module.__name__}"):
            assert getattr(vb, name) is getattr(module, name)
    with pytest.raises(AttributeError):
        vb.nothing_here  # noqa: B018
    assert vb.VLLMBackend.engine_class is VLLMEngine and issubclass(vb.VLLMBackend, BaseLogprobBackend)
    with pytest.warns(DeprecationWarning, match="genlm_vllm.VLLMBackend is deprecated"):
        alias = vb.VLLMBackend(tiny_backend.engine, tiny_backend.config)
    try:  # the same engine: the alias's rows are the backend's uncached rows
        ctx = _ids(tiny_backend, 11, 5)
        assert alias.backend_name == "vllm" and alias.supports_lora
        with tiny_backend.engine_lock:
            got = alias.next_token_logprobs_sync(ctx)
        assert_tiny_close(got, tiny_backend.next_token_logprobs_uncached(ctx))
    finally:  # not alias.close(): the engine is the session's
        alias.batcher.close()
        if alias.sampler is not None:
            alias.sampler.close()
