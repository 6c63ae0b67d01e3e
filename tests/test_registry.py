"""Registry, plugin discovery through real entry points, errors, lazy imports, CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import genlm_core
from genlm_core.config import ConfigError
from genlm_core.registry import Registry, UnknownImplementationError

# the example and the broken plugin, installed into a temporary folder (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("installed_fixture_plugins")

ENGINES = ("torch", "transformers", "vllm", "mlx", "mlx_lm")


def run_py(code: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=120
    )


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return run_py(f"import sys; from genlm_core.tools.cli import main; sys.exit(main({list(args)!r}))", **env)


def fresh_registry() -> Registry:
    with pytest.warns(RuntimeWarning, match="broken"):
        reg = Registry()
        reg.discover()
    return reg


def test_list_backends_reports_mock_example_and_broken():
    rows = {r["name"]: r for r in genlm_core.list_backends()}
    assert rows["mock"]["status"] == "available" and rows["mock"]["distribution"] == "genlm-mock"
    assert rows["example-bigram"]["status"] == "available"
    assert rows["example-bigram"]["distribution"] == "genlm-example"
    assert rows["example-bigram"]["version"] == "0.0.1"
    assert rows["broken"]["status"] == "broken"
    assert "genlm_broken_missing_engine" in rows["broken"]["reason"]
    for r in rows.values():
        assert {"name", "kind", "distribution", "version", "devices", "status", "reason"} <= set(r)


def test_core_builtins_registered_through_hooks():
    kinds = {(r["kind"], r["name"]) for r in genlm_core.list_implementations()}
    assert {("cache", "output"), ("cache", "prefix"), ("trie", "numpy"), ("byte_model", "beam")} <= kinds


def test_third_party_plugin_loads_by_name_and_alias():
    llm = genlm_core.load("example-bigram")
    ids = llm.tokenizer.encode("Th")
    lp = llm.next_token_logprobs_sync(ids)
    assert llm.byte_vocab[int(lp.argmax())] == llm.byte_vocab[ord("e")]  # "Th" -> "e" in its text
    llm.close()
    by_alias = genlm_core.load("bigram")  # the plugin wrote an Engine: the core's backend holds it
    assert type(by_alias.engine).__name__ == "BigramEngine" and by_alias.backend_name == "example-bigram"
    by_alias.close()


def test_unknown_name_lists_installed_and_close_matches():
    with pytest.raises(UnknownImplementationError) as e:
        genlm_core.load("mokc")
    msg = str(e.value)
    assert "'mock'" in msg and "Installed:" in msg


def test_missing_first_party_plugin_says_what_to_install():
    r = run_py(
        "import genlm_core\ntry:\n genlm_core.load('hf', model='gpt2')\nexcept Exception as e:\n print(type(e).__name__, e)",
        GENLM_DISABLE_PLUGINS="hf,genlm-hf",
    )
    assert "pip install genlm-hf" in r.stdout, r.stdout + r.stderr


def test_unknown_config_key_names_key_backend_and_accepted_keys():
    with pytest.raises(ConfigError) as e:
        genlm_core.load("mock", batch_sise=3)
    msg = str(e.value)
    assert "'batch_sise'" in msg and "'mock'" in msg and "batch_size" in msg and "Accepted options" in msg
    with pytest.raises(ConfigError, match="batch_size"):
        genlm_core.load("mock", batch_size=0)


def test_config_schema_is_printable():
    r = run_cli("backends", "--schema", "mock")
    schema = json.loads(r.stdout)
    assert "batch_size" in schema["properties"] and schema["additionalProperties"] is False


def test_broken_plugin_does_not_break_the_rest_and_strict_mode_raises():
    reg = fresh_registry()
    assert "mock" in reg.names("backend")
    assert any(b.plugin == "broken" and b.distribution == "genlm-broken" for b in reg.broken)
    r = run_py("import genlm_core; genlm_core.list_backends()", GENLM_STRICT_PLUGINS="1")
    assert r.returncode != 0 and "PluginError" in r.stderr and "genlm-broken 0.0.1" in r.stderr


def test_allow_and_deny_lists():
    code = "import json, genlm_core; print(json.dumps(sorted(r['name'] for r in genlm_core.list_backends())))"
    allowed = json.loads(run_py(code, GENLM_PLUGINS="mock").stdout)
    assert allowed == ["mock"]
    denied = json.loads(run_py(code, GENLM_DISABLE_PLUGINS="broken,genlm-example").stdout)
    assert "broken" not in denied and "example-bigram" not in denied and "mock" in denied


def test_auto_resolution_uses_devices_and_priority():
    code = "import genlm_core; print(genlm_core.explain_auto()['choice'])"
    # with only the example plugin (priority 1 on cpu) and mock (auto=False), auto picks the example
    assert run_py(code, GENLM_PLUGINS="example").stdout.strip() == "example-bigram"
    # a device the example does not support leaves nothing to choose
    r = run_py(
        "import genlm_core\ntry:\n genlm_core.load(model='x')\nexcept Exception as e: print(e)",
        GENLM_PLUGINS="mock",
    )
    assert "No backend can run" in r.stdout


def test_auto_prefers_hf_over_vllm_on_cpu_when_installed():
    names = {r["name"] for r in genlm_core.list_backends() if r["status"] == "available"}
    if not {"hf", "vllm"} <= names:
        pytest.fail("genlm-hf and genlm-vllm must both be installed for this test (CI installs them)")
    assert genlm_core.explain_auto()["choice"] == "hf"
    r = run_py("import genlm_core; print(genlm_core.explain_auto()['choice'])", GENLM_DEVICE="cuda")
    assert r.stdout.strip() == "vllm"


def test_import_and_listing_import_no_engine():
    code = (
        "import sys, json, genlm_core\n"
        "genlm_core.list_backends(); genlm_core.list_implementations()\n"
        "from genlm_core.tools.cli import main\n"
        "import io, contextlib\n"
        "with contextlib.redirect_stdout(io.StringIO()): main(['backends']); main(['backends', '--json']); main(['doctor'])\n"
        f"print(json.dumps([m for m in {ENGINES!r} if m in sys.modules]))"
    )
    r = run_py(code)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == []


def test_cli_backends_json_and_table():
    r = run_cli("backends", "--json")
    rows = {x["name"]: x for x in json.loads(r.stdout)}
    assert rows["mock"]["status"] == "available"
    assert rows["example-bigram"]["status"] == "available"
    assert rows["broken"]["status"] == "broken"
    t = run_cli("backends")
    assert "mock" in t.stdout and "broken" in t.stdout


def test_cli_doctor_and_one_line_errors():
    r = run_cli("doctor", "--json")
    info = json.loads(r.stdout)
    assert info["hardware"]["devices"][-1] == "cpu"
    # the parallel layout this machine allows: one rank per GPU, or per CPU core (genlm-vllm's
    # own section, through the genlm_doctor hook)
    so = info["sections"]["vllm"]["data"]["scale_out"]
    hw = info["hardware"]
    assert so["max_ranks_on_this_node"] == (hw["cuda_devices"] if hw["cuda"] else hw["cpu_count"])
    text = run_cli("doctor").stdout
    assert "Scale-out" in text and f"up to {so['max_ranks_on_this_node']}" in text
    bad = run_cli("logprobs", "--backend", "nonesuch", "--model", "/nowhere", "hi")
    assert bad.returncode == 2
    lines = [ln for ln in bad.stderr.splitlines() if ln.startswith("genlm")]
    assert len(lines) == 1 and "Unknown backend 'nonesuch'" in lines[0]


def test_doctor_says_why_auto_picks_what_it_picks():
    """`genlm doctor` prints every candidate with its priority on the chosen device (a
    skipped one with its reason) and the first-party order's reason; the order printed is
    the registry's own (oracle: explain_auto's list)."""
    from genlm_core.api import explain_auto
    from genlm_core.tools.doctor import AUTO_WHY, auto_reasons

    auto = explain_auto()
    lines = auto_reasons(auto)
    here = [c for c in auto["considered"] if c["status"] == "available" and c["device"] == auto["device"]]
    ranked = [c["name"] for c in sorted(here, key=lambda c: (-c["priority"], c["name"]))]
    assert lines[0].startswith(f"candidates (priority on {auto['device']}): ")
    shown = [part.split(" ")[0] for part in lines[0].split(": ", 1)[1].split(", ")]
    assert [n for n in shown if n in ranked] == ranked and ranked[0] == auto["choice"]
    assert lines[1] == f"why: {AUTO_WHY[auto['device']]}"
    skipped = auto_reasons(
        {
            "device": "cpu",
            "considered": [{"name": "x", "status": "skipped", "device": None, "reason": "reads gguf"}],
        }
    )
    assert skipped[0] == "candidates (priority on cpu): x (reads gguf)"
    assert "why: " in run_cli("doctor").stdout


def test_doctor_lists_the_engines_the_installed_backends_declare():
    """The core names no engine: `genlm doctor` lists the modules the registered backends
    require (each with the version of the distribution that installed it), so a
    third-party engine shows up and an uninstalled one reads None."""
    import importlib.metadata as md
    import importlib.util

    from genlm_core.registry import get_registry

    declared = {m for reg in get_registry().all("backend") for m in reg.requires} - {"numpy"}
    engines = json.loads(run_cli("doctor", "--json").stdout)["engines"]
    assert set(engines) == declared
    providers = md.packages_distributions()
    for mod, version in engines.items():
        if importlib.util.find_spec(mod) is None:
            assert version is None
        else:  # the independent reading: the metadata of the distribution providing it
            assert version == md.version(providers[mod][0]), mod


def test_cli_sample_and_bytes_on_the_mock():
    r = run_cli("sample", "Montreal is", "--backend", "mock", "--particles", "4", "--max-tokens", "3")
    assert r.returncode == 0, r.stderr
    probs = [
        float(ln.split()[0])
        for ln in r.stdout.splitlines()
        if ln.startswith("   0.") or ln.startswith("   1.")
    ]
    assert len(probs) == 4 and abs(sum(probs) - 1) < 2e-3  # normalised over the particles
    assert "next-token calls batched into" in r.stdout
    b = run_cli("bytes", "ab", "--backend", "mock", "--beam", "2", "--n-bytes", "6")
    assert b.returncode == 0, b.stderr
    line = b.stdout.splitlines()[1].strip()
    assert line.startswith("'ab") or line.startswith('"ab')  # the continuation starts with the prompt


def test_cli_demo_takes_the_model_options():
    r = run_cli(
        "demo", "--backend", "mock", "--particles", "3", "--max-tokens", "2", "--n-bytes", "4",
        "--opt", "batch_size=2",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "options {'batch_size': 2}" in r.stdout
    passes = r.stdout.split("next-token calls batched into ")[1].split()[0]
    calls = int(r.stdout.split(" next-token calls batched")[0].split()[-1])
    assert int(passes) >= calls / 2  # no forward pass held more than batch_size=2 contexts
    bad = run_cli("demo", "--backend", "mock", "--opt", "batch_size")
    assert bad.returncode != 0 and "--opt takes KEY=VALUE" in bad.stderr


def test_doctor_sections_come_from_each_plugins_hook():
    """`genlm doctor` prints what each plugin's genlm_doctor hook returns; a hook that
    fails gets a line saying so and hides no other plugin's section."""
    import types

    from genlm_core import hookimpl
    from genlm_core.registry import Registry, hardware

    good = types.ModuleType("good_doctor")
    good.genlm_doctor = hookimpl(lambda hardware: {"title": "Good", "lines": [f"{hardware.cpu_count} CPUs"]})
    bad = types.ModuleType("bad_doctor")

    def fails(hardware):
        raise RuntimeError("no luck")

    bad.genlm_doctor = hookimpl(fails)
    reg = Registry()
    reg._add_plugin(good, "good", "good-dist", "1")
    reg._add_plugin(bad, "bad", "bad-dist", "1")
    hw = hardware.probe()
    sections = reg.doctor_sections(hw)
    assert sections["good"] == {"title": "Good", "lines": [f"{hw.cpu_count} CPUs"], "data": {}}
    assert sections["bad"]["lines"] == ["genlm_doctor failed: no luck"]
