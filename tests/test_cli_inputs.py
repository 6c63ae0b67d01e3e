"""What a user sees for bad input and long work :
model folders checked before any engine loads, config errors that name the option, the
value and the accepted range, CLI numbers checked at parse time, ``pathlib.Path``
models, progress bars and engine notes on stderr."""

from __future__ import annotations

import json
import logging
import os
import pathlib
import subprocess
import sys

import annotated_types
import pytest

import genlm_core
from genlm_core.config import BackendConfig, ConfigError, GenlmConfig
from genlm_core.engine.progress import summarise_repeats
from genlm_core.model_files import check_model_folder, looks_like_path
from genlm_core.tools.cli import main

ENGINES = ("torch", "transformers", "vllm", "mlx", "mlx_lm")
BACKENDS = ("hf", "vllm", "mlx", "mock", "auto")


def tiny_gpt2() -> pathlib.Path:
    import model_paths

    return model_paths.tiny_gpt2()


# ---------------------------------------------------------------------- model folders
def test_missing_or_empty_model_folder_same_message_on_every_backend_before_any_engine(tmp_path):
    """Every backend (and "auto") says the same thing about a bad folder, before it
    imports an engine: checked in a fresh process, where no engine is loaded yet."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "no-tokenizer").mkdir()
    (tmp_path / "no-tokenizer" / "config.json").write_text("{}")
    code = f"""
import json, pathlib, sys
import genlm_core
out = {{}}
for name in {BACKENDS!r}:
    for case, model in [("missing", "{tmp_path}/nope"), ("path", pathlib.Path("{tmp_path}/nope")),
                        ("empty", "{tmp_path}/empty"), ("config only", "{tmp_path}/no-tokenizer")]:
        try:
            genlm_core.load(name, model=model)
            out.setdefault(case, {{}})[name] = "loaded"
        except genlm_core.ConfigError as exc:
            out.setdefault(case, {{}})[name] = str(exc)
print(json.dumps({{"messages": out, "engines": [m for m in {ENGINES!r} if m in sys.modules]}}))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["engines"] == []  # the check ran before any engine import
    msgs = got["messages"]
    for case, expected in [
        ("missing", f"model folder '{tmp_path}/nope' does not exist"),
        ("path", f"model folder '{tmp_path}/nope' does not exist"),
        ("empty", f"model folder '{tmp_path}/empty' lacks config.json and tokenizer files"),
        ("config only", f"model folder '{tmp_path}/no-tokenizer' lacks tokenizer files"),
    ]:
        hf_vllm_mlx_auto = {msgs[case][n] for n in BACKENDS if n != "mock"}
        assert len(hf_vllm_mlx_auto) == 1, msgs[case]  # one message, whichever backend
        assert next(iter(hf_vllm_mlx_auto)).startswith(expected), msgs[case]
    # the mock backend only takes a tokenizer from a folder: it needs no config.json
    assert msgs["empty"]["mock"].startswith(f"model folder '{tmp_path}/empty' lacks tokenizer files")
    assert msgs["config only"]["mock"].startswith(f"model folder '{tmp_path}/no-tokenizer' lacks tokenizer")
    assert "it is empty" in msgs["empty"]["hf"] and "it holds config.json" in msgs["config only"]["hf"]


def test_folder_holding_the_model_one_level_down_is_pointed_at(tmp_path):
    inner = tmp_path / "checkpoint"
    inner.mkdir()
    (inner / "config.json").write_text("{}")
    with pytest.raises(ConfigError, match=f"did you mean '{inner}'"):
        check_model_folder(str(tmp_path))


