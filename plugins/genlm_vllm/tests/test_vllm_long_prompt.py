"""A long prompt shared by particles on vLLM (CPU): every token is computed once.

The particles of a program extend one prompt; a step's contexts are the last step's plus a
token, and resampled particles share a context, then diverge. On the resident path one
context continues each live row and the others fork it (:mod:`genlm_vllm.fork`: the row's
partial last KV block is copied, not prefilled again past vLLM's full-block prefix cache).

Counted apart from the backend's own ``tokens_computed``: vLLM's scheduler reports the
tokens every engine step runs (``SchedulerOutput.total_num_scheduled_tokens``, summed by
wrapping ``Scheduler.schedule``), and the fewest tokens a run can compute is the number of
distinct non-empty prefixes of the contexts it asked for (a brute-force set). Rows are
compared with the uncached model's (a fresh prefill reading no cached block) within the
float32 bound of :func:`genlm_core.testing.tolerance.assert_backend_close`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from genlm_core.testing.tolerance import assert_backend_close


def scheduler(llm):
    """The in-process engine core's scheduler (the test engines run in this process)."""
    return llm.engine.llm.llm_engine.engine_core.engine_core.scheduler


@contextmanager
def scheduled_tokens(llm) -> Iterator[list[int]]:
    """The tokens vLLM's engine steps run while the block is open (``out[0]``)."""
    sched = scheduler(llm)
    total = [0]
    original = sched.schedule

    def schedule(*args, **kwargs):
        out = original(*args, **kwargs)
        total[0] += int(out.total_num_scheduled_tokens)
        return out

    sched.schedule = schedule
    try:
        yield total
    finally:
        del sched.schedule  # the class's method again


def distinct_prefixes(contexts: Sequence[Sequence[int]]) -> int:
    """The fewest tokens any engine computes for ``contexts``: their distinct prefixes."""
    return len({tuple(c[:k]) for c in contexts for k in range(1, len(c) + 1)})


def forks(llm) -> dict[str, int]:
    return dict(scheduler(llm).connector.counts)


def assert_uncached(llm, contexts, rows) -> None:
    for ctx, row in zip(contexts, rows):
        ref = llm.next_token_logprobs_uncached(list(ctx))
        assert_backend_close(llm, row, ref, f"a forked row of ...{list(ctx[-3:])}")


def test_a_shared_prompt_is_computed_once(smol_backend) -> None:
    """SmolLM2 (32-token KV blocks, the CPU default): a 300-token prompt (9 full blocks and
    12 tokens), 8 particles, 5 steps; at step 1 the particles pair up on 4 tokens (resampled
    duplicates), at step 2 each pair diverges (forks 13 tokens past the last full block)."""
    assert scheduler(smol_backend).block_size == 32
    llm = smol_backend
    llm.clear_cache()
    prompt = tuple(range(1000, 1300))
    n = 8
    steps: list[list[tuple[int, ...]]] = [[prompt] * n]
    steps.append([c + (2000 + i // 2,) for i, c in enumerate(steps[-1])])
    for k in range(2, 6):
        steps.append([c + (3000 + 10 * k + i,) for i, c in enumerate(steps[-1])])
    asked = [c for step in steps for c in step]
    before, forked = llm.stats()["engine"]["tokens_computed"], forks(llm)
    rows = []
    with scheduled_tokens(llm) as ran:
        for step in steps:
            rows.append(llm.batch_next_token_logprobs_sync([list(c) for c in step]))
    minimum = distinct_prefixes(asked)
    assert ran[0] == minimum, (
        f"vLLM ran {ran[0]} tokens; the contexts need {minimum} (the prompt is {len(prompt)})"
    )
    assert llm.stats()["engine"]["tokens_computed"] - before == ran[0]
    after = forks(llm)
    # step 1: 3 of 4 distinct contexts fork the prompt's row; step 2: 4 of 8 fork their pair's
    assert after["forks"] - forked["forks"] == 3 + 4 and after["forks_refused"] == forked["forks_refused"]
    for k in (1, 2, 5):
        assert_uncached(llm, steps[k][:: 1 if k == 2 else 2], rows[k][:: 1 if k == 2 else 2])


def test_forks_under_chunked_prefill(tiny_backend) -> None:
    """The tiny Llama (32-token blocks, a 32-token step budget: chunked prefill): a 45-token
    prompt, then 4 particles a token past it: one continues the prompt's row, 3 fork it
    (the 13 tokens past its full block are copied), each computes its own token only."""
    llm = tiny_backend
    llm.clear_cache()
    prompt = (1, 45, 496, 173, 701, *range(100, 140))
    llm.batch_next_token_logprobs_sync([list(prompt)])
    contexts = [prompt + (200 + i,) for i in range(4)]
    before, forked = llm.stats()["engine"]["tokens_computed"], forks(llm)
    with scheduled_tokens(llm) as ran:
        rows = llm.batch_next_token_logprobs_sync([list(c) for c in contexts])
    assert ran[0] == 4 and llm.stats()["engine"]["tokens_computed"] - before == 4
    after = forks(llm)
    assert after["forks"] - forked["forks"] == 3
    assert after["fork_tokens"] - forked["fork_tokens"] == 3 * (len(prompt) - 32)
    assert_uncached(llm, contexts, rows)
