"""genlm-backend's output-cache options over genlm-core's: ``cache_opts`` (the keywords
of genlm-backend's ``OutputCache``, which its ``AsyncMlxLM`` and ``AsyncVirtualLM`` take)
and ``OutputCache(maxsize, move_to_cpu=True)``, whose tensors come back on the device
they came from.

The engine test needs genlm-mlx (the main suite's venv has it; the compat wheel set,
which installs genlm-hf only, does not select this file). Its oracle is the same
backend's computed row: a hit from a cache held in host memory equals it.
"""

from __future__ import annotations

import pytest
import torch

gb = pytest.importorskip("genlm.backend")


@pytest.fixture(scope="module")
def tiny_path() -> str:
    from genlm_core.testing import models as model_paths

    return str(model_paths.tiny_llama())


def test_cache_opts_move_to_cpu_is_cache_to_cpu(tiny_path: str) -> None:
    from genlm.backend.llm import AsyncMlxLM

    llm = AsyncMlxLM.from_name(tiny_path, cache_size=8, cache_opts={"move_to_cpu": True})
    try:
        cache = llm.output_cache
        assert cache.to_cpu and cache.max_entries == 8
        ids = llm.tokenizer.encode("hello there")
        computed = llm.next_token_logprobs_sync(ids)
        hit = llm.next_token_logprobs_sync(ids)
        assert cache.hits == 1
        assert torch.equal(hit, computed) and hit.data_ptr() != computed.data_ptr()
        assert hit.device == computed.device
    finally:
        llm.close()
    plain = AsyncMlxLM.from_name(tiny_path, cache_size=8, cache_opts={})
    try:
        assert not plain.output_cache.to_cpu
    finally:
        plain.close()


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"cache_opts": {"maxsize": 3}}, "move_to_cpu only \\(its size: cache_size=\\), got {'maxsize': 3}"),
        ({"cache_opts": ["move_to_cpu"]}, "move_to_cpu only"),
        ({"cache_opts": {"move_to_cpu": True}, "cache_to_cpu": False}, "disagree"),
    ],
)
def test_bad_cache_opts_name_the_fix(tiny_path: str, options: dict, match: str) -> None:
    from genlm.backend.llm import AsyncMlxLM

    with pytest.raises(TypeError, match=match):
        AsyncMlxLM.from_name(tiny_path, **options)


def test_a_host_cache_keeps_the_reference_behaviour_on_the_cpu() -> None:
    """Values put from the CPU come back as stored (no device to go back to), least
    recently used first out; ``clear`` forgets everything."""
    from genlm.backend.cache import OutputCache

    cache = OutputCache(2, move_to_cpu=True)
    rows = {k: torch.full((3,), float(i)) for i, k in enumerate("abc")}
    for key in "ab":
        cache[key] = rows[key]
    assert torch.equal(cache["a"], rows["a"])  # "a" most recent: "b" goes next
    cache["c"] = rows["c"]
    assert "b" not in cache and torch.equal(cache["c"], rows["c"]) and len(cache) == 2
    cache.clear()
    assert len(cache) == 0
    with pytest.raises(KeyError):
        cache["a"]


@pytest.mark.cuda
def test_a_host_cache_hands_tensors_back_on_their_device() -> None:  # pragma: no cover - GPU
    """genlm-backend's ``move_to_cpu``: held on the CPU, handed back where it came from
    (a key put again from the CPU comes back on the CPU)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (the cuda marker deselects this test on such machines)")
    from genlm.backend.cache import OutputCache

    cache = OutputCache(2, move_to_cpu=True)
    gpu, cpu = torch.randn(5, device="cuda"), torch.randn(5)
    cache["g"], cache["c"] = gpu, cpu
    assert cache.get("g").device.type == "cpu"  # held in host memory
    back = cache["g"]
    assert back.device == gpu.device and torch.equal(back, gpu) and back.data_ptr() != gpu.data_ptr()
    assert cache["c"].device.type == "cpu" and torch.equal(cache["c"], cpu)
    cache["g"] = cpu
    assert cache["g"].device.type == "cpu"