def test_hub_ids_stay_hub_ids(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing named like a hub id exists here
    for hub_id in ("gpt2", "org/name", "HuggingFaceTB/SmolLM2-135M"):
        assert not looks_like_path(hub_id)
        BackendConfig(model=hub_id).check_model()  # passes: the engine resolves it on the hub
    for path in ("/abs/x", "./x", "../x", "~/x", "a/b/c", pathlib.Path("gpt2")):
        assert looks_like_path(path)
    (tmp_path / "org" / "name").mkdir(parents=True)  # an existing folder is local, as for transformers
    assert looks_like_path("org/name")
    with pytest.raises(ConfigError, match="lacks config.json"):
        BackendConfig(model="org/name").check_model()


def test_cli_missing_model_folder_is_one_clear_line(capsys):
    assert main(["logprobs", "--backend", "hf", "--model", "/nonexistent/model", "hi"]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("genlm logprobs: error")]
    assert len(lines) == 1 and "model folder '/nonexistent/model' does not exist" in lines[0]
    assert "Repo id" not in err


# ---------------------------------------------------------------------- config errors
def _configs() -> list[type[GenlmConfig]]:
    from genlm_core.bytes import BeamParams
    from genlm_core.engine.caches import OutputCacheConfig

    classes: list[type[GenlmConfig]] = [BeamParams, OutputCacheConfig, BackendConfig]
    for reg in genlm_core.get_registry().all("backend"):
        cls = reg.load_config_class()
        if cls is not None and cls not in classes:
            classes.append(cls)
    return classes


def _bounded_fields() -> list[tuple[type[GenlmConfig], str, object, str]]:
    """Every bounded numeric option of every config, a value just outside its bound and
    the bound as the message must state it (``>= 1``)."""
    cases = []
    ops = [
        (annotated_types.Ge, "ge", ">=", -1),
        (annotated_types.Gt, "gt", ">", 0),
        (annotated_types.Le, "le", "<=", +1),
        (annotated_types.Lt, "lt", "<", 0),
    ]
    for cls in _configs():
        for name, info in cls.model_fields.items():
            for m in info.metadata:
                for kind, attr, op, step in ops:
                    if isinstance(m, kind):
                        bound = getattr(m, attr)
                        cases.append((cls, name, bound + step, f"{op} {bound}"))
    return cases


@pytest.mark.parametrize(("cls", "field", "bad", "bound"), _bounded_fields())
def test_every_bounded_option_names_itself_the_value_and_the_range(cls, field, bad, bound):
    for make in (lambda: cls(**{field: bad}), lambda: cls.build(**{field: bad})):
        with pytest.raises(ConfigError) as exc:
            make()
        msg = str(exc.value)
        assert f"{field}={bad!r}" in msg and bound in msg, msg
        assert "validation error" not in msg and "errors.pydantic.dev" not in msg, msg
    ok = cls()
    with pytest.raises(ConfigError, match=f"{field}={bad!r}"):
        setattr(ok, field, bad)  # assignment is validated too


def test_beam_params_and_choices_and_types():
    from genlm_core.bytes import BeamParams

    with pytest.raises(ConfigError) as exc:
        BeamParams(K=0)
    assert str(exc.value) == (
        "Invalid option for 'beam': K=0: Input should be greater than or equal to 1 "
        "(accepted: an integer >= 1, or None)"
    )
    assert isinstance(exc.value, ValueError)
    with pytest.raises(ConfigError, match=r"K='x'.*accepted: an integer >= 1, or None"):
        BeamParams(K="x")
    with pytest.raises(ConfigError, match=r"eos_byte_strings=5: expected byte strings"):
        BeamParams(eos_byte_strings=5)  # was a TypeError from inside the validator
    with pytest.raises(ConfigError, match=r"Unknown option 'Kk' \(did you mean 'K'\?\)"):
        BeamParams(Kk=3)
    with pytest.raises(ConfigError, match=r"K=0"):
        BeamParams.model_validate({"K": 0})
    hf = genlm_core.resolve("hf").load_config_class()
    with pytest.raises(ConfigError, match=r"dtype='int4'.*accepted: one of 'auto', 'float32'"):
        hf.build("hf", dtype="int4")  # ('f32', 'bf16', torch dtypes are spellings it accepts)
    with pytest.raises(ConfigError, match=r"device_map=3 \(accepted: a string, or a mapping, or None\)"):
        hf.build("hf", device_map=3)


def test_cli_bad_option_value_is_one_line_naming_it(capsys):
    assert main(["sample", "--backend", "mock", "--opt", "cache_bytes=-1", "hi"]) == 2
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if ln.startswith("genlm sample: error"))
    assert "cache_bytes=-1" in line and ">= 0" in line and "validation error" not in err


# ---------------------------------------------------------------------- CLI numbers
@pytest.mark.parametrize(
    ("argv", "option", "shown"),
    [
        (["logprobs", "--top-k", "0", "hi"], "--top-k", "0"),
        (["logprobs", "--top-k", "-1", "hi"], "--top-k", "-1"),
        (["logprobs", "--top-k", "ten", "hi"], "--top-k", "'ten'"),
        (["sample", "--particles", "0", "hi"], "--particles", "0"),
        (["sample", "--max-tokens", "-1", "hi"], "--max-tokens", "-1"),
        (["sample", "--seed", "-1", "hi"], "--seed", "-1"),
        (["bytes", "--beam", "0", "hi"], "--beam", "0"),
        (["bytes", "--n-bytes", "0", "hi"], "--n-bytes", "0"),
        (["demo", "--particles", "0"], "--particles", "0"),
        (["demo", "--max-tokens", "0"], "--max-tokens", "0"),
        (["demo", "--n-bytes", "-2"], "--n-bytes", "-2"),
    ],
)
def test_cli_numbers_are_checked_when_parsed(argv, option, shown, capsys):
    with pytest.raises(SystemExit) as exc:
        main([argv[0], "--backend", "mock", *argv[1:]])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: expected an integer " in err and f"got {shown}" in err, err
    assert "loading" not in err  # rejected before any model was loaded


def test_cli_top_k_above_the_vocabulary_shows_all_with_a_note(capsys):
    model = str(tiny_gpt2())
    assert main(["logprobs", "--backend", "mock", "--model", model, "--top-k", "100000", "--json", "hi"]) == 0
    out, err = capsys.readouterr()
    llm = genlm_core.load("mock", model=model)
    vocab, ids = llm.vocab_size, llm.tokenizer.encode("hi", add_special_tokens=False)
    expected = llm.next_token_logprobs_sync(ids).argsort(descending=True, stable=True).tolist()
    llm.close()
    rows = json.loads(out)
    assert len(rows) == vocab and sorted(r["id"] for r in rows) == list(range(vocab))
    assert [r["id"] for r in rows][:5] == expected[:5]  # best first, as argsort says
    assert f"--top-k 100000 is more than the vocabulary's {vocab} tokens" in err


