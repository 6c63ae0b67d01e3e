"""The float32 oracle engine-plugin tests compare against: a plain transformers
float32 forward pass of the whole context (no cache, no batching). Needs torch and
transformers (imported when an oracle is built)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


class HFOracle:
    """A plain transformers float32 forward pass: the reference distribution."""

    def __init__(self, path: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        self.model.eval()

    def logprobs(self, context: Sequence[int]) -> Any:
        torch = self.torch
        with torch.no_grad():
            logits = self.model(torch.tensor([list(context)])).logits[0, -1].float()
        return torch.log_softmax(logits, dim=-1)


def oracle_cache() -> "Callable[[Path], HFOracle]":
    """``get(path)``: one :class:`HFOracle` per model folder, loaded on first use
    (what the plugin suites' session-scoped ``oracle_factory`` fixtures return)."""
    cache: dict[Path, HFOracle] = {}

    def get(path: Path) -> HFOracle:
        if path not in cache:
            cache[path] = HFOracle(path)
        return cache[path]

    return get
