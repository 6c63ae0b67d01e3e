"""The genlm-core conformance kit against the real transformers engine on CUDA (marker
``cuda``: deselected where the hardware probe finds no GPU; the GPU check,
scripts/gpu_check.sh, requires these classes). Apart from test_hf_conformance.py so that
suite runs unchanged from the installed wheels on CPU machines."""

import pytest
import torch
from hf_helpers import load_hf

from genlm_core.testing import LogprobBackendConformance


def _on_cuda(path: str, **options) -> object:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device (the cuda marker deselects this test on such machines)")
    return load_hf(path, device="cuda", **options)


@pytest.mark.cuda
class TestHFCudaConformance(LogprobBackendConformance):
    """The kit on CUDA, float32 and bfloat16, with the defaults a GPU user gets: the static
    decode step captured as CUDA graphs (every call of one token a row), batches of 3. The
    bounds are the kit's derived ones for the dtype (the same as on the CPU: two paths
    differ by the order of their sums, whatever the device)."""

    max_len = 12

    @pytest.fixture(scope="class", params=["float32", "bfloat16"])
    def backend(self, request, tiny_llama_path):  # pragma: no cover - GPU
        llm = _on_cuda(tiny_llama_path, batch_size=3, dtype=request.param)
        assert llm.engine.step is not None and llm.engine.step.graph
        yield llm
        llm.close()

    def test_graphs_were_captured_and_replayed(self, backend) -> None:  # pragma: no cover - GPU
        """Particles stepping a token a call run as replayed graphs (not the eager path)."""
        backend.clear_cache()
        ctxs = self.contexts(backend, seed=9)[:3]
        for step in range(4):
            backend.batch_next_token_logprobs_sync([c + [5] * step for c in ctxs])
        stats = backend.stats()["engine"]
        assert stats["static_captured"] > 0 and stats["static_steps"] > stats["static_captured"], stats
        assert stats["static_capture_failed"] == 0, stats  # no capture fell back to the eager step


@pytest.mark.cuda
class TestHFCudaGPT2Conformance(LogprobBackendConformance):
    """GPT-2 on CUDA (float32, batches of 3) with a small KV budget."""

    max_len = 12

    @pytest.fixture(scope="class")
    def backend(self, tiny_gpt2_path):  # pragma: no cover - GPU
        llm = _on_cuda(tiny_gpt2_path, batch_size=3, kv_cache_bytes=64 * 1024)
        yield llm
        llm.close()


@pytest.mark.cuda
class TestHFCudaEagerConformance(LogprobBackendConformance):
    """The eager path on CUDA (static_decode="off"), float32."""

    max_len = 12

    @pytest.fixture(scope="class")
    def backend(self, tiny_llama_path):  # pragma: no cover - GPU
        llm = _on_cuda(tiny_llama_path, static_decode="off")
        yield llm
        llm.close()


@pytest.mark.cuda
class TestHFCudaHostCacheConformance(LogprobBackendConformance):
    """The captured step on CUDA with the output cache in host memory (``cache_to_cpu``,
    genlm serve's setting): a hit comes back on the GPU, as a computed row does."""

    max_len = 12

    @pytest.fixture(scope="class")
    def backend(self, tiny_llama_path):  # pragma: no cover - GPU
        llm = _on_cuda(tiny_llama_path, batch_size=3, cache_to_cpu=True)
        assert llm.output_cache.to_cpu
        yield llm
        llm.close()
