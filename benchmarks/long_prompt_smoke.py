"""``bench_long_prompt.py --smoke``'s checks (CI): counters that show a prompt stopped being
held once, never a timing. Standard library only (``run_all.py`` imports it)."""

from __future__ import annotations

from typing import Any

from long_prompt_report import TARGETS, is_many, ok, ratio_to_minimum, tokens_max

#: engines whose counters the smoke run judges: every genlm-core engine (genlm-backend, the
#: reference, counts no tokens)
SMOKE_JUDGED = ("hf", "llamacpp", "vllm", "mlx")
#: the most passes over genlm-hf's KV pool a batch may take in the long-prompt workloads (a
#: round for a new shared prompt, one for the rows past it)
PASSES_PER_BATCH = 2
#: vLLM's KV block, in tokens (its default; the prefix cache reuses whole blocks only, so a
#: call computes again at most this less one of what was computed before: the part of the
#: prompt past its last full block, shared by every particle)
VLLM_BLOCK_TOKENS = 16


def tokens_bound(run: dict[str, Any], prefix: str, targets: dict[str, Any]) -> float:
    """The most tokens ``run`` may compute (``prefix`` "sequential_": its programs one
    after another): :func:`tokens_max` x the minimum; on vLLM, at least the minimum plus
    ``VLLM_BLOCK_TOKENS - 1`` a call (a prompt computed again per particle costs the
    prompt's length a call: 907 against 15)."""
    least = run[prefix + "minimum_tokens"]
    bound = tokens_max(run["kind"], targets) * least
    if run["kind"] == "vllm":
        calls = (
            run["calls"]
            if not prefix
            else run.get("many", {}).get("sequential", {}).get("calls", run["calls"])
        )
        bound = max(bound, least + calls * (VLLM_BLOCK_TOKENS - 1))
    return bound


#: tokens of a page of genlm-hf's KV pool (genlm_hf.pool.PAGE): a particle's last page is
#: held whole, so a run may hold up to a page a particle past the minimum
HELD_PAGE_TOKENS = 16


def kv_held_tokens(run: dict[str, Any]) -> tuple[float, str] | None:
    """Tokens of KV the engine held at the end of the shape's last run, by its own
    counter, and the counter's name: llama.cpp's KV cells in use; genlm-hf's pool bytes
    in use; else its prefix cache's KV bytes (genlm-mlx). None where it reports none
    (vLLM) or the KV size per token is unknown."""
    stats = run.get("stats_end") or {}
    engine, cache = stats.get("engine") or {}, stats.get("prefix_cache") or {}
    if engine.get("kv_cells_used") is not None:
        return float(engine["kv_cells_used"]), "engine.kv_cells_used"
    kv = run.get("kv_bytes_per_token")
    for section, key in (("engine", "kv_pool_bytes_in_use"), ("prefix_cache", "kv_bytes")):
        value = (engine if section == "engine" else cache).get(key)
        if kv and value:
            return value / kv, f"{section}.{key}"
    return None


