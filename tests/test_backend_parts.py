"""The backend composed of its parts (:mod:`genlm_core.engine.backend`).

Oracles: the parts' own methods (each public call of the backend must take exactly the
part's arguments and give what the part gives), the ``LogprobBackend`` protocol, a
subclass written here that records every check it is asked (genlm-compat's refine
``validate`` and ``max_context_length`` the same way), and object identity for what the
parts share.
"""

from __future__ import annotations

import asyncio
import inspect
import warnings
from typing import Any

import pytest
import torch
from genlm_mock.config import MockConfig
from genlm_mock.engine import MockEngine

from genlm_core.engine import BaseLogprobBackend
from genlm_core.engine.backend.burst_calls import Bursts
from genlm_core.engine.backend.cache_controls import CacheControls
from genlm_core.engine.backend.context_checks import ContextChecks
from genlm_core.engine.backend.logprob_calls import LogprobCalls
from genlm_core.engine.backend.lora_controls import LoraControls
from genlm_core.engine.backend.sample_calls import SampleCalls
from genlm_core.protocols import LogprobBackend

LIMIT = 6

#: the part each public call of the backend hands over to, by the part's attribute
PARTS: dict[str, type] = {
    "context_checks": ContextChecks,
    "logprob_calls": LogprobCalls,
    "sample_calls": SampleCalls,
    "bursts": Bursts,
    "cache_controls": CacheControls,
    "lora_controls": LoraControls,
}
#: what a part keeps public for the other parts, not the backend's callers
FOR_PARTS = {
    "shared_row",
    "shared_row_sync",
    "clear_engine_caches",
    "drop_stale",
    "step_logprobs",
    "end_burst",
}


def _public(cls: type) -> dict[str, Any]:
    return {
        n: v
        for n, v in vars(cls).items()
        if not n.startswith("_") and (callable(v) or isinstance(v, property))
    }


def _arguments(fn: Any) -> list[tuple[str, Any, Any]]:
    """Each argument's name, kind and default (annotations are strings, spelled per module)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def backend(cls: type[BaseLogprobBackend] = BaseLogprobBackend, **options: Any) -> BaseLogprobBackend:
    config = MockConfig(max_context_length=LIMIT, timeout=0.0, **options)
    return cls(MockEngine(config=config), config)


def test_every_public_call_of_a_part_is_on_the_backend_with_the_parts_signature() -> None:
    """Each call the parts answer is the backend's own (no mixin: a name on the class
    itself), taking the part's arguments (the backend's signature less ``self`` is the
    part's), so genlm-compat's and genlm-control's calls keep their meaning."""
    own = vars(BaseLogprobBackend)
    checked = 0
    for cls in PARTS.values():
        for name, member in _public(cls).items():
            if name in FOR_PARTS:
                continue
            assert name in own, f"{cls.__name__}.{name} is not on BaseLogprobBackend"
            mine = own[name]
            if isinstance(member, property):
                assert isinstance(mine, property), name
                continue
            assert _arguments(mine) == _arguments(member), name
            assert inspect.iscoroutinefunction(mine) == inspect.iscoroutinefunction(member), name
            checked += 1
    assert checked >= 20
    assert BaseLogprobBackend.__mro__[1:] == (object,)  # composed, not inherited
    llm = backend()
    try:
        assert isinstance(llm, LogprobBackend)
        for name in ("next_token_logprobs", "batch_next_token_logprobs", "sample", "clear_cache"):
            assert name in own
    finally:
        llm.close()


def test_the_parts_share_one_lock_batcher_cache_and_lifecycle() -> None:
    llm = backend()
    try:
        parts = [getattr(llm, attr) for attr in PARTS]
        assert {id(p.engine_lock) for p in parts if hasattr(p, "engine_lock")} == {id(llm.engine_lock)}
        assert {id(p.lifecycle) for p in parts if hasattr(p, "lifecycle")} == {id(llm.lifecycle)}
        assert llm.logprob_calls.batcher is llm.batcher is llm.cache_controls.batcher
        assert llm.logprob_calls.output_cache is llm.output_cache is llm.cache_controls.output_cache
        assert llm.batcher.batch_fn.output_cache is llm.output_cache  # the batch function keeps rows there
        assert llm.logprob_calls.rows is llm.rows is llm.bursts.rows
        assert llm.lora_controls.cache_controls is llm.cache_controls
        assert llm.sample_calls.eos_token_ids is llm.eos_token_ids
    finally:
        llm.close()
    # closed once, refused everywhere
    with pytest.raises(RuntimeError, match="closed"):
        llm.next_token_logprobs_sync([1])
    with pytest.raises(RuntimeError, match="closed"):
        llm.sample_sync([1], 2)
    with pytest.raises(RuntimeError, match="closed"):
        llm.batch_next_token_logprobs_sync([])
    assert not llm.supports_burst and not llm.healthy


