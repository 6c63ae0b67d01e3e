"""``benchmarks/bench_long_prompt.py`` (long shared prompts): its instrument and its verdicts.

Oracles: the minimum token count against a brute-force set of every prefix of every
context asked for (and, end to end, against the SIS particles' own contexts); systematic
resampling against its defining property (each particle gets the floor or the ceiling of
N x its weight in copies); the SMC program against its constraint (no particle holds a
banned token); the prompt cuts against SmolLM2's tokenizer on the whole shipped file;
the verdicts and the smoke checks against records built here, moved past each target.
End to end: the benchmark on real engines (genlm-hf and genlm-llamacpp on the tiny
Llama), each in its worker process.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import random
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


@pytest.fixture(scope="module")
def bench() -> Iterator[dict[str, ModuleType]]:
    """The benchmark's modules, imported as the script imports them (``benchmarks/`` on
    sys.path); both undone afterwards (``common`` is a name other code may use)."""
    import importlib

    names = {p.stem for p in BENCH.glob("*.py")}
    saved_path = list(sys.path)
    saved = {n: sys.modules.pop(n) for n in names if n in sys.modules}
    sys.path.insert(0, str(BENCH))
    try:
        yield {
            n: importlib.import_module(n)
            for n in (
                "prefix_tree",
                "smc_workload",
                "long_prompts",
                "long_prompt_report",
                "bench_long_prompt",
            )
        }
    finally:
        sys.path[:] = saved_path
        for n in names:
            sys.modules.pop(n, None)
        sys.modules.update(saved)


def all_prefixes(contexts: list[list[int]]) -> int:
    """The brute-force minimum: every non-empty prefix of every context, as a set."""
    return len({tuple(c[:i]) for c in contexts for i in range(1, len(c) + 1)})


# ---------------------------------------------------------------------- the minimum
def test_the_tree_counts_every_distinct_prefix_once(bench: dict[str, ModuleType]) -> None:
    rng = random.Random(0)
    prompt = [rng.randrange(50) for _ in range(40)]
    contexts: list[list[int]] = [list(prompt)]
    for _ in range(300):  # particles growing, copied, and contexts that share no prompt
        parent = rng.choice(contexts)
        kind = rng.random()
        if kind < 0.7:
            contexts.append(parent + [rng.randrange(5)])
        elif kind < 0.8:
            contexts.append(list(parent))  # a duplicate: counts nothing new
        elif kind < 0.9:
            contexts.append(prompt[: rng.randrange(1, len(prompt))])  # a prefix of the prompt
        else:
            contexts.append([rng.randrange(50) for _ in range(rng.randrange(1, 60))])
    tree = bench["prefix_tree"].PrefixTree(shared=prompt)
    for i, c in enumerate(contexts):
        tree.add(tuple(c) if i % 3 == 0 else c)  # tuples walk the same tree
    assert tree.tokens == all_prefixes(contexts)
    # the shortcut changes nothing: the same count without it
    plain = bench["prefix_tree"].PrefixTree()
    for c in contexts:
        plain.add(c)
    assert plain.tokens == tree.tokens


def test_the_wrapped_call_counts_and_passes_through(bench: dict[str, ModuleType]) -> None:
    seen: list[list[int]] = []

    async def model(ids: list[int]) -> str:
        seen.append(ids)
        return f"row{len(ids)}"

    calls: list[int] = []
    tree = bench["prefix_tree"].PrefixTree(shared=[1, 2])
    call = tree.wrap(model, on_call=lambda t: calls.append(t.calls))

    async def go() -> list[str]:
        return await asyncio.gather(call([1, 2]), call([1, 2, 3]), call([1, 2, 3]), call([9]))

    assert asyncio.run(go()) == ["row2", "row3", "row3", "row1"]
    assert seen == [[1, 2], [1, 2, 3], [1, 2, 3], [9]]
    assert (tree.calls, tree.tokens, calls) == (4, 4, [1, 2, 3, 4])


# ---------------------------------------------------------------------- SMC
def test_systematic_resampling_gives_floor_or_ceiling_of_each_share(bench: dict[str, ModuleType]) -> None:
    import torch

    smc = bench["smc_workload"]
    rng = random.Random(1)
    gen = torch.Generator().manual_seed(0)
    for n in (1, 7, 32, 256):
        logw = [rng.gauss(0, 3) for _ in range(n)]
        top = max(logw)
        total = sum(math.exp(w - top) for w in logw)
        for _ in range(5):
            ancestors = smc.resample(logw, "systematic", gen)
            assert len(ancestors) == n
            for i, w in enumerate(logw):
                share = n * math.exp(w - top) / total
                assert math.floor(share - 1e-9) <= ancestors.count(i) <= math.ceil(share + 1e-9)


def test_multinomial_resampling_is_seeded_and_never_picks_a_dead_particle(
    bench: dict[str, ModuleType],
) -> None:
    import torch

    smc = bench["smc_workload"]
    logw = [0.0, float("-inf"), -1.0, float("-inf"), 2.0]
    a = smc.resample(logw, "multinomial", torch.Generator().manual_seed(3))
    b = smc.resample(logw, "multinomial", torch.Generator().manual_seed(3))
    assert a == b and len(a) == 5 and not {1, 3} & set(a)
    with pytest.raises(ValueError, match="systematic, multinomial"):
        smc.resample(logw, "stratified", torch.Generator())


def test_ess(bench: dict[str, ModuleType]) -> None:
    ess = bench["smc_workload"].ess
    assert ess([0.5] * 8) == pytest.approx(8)
    assert ess([0.0] + [-200.0] * 7) == pytest.approx(1)
    w = [0.1, -0.3, 1.2]
    p = [math.exp(x) for x in w]
    assert ess(w) == pytest.approx(sum(p) ** 2 / sum(x * x for x in p))


def test_smc_keeps_its_constraint_resamples_and_its_minimum_is_exact(bench: dict[str, ModuleType]) -> None:
    """A fake model whose rows put a context-dependent share of mass on banned tokens:
    the weights spread, so particles die and duplicate; no particle ever holds a banned
    token; the tree's minimum equals the brute-force count of the contexts asked for."""
    import torch

    smc = bench["smc_workload"]
    vocab = [b"a", b"e", b"b", b"be", b"c", b"ce", b"d", b"<eos>"]
    eos = 7
    asked: list[list[int]] = []

    async def model(ids: list[int]) -> torch.Tensor:
        asked.append(list(ids))
        h = int(hashlib.sha256(str(ids).encode()).hexdigest()[:8], 16)
        logits = torch.tensor([(h >> (3 * i)) % 8 for i in range(len(vocab))], dtype=torch.float) / 1.5
        logits[eos] = -2.0
        return torch.log_softmax(logits, -1)

    prompt = [0, 2, 4]
    tree = bench["prefix_tree"].PrefixTree(shared=prompt)
    res = asyncio.run(smc.smc(tree.wrap(model), vocab, eos, prompt, n_particles=16, max_tokens=12, seed=0))
    assert res["resamples"] > 0 and res["died"] > 0
    assert res["calls"] == len(asked) == tree.calls
    for p in res["particles"]:
        assert all(b"e" not in vocab[t] for t in p.context) and len(p.context) <= 12
    assert tree.tokens == all_prefixes(asked)
    # a resampled particle's history is shared: fewer nodes than calls past the prompt
    assert tree.tokens < len(prompt) + res["calls"]


