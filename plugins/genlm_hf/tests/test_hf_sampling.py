"""Sampling through the HF backend: seeded, EOS, temperature."""

from __future__ import annotations

import torch


async def test_temperature_zero_and_low_are_greedy(llama) -> None:
    llm = llama
    prompt = [5, 9, 17, 33]
    greedy = await llm.sample(prompt, max_tokens=6, eos_token_ids=[], temperature=0.0)
    ctx, checked = list(prompt), 0
    for tok in greedy:  # the greedy chain, checked against full forward passes
        lp = llm.next_token_logprobs_uncached(ctx)
        assert tok == int(torch.argmax(lp))
        top2 = torch.topk(lp, 2).values
        if float(top2[0] - top2[1]) > 0.05:  # a clear mode: T=1e-3 misses it with p < V e^-50
            for seed in range(3):
                assert await llm.sample(ctx, 1, eos_token_ids=[], temperature=1e-3, seed=seed) == [tok]
            checked += 1
        ctx.append(tok)
    assert checked >= 2


async def test_temperature_changes_the_distribution(llama) -> None:
    """The mode's draw frequency follows softmax(logprobs / T) at every temperature."""
    llm = llama
    prompt = [7, 8, 9]
    lp = await llm.next_token_logprobs(prompt)
    top = int(torch.argmax(lp))
    n = 400
    freqs, expected = {}, {}
    for t in (0.3, 1.0, 3.0):
        draws = [await llm.sample(prompt, 1, eos_token_ids=[], temperature=t, seed=s) for s in range(n)]
        freqs[t] = sum(d == [top] for d in draws) / n
        p = float(torch.softmax(lp.double() / t, dim=-1)[top])
        expected[t] = p
        assert abs(freqs[t] - p) <= 4 * (p * (1 - p) / n) ** 0.5 + 0.01, (t, freqs[t], p)
    assert expected[0.3] > 2 * expected[1.0] > 4 * expected[3.0] / 2  # the temperatures really differ
    assert freqs[0.3] > freqs[1.0] > freqs[3.0]


async def test_seeded_and_eos(llama) -> None:
    llm = llama
    prompt = [3, 4, 5]
    a = await llm.sample(prompt, max_tokens=8, eos_token_ids=[], seed=11)
    assert a == await llm.sample(prompt, max_tokens=8, eos_token_ids=[], seed=11)
    assert a != await llm.sample(prompt, max_tokens=8, eos_token_ids=[], seed=12)
    stop = a[3]
    assert await llm.sample(prompt, max_tokens=8, eos_token_ids=[stop], seed=11) == a[: a.index(stop)]
    # default EOS: the tokenizer's end-of-text token
    assert llm.eos_token_ids == [llm.tokenizer.eos_token_id]
    out = await llm.sample(prompt, max_tokens=40, seed=3)
    assert llm.tokenizer.eos_token_id not in out
