"""Sampling with vLLM's own sampler: the sampling methods of
:class:`~genlm_vllm.backend.VLLMBackend`.

:class:`VLLMSampling` is a mixin of the backend (it uses the backend's engine ``llm``,
its ``sample_batcher``, ``validate`` and health checks; :class:`_SampleRequest` is what
that batcher queues). Concurrent ``sample`` calls become one ``LLM.generate``: every
request is seeded on its own and stops on the caller's EOS ids only
(``ignore_eos=True``); on CPU, seeded prompts are kept out of chunked prefill
(:meth:`VLLMSampling._sample_groups`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["VLLMSampling"]


@dataclass(frozen=True)
class _SampleRequest:
    prompt: tuple[int, ...]
    max_tokens: int
    eos: tuple[int, ...]
    temperature: float
    seed: int | None


class VLLMSampling:
    """The sampling methods of :class:`~genlm_vllm.backend.VLLMBackend` (a mixin)."""

    # set by VLLMBackend.__init__
    llm: Any
    sample_batcher: Any  # AutoBatcher[_SampleRequest, list[int]]
    _device: str
    _max_model_len: int
    _active_lora: Any

    async def sample(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[int]:
        """Sample with vLLM's sampler; stops at (and drops) any token of ``eos_token_ids``.

        Concurrent calls are batched into one ``LLM.generate``. ``eos_token_ids=None``
        uses the tokenizer's EOS ids; ``[]`` never stops early. The model's own EOS
        only stops generation when it is in that list (``ignore_eos=True``).
        """
        ctx = self.validate(prompt_token_ids)
        max_tokens, temperature, eos = self._check_sample_args(max_tokens, temperature, eos_token_ids)
        room = self._max_model_len - len(ctx)
        max_tokens = min(max_tokens, room)
        if max_tokens <= 0:
            return []
        req = _SampleRequest(
            ctx, max_tokens, tuple(sorted(eos)), temperature, None if seed is None else int(seed)
        )
        return await self.sample_batcher.submit(req)

    def sample_sync(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[int]:
        """Synchronous :meth:`sample` (one engine call, under the model lock)."""
        ctx = self.validate(prompt_token_ids)
        max_tokens, temperature, eos = self._check_sample_args(max_tokens, temperature, eos_token_ids)
        max_tokens = min(max_tokens, self._max_model_len - len(ctx))
        if max_tokens <= 0:
            return []
        req = _SampleRequest(ctx, max_tokens, tuple(sorted(eos)), temperature, seed)
        return self.sample_batcher.run_sync([req])[0]

    def _sample_batch_fn(self, requests: list[_SampleRequest]) -> list[list[int]]:
        self._check_healthy()
        results: list[list[int]] = []
        try:
            for group in self._sample_groups(requests):
                results.extend(self._sample_group(group))
        except BaseException as exc:
            self._check_healthy(exc)
            raise
        return results

    def _sample_groups(self, requests: list[_SampleRequest]) -> list[list[_SampleRequest]]:
        """Split a sampling batch so no seeded prompt is prefilled in chunks on CPU.

        vLLM 0.32's CPU runner rewinds the per-request generator of a partially
        prefilled seeded request with ``Generator.set_offset``, which CPU generators do
        not support (``RuntimeError: CPU Generator does not use offset``). Groups whose
        prompts fit in one step's token budget are prefilled in one step; a longer
        seeded prompt is first prefilled unseeded (filling the prefix cache) so the
        seeded request only computes its last block.
        """
        if self._device != "cpu" or all(r.seed is None for r in requests):
            return [requests]
        budget = int(self.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens)
        groups: list[list[_SampleRequest]] = []
        current: list[_SampleRequest] = []
        used = 0
        for r in requests:
            if current and used + len(r.prompt) > budget:
                groups.append(current)
                current, used = [], 0
            current.append(r)
            used += len(r.prompt)
        if current:
            groups.append(current)
        for group in groups:
            if len(group) == 1 and group[0].seed is not None and len(group[0].prompt) > budget:
                self._warm_prefix(group[0].prompt)
        return groups

    def _warm_prefix(self, prompt: tuple[int, ...]) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False)
        self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(prompt))],
            params,
            use_tqdm=False,
            lora_request=self._active_lora,
        )

    def _sample_group(self, requests: list[_SampleRequest]) -> list[list[int]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [
            SamplingParams(
                n=1,
                max_tokens=r.max_tokens,
                temperature=r.temperature,
                seed=r.seed,
                stop_token_ids=list(r.eos),
                ignore_eos=True,  # only the caller's EOS ids stop generation
                detokenize=False,
            )
            for r in requests
        ]
        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt)) for r in requests]
        outs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self._active_lora)
        results: list[list[int]] = []
        for r, out in zip(requests, outs):
            ids = [int(t) for t in out.outputs[0].token_ids]
            if ids and ids[-1] in r.eos:
                ids = ids[:-1]
            results.append(ids)
        return results