# ---------------------------------------------------------------------- prompts and shapes
def test_the_prompts_are_exact_smollm2_token_counts_of_the_shipped_text(bench: dict[str, ModuleType]) -> None:
    from transformers import AutoTokenizer

    from genlm_core import models

    lp = bench["long_prompts"]
    text = (BENCH / "prompts" / "GPL-3.txt").read_bytes()
    readme = (BENCH / "prompts" / "README.md").read_text()
    assert hashlib.sha256(text).hexdigest() in readme  # the file is the one the README names
    tok = AutoTokenizer.from_pretrained(str(models.smollm2_path(progress=False)))
    whole = tok.encode(text.decode(), add_special_tokens=False)
    for name, n in (("907", 907), ("4096", 4096)):
        ids = lp.prompt_ids(name, tok)
        assert len(ids) == n == lp.PROMPTS[name].smollm2_tokens
        assert ids == whole[:n]  # the cut ends where a token of the whole text ends
    assert len(lp.prompt_ids("3", tok)) == 3
    with pytest.raises(ValueError, match="not 907"):
        lp.prompt_ids("907", type("T", (), {"encode": lambda self, s, add_special_tokens: [1, 2]})())


def test_shapes_parse_and_the_grid(bench: dict[str, ModuleType]) -> None:
    lp = bench["long_prompts"]
    assert [s.name for s in lp.parse_shapes(["907x32x30", "3x64x200:smc"])] == [
        "907x32x30:sis",
        "907x32x30:smc",
        "3x64x200:smc",
    ]
    for bad, says in (
        ("907x32", "PROMPTxPARTICLESxTOKENS"),
        ("5x32x30", "no prompt '5'"),
        ("3x4x5:beam", "no program"),
    ):
        with pytest.raises(ValueError, match=says):
            lp.parse_shapes([bad])
    assert len(lp.FULL) == 36 == len(set(lp.FULL))
    assert lp.FULL == sorted(lp.FULL, key=lp.Shape.sort_key)
    assert lp.HEADLINE in lp.FULL and set(lp.WITHIN_2X) <= set(lp.FULL)


