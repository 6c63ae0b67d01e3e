"""Sampling with vLLM's own sampler: what :meth:`genlm_vllm.engine.VLLMEngine.sample` does.

The core batches concurrent ``sample`` calls (checked and clamped) into one
:func:`sample` call: one ``LLM.generate`` in which every request is seeded on its own
and stops on the caller's EOS ids only (``ignore_eos=True``). On CPU, seeded prompts are
kept out of chunked prefill (:func:`sample_groups`).
"""

from __future__ import annotations

from typing import Any

from genlm_core.engine import SampleRequest

__all__ = ["sample", "sample_groups"]


def sample(llm: Any, device: str, requests: list[SampleRequest], lora: Any = None) -> list[list[int]]:
    """The tokens of every request, from one ``LLM.generate`` per group (:func:`sample_groups`)."""
    results: list[list[int]] = []
    for group in sample_groups(llm, device, requests, lora):
        results.extend(_sample_group(llm, group, lora))
    return results


def sample_groups(
    llm: Any, device: str, requests: list[SampleRequest], lora: Any = None
) -> list[list[SampleRequest]]:
    """Split a sampling batch so no seeded prompt is prefilled in chunks on CPU.

    vLLM 0.32's CPU runner rewinds the per-request generator of a partially
    prefilled seeded request with ``Generator.set_offset``, which CPU generators do
    not support (``RuntimeError: CPU Generator does not use offset``). Groups whose
    prompts fit in one step's token budget are prefilled in one step; a longer
    seeded prompt is first prefilled unseeded (filling the prefix cache) so the
    seeded request only computes its last block.
    """
    if device != "cpu" or all(r.seed is None for r in requests):
        return [requests]
    budget = int(llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens)
    groups: list[list[SampleRequest]] = []
    current: list[SampleRequest] = []
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
            _warm_prefix(llm, group[0].prompt, lora)
    return groups


def _warm_prefix(llm: Any, prompt: tuple[int, ...], lora: Any) -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False)
    llm.generate([TokensPrompt(prompt_token_ids=list(prompt))], params, use_tqdm=False, lora_request=lora)


def _sample_group(llm: Any, requests: list[SampleRequest], lora: Any) -> list[list[int]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = [
        SamplingParams(
            n=1,
            max_tokens=r.max_tokens,
            temperature=r.temperature,
            seed=r.seed,
            stop_token_ids=sorted(r.eos),
            ignore_eos=True,  # only the caller's EOS ids stop generation
            detokenize=False,
        )
        for r in requests
    ]
    prompts = [TokensPrompt(prompt_token_ids=list(r.prompt)) for r in requests]
    outs = llm.generate(prompts, params, use_tqdm=False, lora_request=lora)
    results: list[list[int]] = []
    for r, out in zip(requests, outs):
        ids = [int(t) for t in out.outputs[0].token_ids]
        if ids and ids[-1] in r.eos:
            ids = ids[:-1]
        results.append(ids)
    return results
