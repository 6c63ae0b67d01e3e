"""genlm-compat against the public names of genlm-backend 0.3.1 / genlm-bytes 0.2.0
(``reference_names.json``, recorded from the releases by ``record_reference_names.py``):
every module imports, every name is there, and each either is a genlm-core /
genlm-compat object or raises on use naming the genlm-core equivalent."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

REFERENCE = json.loads((Path(__file__).parent / "reference_names.json").read_text())
NAMES = [(mod, name) for mod, names in REFERENCE["modules"].items() for name in names]
PACKAGE = Path(importlib.import_module("genlm.backend").__file__).parents[1]  # the installed genlm/ portion


def test_reference_is_the_releases() -> None:
    assert REFERENCE["versions"] == {"genlm-backend": "0.3.1", "genlm-bytes": "0.2.0"}
    assert len(NAMES) > 90  # the walk found the submodules, not just the top-level names


@pytest.mark.parametrize(("module", "name"), NAMES, ids=[f"{m}.{n}" for m, n in NAMES])
def test_name_imports_and_maps_or_fails_on_use(module: str, name: str) -> None:
    from genlm.backend._surface import Unported

    obj = getattr(importlib.import_module(module), name)
    if isinstance(obj, Unported):
        # no counterpart: the genlm-core equivalent; an engine whose plugin is not
        # installed (AsyncVirtualLM without genlm-vllm): the extra that brings it
        said = r"use (genlm_core|genlm_hf|genlm\.|numpy)|pip install \"genlm-compat\[(vllm|mlx)\]\""
        with pytest.raises((NotImplementedError, ImportError), match=said):
            obj()
        with pytest.raises(
            (NotImplementedError, ImportError), match=rf"\.{name} (\(genlm-backend|needs genlm-)"
        ):
            obj.from_name  # noqa: B018
    else:
        origin = getattr(obj, "__module__", "") or ""
        assert origin.startswith(("genlm_core", "genlm.", "genlm_hf", "genlm_mock", "builtins")), (
            obj,
            origin,
        )


def test_importing_every_module_starts_no_engine() -> None:
    """Importing the whole surface imports neither vLLM nor MLX (engines load on use)."""
    code = (
        "import importlib, json, sys\n"
        f"for m in {sorted(REFERENCE['modules'])!r}: importlib.import_module(m)\n"
        "print(json.dumps(sorted(m for m in ('vllm', 'mlx', 'genlm_vllm', 'genlm_mlx') if m in sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=600
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_sgl_placeholder_and_loader() -> None:
    import genlm.backend.llm as llm
    from genlm.backend.llm.sgl import AsyncSGLTransformer

    assert AsyncSGLTransformer is llm.AsyncSGLTransformer
    with pytest.raises(ImportError, match=r"genlm_core.load\('vllm'"):
        AsyncSGLTransformer.from_name("any")
    with pytest.raises(ImportError, match="no SGLang backend"):
        llm.load_model_by_name("any", backend="sgl")


def _code_lines(path: Path) -> int:
    """Lines holding code: not blank, not comments, not docstrings."""
    source = path.read_text()
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                docstrings.update(range(body[0].lineno, body[0].end_lineno + 1))
    return sum(
        1
        for i, line in enumerate(source.splitlines(), 1)
        if line.strip() and not line.strip().startswith("#") and i not in docstrings
    )


def test_compat_stays_a_thin_skin() -> None:
    """genlm-compat maps genlm-backend's signatures, node numbers, result types and error
    classes onto genlm-core, and carries genlm-bytes' small helpers (``Chart``,
    ``LazyByteProbs``); the mechanisms (batching, caches, tries, the beam) stay
    genlm-core's. The budget catches a second implementation creeping in (1,245 lines,
    then 1,255 with ``cache_opts`` mapped onto ``cache_to_cpu``: a signature's mapping; the
    device a host-memory cache hands rows back on went into genlm-core's cache; 1,272 with
    genlm-bytes' ``greedy(context, steps)`` and ``sample(context, steps, draw)``; 1,280
    with ``StatefulTokenizedLM``'s ``n_calls`` and the tries' ``start()``: signatures; 1,340
    with genlm-backend's abstract ``AsyncLM`` to subclass, its draws genlm-core's; 1,326 with
    ``sample``'s ``draw`` handed to genlm-core's beam instead of a loop of its own)."""
    total = sum(_code_lines(p) for p in PACKAGE.rglob("*.py") if "backend" in p.parts or "bytes" in p.parts)
    assert total < 1330, f"genlm-compat has {total} lines of code"


#: public names genlm-compat lists beyond the reference module's dir(), and why
DIR_ADDITIONS: dict[str, set[str]] = {
    # genlm-backend defines them in genlm.backend.llm; genlm-compat's __all__ has long
    # offered them at the top too, and the engines' classes beside AsyncVirtualLM
    "genlm.backend": {"AsyncLM", "AsyncMlxLM", "MockAsyncLM", "errors"},
    # a model served by `genlm serve` (genlm-remote): no reference counterpart
    "genlm.backend.llm": {"AsyncRemoteLM", "calls", "futures"},  # two submodules of ours
    # genlm-bytes keeps them in genlm.bytes.byte_lm; genlm-compat's __all__ offers them
    "genlm.bytes": {"EOS", "EOT", "TrieMode"},
    # the reference trie's node numbering, a submodule of genlm-compat's own
    "genlm.backend.trie": {"numbering"},
}


@pytest.mark.parametrize("module", sorted(REFERENCE["dirs"]))
def test_dir_lists_the_api_only(module: str) -> None:
    """``dir()`` of each module lists the reference's API and no helper of ours: no
    ``Any``, ``annotations``, ``warnings`` or ``warn_if_real`` beside the API (names
    genlm-compat adds on purpose are listed in :data:`DIR_ADDITIONS` with why)."""
    ours = {n for n in dir(importlib.import_module(module)) if not n.startswith("_")}
    reference = set(REFERENCE["dirs"][module])
    missing = set(REFERENCE["modules"][module]) - ours
    assert not missing, f"{module}: dir() lacks the reference's {sorted(missing)}"
    extra = ours - reference - DIR_ADDITIONS.get(module, set())
    assert not extra, f"{module}: dir() lists {sorted(extra)}, which the reference's does not"


#: reference methods whose calls genlm-compat does not take, each a difference
#: docs/migration.md names (in "What differs": the word in backquotes)
CALLS_DIFFER = {
    # genlm-backend's batching internals (genlm-hf forms its own batches)
    "AsyncTransformer.add_query": "add_query",
    "AsyncTransformer.batch_evaluate_queries": "batch_evaluate_queries",
    # genlm-core's beam candidate, built by the beam; the reference's abstract LM base
    "LazyTrieState.*": "LazyTrieState",
    "StatefulByteLM.*": "StatefulByteLM",
}
SIGNATURES = sorted(REFERENCE["signatures"].items())


def _calls_not_taken(reference: str, obj: object) -> list[str]:
    """How a call the reference's parameters (``reference``, as the recorder writes them)
    take would fail on ``obj``: a positional argument bound to another parameter or to
    none, a keyword it lacks, a parameter it requires and the reference does not."""
    import inspect

    ours = list(inspect.signature(obj).parameters.values())
    names = {p.name for p in ours}
    var_pos = any(p.kind is p.VAR_POSITIONAL for p in ours)
    var_kw = any(p.kind is p.VAR_KEYWORD for p in ours)
    positional = [p.name for p in ours if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    problems, required, k = [], set(), 0
    for token in reference.split():
        name = token.lstrip("*~").rstrip("/=")
        if token.startswith("*"):
            if token.startswith("**"):
                required.add("**")
            else:
                required.add("*")
            continue
        if not token.endswith("="):
            required.add(name)
        if not token.startswith("~"):  # positional: the same place binds the same name
            if k < len(positional):
                if positional[k] != name and not token.endswith("/"):
                    problems.append(f"argument {k} is {positional[k]!r} here, {name!r} there")
            elif not var_pos:
                problems.append(f"no positional argument {k} ({name!r})")
            k += 1
        if not token.endswith("/") and name not in names and not var_kw:
            problems.append(f"no keyword {name!r}")
    if not {"*", "**"} <= required:  # a wrapper's (*args, **kwargs) says nothing of what it needs
        for p in ours:
            if (
                p.default is p.empty
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                and p.name not in required
            ):
                problems.append(f"{p.name!r} is required here, not there")
    return problems


@pytest.mark.parametrize(("where", "reference"), SIGNATURES, ids=[w for w, _ in SIGNATURES])
def test_methods_take_the_references_calls(where: str, reference: str) -> None:
    """Every public function and method of the reference takes here the calls it takes
    there: the same positional order, the same keywords, nothing more required (genlm-bytes'
    ``greedy(context, steps=...)`` raised ``TypeError`` before this test). Names with no
    counterpart raise on use (the test above); :data:`CALLS_DIFFER` lists the rest."""
    import fnmatch

    from genlm.backend._surface import Unported

    module, path = where.split(":")
    if any(fnmatch.fnmatchcase(path, pattern) for pattern in CALLS_DIFFER):
        return
    head, *rest = path.split(".")
    obj = getattr(importlib.import_module(module), head)
    if isinstance(obj, Unported):
        return
    for part in rest:
        assert hasattr(obj, part), f"{where}: genlm-compat's {head} has no {part!r}"
        obj = getattr(obj, part)
    problems = _calls_not_taken(reference, obj)
    assert not problems, f"{where}{reference.split()}: " + "; ".join(problems)


def test_calls_that_differ_are_documented() -> None:
    here = Path(__file__).with_name("migration.md")  # scripts/test_artifacts.py copies it here
    doc = here if here.exists() else Path(__file__).resolve().parents[3] / "docs" / "migration.md"
    differs = doc.read_text().split("## Names")[0]  # "What differs" and its intended differences
    for pattern, word in CALLS_DIFFER.items():
        assert f"`{word}" in differs or f".{word}`" in differs, (
            f"{pattern}: docs/migration.md does not name {word}"
        )