def smoke(result: dict[str, Any]) -> list[str]:
    """Counters that show a prompt stopped being held once (never timings), for every run
    of the engines of :data:`SMOKE_JUDGED` in ``result``:

    - tokens computed at most :func:`tokens_bound` (the engine's :func:`tokens_max` x the
      minimum: a particle computing the prompt again costs N x the prompt's tokens); a
      many-programs run: its programs together and one after another (a program
      computing another's prompt, or its own again, costs that prompt's tokens);
    - prompt copies: the KV the engine holds at the end by its own counter
      (:func:`kv_held_tokens`) at most the minimum (each prompt once, every particle's
      own tokens) plus N/2 - 1 more copies of the prompt (a many-programs run: of every
      program's prompt): an engine that holds a copy of a prompt for more than half of
      its N particles exceeds it; one that holds it once holds about the minimum (genlm-hf
      rounds each context up to its 16-token pages);
    - one program of N particles: the shape's peak RSS above the RSS when it started at
      most N/2 x the prompt's KV bytes (the model's config and the engine's KV dtype):
      one that holds the prompt once grows by one prompt's KV plus what a forward pass
      over the prompt needs. Not for the many-programs shapes (their 4 particles allow 2
      copies, and a forward pass over 3 prompts at once takes about as much for a moment)
      nor for vLLM (it reserves its KV space at the load, and its prefix cache takes
      unused blocks before reused ones, so its RSS follows the blocks touched);
    - genlm-hf's passes over its KV pool at most :data:`PASSES_PER_BATCH` per batch the
      batcher ran (a call runs a round per level of shared new prefixes: a prompt and its
      particles, two; a call that ran a pass per token of a nested context ran hundreds).

    Any run that did not finish is a problem (CI requires every backend)."""
    problems = []
    targets = {**TARGETS, **result.get("targets", {})}
    for run in result.get("runs", []):
        name = f"long-prompt {run['engine']} {run['shape']}"
        if not ok(run):
            problems.append(f"{name}: {run.get('status')}")
            continue
        if run["kind"] not in SMOKE_JUDGED:
            continue
        for prefix, what in (("", ""), ("sequential_", " (the programs one after another)")):
            if prefix and not is_many(run):
                continue
            r, bound = ratio_to_minimum(run, prefix), tokens_bound(run, prefix, targets)
            if r is None or run[prefix + "tokens_computed"] > bound:
                problems.append(
                    f"{name}{what}: {run.get(prefix + 'tokens_computed')} tokens computed for a minimum of "
                    f"{run[prefix + 'minimum_tokens']} ({r if r is None else round(r, 2)}x, more than "
                    f"{bound / run[prefix + 'minimum_tokens']:.3g}x: the prefix is computed again)"
                )
        passes, batches = (
            (run.get("counters") or {}).get("engine.pool_passes"),
            (run.get("counters") or {}).get("batcher.batches"),
        )
        if passes is not None and batches and passes > PASSES_PER_BATCH * batches:
            problems.append(
                f"{name}: {passes:.0f} passes over the KV pool for {batches:.0f} batches (more than "
                f"{PASSES_PER_BATCH} a batch: a call runs passes per token)"
            )
        copies = run["particles"] / 2
        held = kv_held_tokens(run)
        # each particle's last page of genlm-hf's pool is held whole (HELD_PAGE_TOKENS)
        pages = (
            run["particles"]
            * (run.get("programs") or len(run.get("prompt_lengths") or [1]))
            * HELD_PAGE_TOKENS
        )
        if held is not None and held[0] > run["minimum_tokens"] + (copies - 1) * run["prompt_tokens"] + pages:
            problems.append(
                f"{name}: the engine holds {held[0]:.0f} tokens of KV ({held[1]}) for a minimum of "
                f"{run['minimum_tokens']}, more than {copies:g} copies of the prompt ({run['prompt_tokens']} "
                "tokens): the prompt is held per particle"
            )
        if run["kind"] == "vllm" or is_many(run):
            continue
        mem, kv = run["memory"], run.get("kv_bytes_per_token")
        if not kv:
            problems.append(f"{name}: no KV size per token to judge the memory by (model config?)")
            continue
        # where the peak could not be reset at the shape's start, the process's: at least the runs'
        peak = mem["run_peak_bytes"] if mem.get("run_peak_bytes") is not None else mem["peak_bytes"]
        grew = peak - mem.get("rss_before_bytes", mem["rss_after_load_bytes"])
        bound = copies * run["prompt_tokens"] * kv
        if grew > bound:
            problems.append(
                f"{name}: RSS grew {grew / 2**20:.0f} MiB over the runs, more than {copies:g} "
                f"copies of the prompt's KV ({bound / 2**20:.0f} MiB): the prompt is held per particle"
            )
    return problems