# ---------------------------------------------------------------------- verdicts
def _run(
    engine: str, shape: str, cps: float, tokens: int | None = 1900, minimum: int = 1850, **kw: Any
) -> dict:
    prompt, particles, rest = shape.split("x")
    n_tokens, program = rest.split(":")
    run = {
        "engine": engine,
        "kind": engine.partition("@")[0],
        "shape": shape,
        "prompt": prompt,
        "particles": int(particles),
        "tokens": int(n_tokens),
        "program": program,
        "status": "ok",
        "calls": 992,
        "wall_s": 992 / cps,
        "calls_per_s": cps,
        "steps": 31,
        "prompt_tokens": int(prompt),
        "minimum_tokens": minimum,
        "tokens_computed": tokens,
        "engine_s": 0.8 * 992 / cps,
        "program_account": {"copy_ms_per_call": 0.01, "sample_ms_per_call": 1.0},
        "memory": {"rss_after_load_bytes": 600e6, "run_peak_bytes": 700e6, "peak_bytes": 1.2e9},
        "kv_bytes_per_token": 46080,
        "load_s": 3.0,
    }
    run.update(kw)
    return run


def _record(bench: dict[str, ModuleType]) -> dict:
    runs = [
        _run("hf", "907x32x30:sis", 200.0),
        _run("llamacpp", "907x32x30:sis", 170.0),
        _run("vllm", "907x32x30:sis", 190.0),
        _run("reference", "907x32x30:sis", 1.0, tokens=None, status="did not finish in 600 s"),
        _run("hf", "907x64x200:sis", 150.0),
        _run("hf", "3x64x200:sis", 250.0),
    ]
    return {"runs": runs, "targets": bench["long_prompt_report"].TARGETS}


def _met(rows: list[dict], start: str) -> str:
    return next(r["met"] for r in rows if r["metric"].startswith(start))


def test_the_headline_follows_the_figures(bench: dict[str, ModuleType]) -> None:
    report = bench["long_prompt_report"]
    rec = _record(bench)
    at = "long prompt 907x32x30 SIS: genlm-hf"
    rows = report.headline(rec)
    assert [_met(rows, f"{at} {m}") for m in ("calls/s", "vs genlm-llamacpp", "vs genlm-vllm")] == ["yes"] * 3
    assert _met(rows, f"{at} tokens computed") == "yes" and _met(rows, f"{at} peak RSS") == "yes"
    assert _met(rows, "long prompt 907x64x200 SIS") == "yes"  # 250 / 150 = 1.67x slower
    ref = next(r for r in rows if "genlm-backend" in r["metric"])
    assert ref["anchor"] == "did not finish in 600 s" and ref["met"] == ""
    # moved past each target, by the targets' own wording
    hf = rec["runs"][0]
    hf.update(
        calls_per_s=165.0, tokens_computed=int(1.06 * 1850), memory={**hf["memory"], "peak_bytes": 1.6e9}
    )
    rec["runs"][4]["calls_per_s"] = 124.0  # 250 / 124 > 2x
    rows = report.headline(rec)
    for m in ("calls/s", "vs genlm-llamacpp", "tokens computed", "peak RSS"):
        assert _met(rows, f"{at} {m}") == "NO", m
    assert _met(rows, f"{at} vs genlm-vllm") == "NO"  # 165 / 190 = 0.87 < 0.9
    assert _met(rows, "long prompt 907x64x200 SIS") == "NO"
    rec["runs"][0]["status"] = "failed (exit 1): boom"
    assert report.headline(rec)[0]["met"] == "NO"