# ---------------------------------------------------------------------- Path models
def test_path_models_are_accepted_everywhere(tmp_path, monkeypatch):
    model = tiny_gpt2()
    by_path = genlm_core.load("hf", model=model)
    by_str = genlm_core.load("hf", model=str(model))
    try:
        ids = by_str.tokenizer.encode("Hello world", add_special_tokens=False)
        assert by_path.config.model == str(model)
        assert (by_path.next_token_logprobs_sync(ids) == by_str.next_token_logprobs_sync(ids)).all()
    finally:
        by_path.close()
        by_str.close()
    monkeypatch.chdir(tmp_path)
    # a relative Path is a local folder, held as its absolute path
    assert BackendConfig(model=pathlib.Path("m")).model == os.path.join(str(tmp_path), "m")
    assert BackendConfig(model="~/m").model == os.path.expanduser("~/m")
    vllm_cfg = genlm_core.resolve("vllm").load_config_class()
    assert vllm_cfg(tokenizer=pathlib.Path("tok")).tokenizer == os.path.join(str(tmp_path), "tok")


# ---------------------------------------------------------------------- long work
def test_byte_cli_and_demo_show_progress_on_stderr(capsys):
    assert (
        main(["bytes", "ab", "--backend", "mock", "--beam", "2", "--n-bytes", "5", "--bits-per-byte", "cd"])
        == 0
    )
    out, err = capsys.readouterr()
    assert "Byte-level greedy continuation" in out
    for bar in ("reading bytes", "generating bytes", "scoring bytes"):
        assert bar in err and bar not in out, err
    args = ["demo", "--backend", "mock", "--particles", "2", "--max-tokens", "2", "--n-bytes", "3"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "SIS steps" in err and "generating bytes" in err and "Bits per byte" in out


def test_repeated_engine_log_lines_are_summarised_once(caplog):
    engine = logging.getLogger("fake_engine")
    child = logging.getLogger("fake_engine.loader")
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Keep()
    engine.addHandler(handler)
    engine.propagate = False
    try:
        with caplog.at_level(logging.INFO, logger="genlm"), summarise_repeats("fake_engine", keep=2):
            for i in range(50):
                if i == 20:  # the engine replaces its handler mid-start, as vLLM's dictConfig does
                    engine.removeHandler(handler)
                    handler = Keep()
                    engine.addHandler(handler)
                child.warning("cast weight %d from float32 to bfloat16", i)  # one call site
            engine.warning("a different warning")
            engine.error("errors always pass")
            engine.error("errors always pass")
            engine.error("errors always pass")
        child.warning("after the block: not filtered")
    finally:
        engine.removeHandler(handler)
        engine.propagate = True
    assert seen == [
        "cast weight 0 from float32 to bfloat16",
        "cast weight 1 from float32 to bfloat16",
        "a different warning",
        *["errors always pass"] * 3,
        "after the block: not filtered",
    ]
    notes = [r for r in caplog.records if r.name == "genlm"]
    assert [r.getMessage() for r in notes] == [
        "fake_engine: 48 more similar warnings suppressed, like: cast weight 2 from float32 to bfloat16"
    ]
    assert notes[0].levelno == logging.WARNING  # summarised warnings stay visible without logging set up


def test_vllm_start_says_what_it_does_and_how_to_start_faster_on_cpu(caplog):
    pytest.importorskip("torch")
    from genlm_vllm.launch import announce_start

    with caplog.at_level(logging.INFO, logger="genlm"):
        announce_start({}, "cpu")
    texts = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "genlm"]
    assert texts[0][1].startswith("vllm: starting the engine on cpu (reading the weights, compiling")
    assert texts[1][0] == logging.WARNING and "--opt enforce_eager=true" in texts[1][1]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="genlm"):
        announce_start({"enforce_eager": True}, "cpu")
        announce_start({}, "cuda")  # no CPU advice on a GPU
    texts = [r.getMessage() for r in caplog.records if r.name == "genlm"]
    assert len(texts) == 2 and all("compile" not in t or "torch.compile" in t for t in texts)
    assert "compiling" not in texts[0] and not any("enforce_eager=True" in t for t in texts)


def test_cli_serve_limits_that_cannot_hold_say_what_to_change(capsys):
    """A limit that contradicts another (no body of the largest size fits in the bytes read
    at once) is the validator's own sentence on one line, not pydantic's summary."""
    assert main(["serve", "mock", "--max-open-body-bytes", "20000"]) == 2
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if ln.startswith("genlm serve: error"))
    assert "max_open_body_bytes (20000) is below max_body_bytes" in line, err
    assert "raise --max-open-body-bytes or lower --max-body-bytes" in line, err
    assert "validation error" not in err