class Wider(BaseLogprobBackend):
    """A subclass refining the checks: it records every context it is asked to check and
    accepts one token more than the engine's limit (as genlm-compat's AsyncTransformer
    accepts the model's whole window)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.checked: list[tuple[int, ...]] = []
        super().__init__(*args, **kwargs)

    def validate(self, token_ids: Any) -> tuple[int, ...]:
        self.checked.append(tuple(token_ids))
        return super().validate(token_ids)

    @property
    def max_context_length(self) -> int | None:
        return LIMIT + 1


class OneStep:
    """A burst control adding one row and drawing token 1 for it."""

    def __init__(self, prompt: list[int]) -> None:
        self.adds: list[tuple[int, list[int], Any]] = [(0, prompt, None)]

    def draw(self, logprobs: torch.Tensor, handles: list[int]) -> list[int]:
        return [1] * len(handles)

    def drain_adds(self) -> list[tuple[int, list[int], Any]]:
        out, self.adds = self.adds, []
        return out

    def drain_aborts(self) -> list[int]:
        return []

    def on_burst_end(self) -> None:
        pass


def test_a_subclass_refining_validate_and_the_limit_holds_for_every_call() -> None:
    llm = backend(Wider)
    full = list(range(1, LIMIT + 2))  # one token past the engine's limit: the subclass's own
    try:
        with pytest.raises(ValueError, match="at most"):
            backend().next_token_logprobs_sync(full)  # the base refuses it
        calls = {
            "next_token_logprobs_sync": lambda: llm.next_token_logprobs_sync(full),
            "next_token_logprobs": lambda: asyncio.run(llm.next_token_logprobs(full)),
            "batch_next_token_logprobs_sync": lambda: llm.batch_next_token_logprobs_sync([full]),
            "batch_next_token_logprobs": lambda: asyncio.run(llm.batch_next_token_logprobs([full])),
            "next_token_logprobs_uncached": lambda: llm.next_token_logprobs_uncached(full),
            "sample_sync": lambda: llm.sample_sync(full[:-1], 1, seed=0),
            "sample": lambda: asyncio.run(llm.sample(full[:-1], 1, seed=0)),
            "batch_sample": lambda: asyncio.run(llm.batch_sample([full[:-1]], 1, seed=0)),
            "run_burst": lambda: llm.run_burst(OneStep(full[:-1]), 1),
            "cache_kv": lambda: llm.cache_kv(full),
        }
        for name, call in calls.items():
            llm.checked.clear()
            call()
            assert llm.checked, f"{name} did not check through the subclass's validate"
        # the clamp reads the subclass's limit (LIMIT + 1): the last token drawn is scored at
        # a context of that many tokens, so a prompt of n tokens leaves LIMIT + 2 - n draws
        for prompt in (full[:-1], full):
            assert llm.sample_request(prompt, 5).max_tokens == LIMIT + 2 - len(prompt)
    finally:
        llm.close()


def test_a_current_engine_loads_without_the_old_contracts_shims(monkeypatch, tmp_path) -> None:
    """``from_checkpoint`` calls the engine's ``load`` itself; the 0.1 contract's loader
    and limit (genlm_core._deprecated) are for old engines only."""
    from genlm_core import _deprecated
    from genlm_core.engine import read_checkpoint

    def refuse(*args: Any) -> Any:
        raise AssertionError("a shim of the old contract ran for a current engine")

    monkeypatch.setattr(_deprecated, "engine_loader", refuse)
    monkeypatch.setattr(_deprecated, "engine_positions", refuse)
    config = MockConfig(max_context_length=LIMIT)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        llm = BaseLogprobBackend.from_checkpoint(read_checkpoint(config), config, engine_class=MockEngine)
    try:
        assert llm.max_context_length == LIMIT and llm.next_token_logprobs_sync([1]).shape == (
            llm.vocab_size,
        )
    finally:
        llm.close()
