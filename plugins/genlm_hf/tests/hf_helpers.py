"""Helpers of the genlm-hf tests (a unique module name: other plugins have a conftest too)."""

from __future__ import annotations

from typing import Any

# batched / cached results are compared with a full uncached forward pass at the bound
# derived from the arithmetic: genlm_core.testing.tolerance.assert_backend_close


def load_hf(path: str, **options: Any) -> Any:
    """A float32 CPU HFBackend through the public entry point."""
    import genlm_core

    options.setdefault("dtype", "float32")
    options.setdefault("device", "cpu")
    return genlm_core.load("hf", model=path, **options)


def max_diff(a: Any, b: Any) -> float:
    return float((a.float().cpu() - b.float().cpu()).abs().max())


def reference(llm: Any, contexts: list[list[int]]) -> Any:
    """Full forward passes, one context at a time, no cache of any kind."""
    import torch

    return torch.stack([llm.next_token_logprobs_uncached(c) for c in contexts])