def test_smoke_fails_on_recomputed_or_copied_prompts_and_never_on_timings(
    bench: dict[str, ModuleType],
) -> None:
    report = bench["long_prompt_report"]
    good = [_run("hf", "907x32x3:sis", 0.1), _run("llamacpp", "907x32x3:sis", 0.1)]
    assert report.smoke({"runs": good}) == []  # slow is fine: no timing is judged
    recomputed = _run("hf", "907x32x3:sis", 300.0, tokens=29_000, minimum=968)
    assert "computed again" in report.smoke({"runs": [recomputed]})[0]
    # the runs' peak above the load's RSS: 16 prompt copies (32 / 2) are the most allowed
    bound = 16 * 907 * 46080
    held = _run("hf", "907x32x3:sis", 300.0)
    held["memory"] = {**held["memory"], "run_peak_bytes": 600e6 + bound + 1}
    assert "held per particle" in report.smoke({"runs": [held]})[0]
    held["memory"]["run_peak_bytes"] = 600e6 + bound - 1
    assert report.smoke({"runs": [held]}) == []
    not_judged = _run("vllm", "907x32x3:sis", 1.0, tokens=5000, minimum=968)
    assert report.smoke({"runs": [not_judged]}) == []
    # genlm-hf's passes over its pool: a pass per token of a nested call is a problem
    per_batch = report.PASSES_PER_BATCH
    stepped = _run(
        "hf", "907x32x3:sis", 300.0, counters={"engine.pool_passes": per_batch * 31, "batcher.batches": 31}
    )
    assert report.smoke({"runs": [stepped]}) == []
    stepped["counters"]["engine.pool_passes"] += 1
    assert "passes per token" in report.smoke({"runs": [stepped]})[0]
    failed = _run("llamacpp", "907x32x3:sis", 1.0, status="failed (exit 1): no GGUF")
    assert report.smoke({"runs": [failed]}) == ["long-prompt llamacpp 907x32x3:sis: failed (exit 1): no GGUF"]


def test_run_all_runs_the_section_and_its_smoke(bench: dict[str, ModuleType]) -> None:
    import run_all

    assert run_all._sections(True)["long-prompt"] == ["bench_long_prompt.py", "--smoke"]
    assert run_all.FILES["long-prompt"] == ["long_prompt"]
    assert run_all.verdict("long-prompt")({"runs": []}) == []


# ---------------------------------------------------------------------- end to end
def test_the_benchmark_end_to_end_on_real_engines(bench: dict[str, ModuleType], tmp_path: Path) -> None:
    """genlm-hf (SIS) and genlm-llamacpp (SMC) on the tiny Llama, in their worker processes:
    every run finishes, its minimum is the SIS particles' own distinct prefixes, no engine
    computes fewer tokens than the minimum, memory is read, and the report is written."""
    from genlm_llamacpp.convert import tiny_gguf_path

    from genlm_core.testing.models import tiny_llama

    out = tmp_path / "long_prompt.json"
    argv = ["--model", str(tiny_llama()), "--gguf", str(tiny_gguf_path("llama")), "--warmup", "short"]
    argv += ["--contexts", "--out", str(out)]
    main = bench["bench_long_prompt"].main
    main([*argv, "--engines", "hf", "--shapes", "3x6x5:sis"])
    record = main([*argv, "--engines", "llamacpp", "--shapes", "3x8x6:smc", "--merge"])  # keeps hf's run
    assert json.loads(out.read_text()) == json.loads(json.dumps(record))
    md = out.with_suffix(".md").read_text()
    assert md.count("| 3x6x5:sis |") == md.count("| 3x8x6:smc |") == 5  # four pivots and one detail row
    runs = {(r["engine"], r["shape"]): r for r in record["runs"]}
    assert set(runs) == {("hf", "3x6x5:sis"), ("llamacpp", "3x8x6:smc")}
    for (engine, shape), run in runs.items():
        assert run["status"] == "ok", (engine, shape, run["status"])
        p = run["prompt_tokens"]
        if shape.endswith("sis"):  # a SIS particle asks for the prompt + every prefix of its context
            prefixes = {tuple(c[:i]) for c in run["contexts"] for i in range(1, len(c) + 1)}
            assert run["minimum_tokens"] == p + len(prefixes)
            assert run["calls"] == sum(len(c) + 1 for c in run["contexts"])  # the last call drew EOS
        assert run["tokens_computed"] >= run["minimum_tokens"] > p
        mem = run["memory"]
        assert 0 < mem["rss_after_load_bytes"] <= mem["peak_bytes"] and mem["run_peak_bytes"] > 0
        assert run["kv_bytes_per_token"] == 2 * 2 * 1 * 32 * 4  # 2 layers, 1 KV head of 32, float32
    assert bench["long_prompt_report"].headline(record) == []  # no headline shape ran
