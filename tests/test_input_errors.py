"""Bad input is refused at once with a message that names the problem and the fix:
infinite batcher timeouts, a missing checkpoint file, ``--opt`` without a value, and
``genlm doctor`` asked about a model that is not there."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

import genlm_core
from genlm_core.config import ConfigError
from genlm_core.engine.batching import AutoBatcher
from genlm_core.tools.cli import main


@pytest.mark.parametrize("timeout", [math.inf, math.nan, -1.0])
def test_a_timeout_that_never_elapses_is_refused(timeout: float) -> None:
    """A lone request under 'deadline' waits ``timeout``: inf would wait forever."""
    with pytest.raises(ConfigError, match="timeout"):
        genlm_core.load("mock", batch_policy="deadline", timeout=timeout)
    with pytest.raises(ValueError, match="timeout must be a finite number"):
        AutoBatcher(lambda xs: xs, timeout=timeout, policy="deadline")


def test_a_long_finite_deadline_still_runs_a_lone_request() -> None:
    llm = genlm_core.load("mock", batch_policy="deadline", timeout=0.05)
    row = asyncio.run(asyncio.wait_for(llm.next_token_logprobs([1, 2]), 60))
    assert row.shape == (len(llm.byte_vocab),)
    llm.close()


@pytest.mark.parametrize("backend", ["llamacpp", "hf", "auto"])
def test_a_missing_checkpoint_file_is_called_a_file(backend: str) -> None:
    with pytest.raises(ConfigError) as exc:
        genlm_core.load(backend, model="/nonexistent.gguf")
    msg = str(exc.value)
    assert "model file '/nonexistent.gguf' does not exist" in msg and "folder" not in msg.split("(")[0]


def test_a_missing_folder_is_still_called_a_folder() -> None:
    with pytest.raises(ConfigError, match="model folder '/nonexistent/model' does not exist"):
        genlm_core.load("mock", model="/nonexistent/model")


def test_opt_without_a_value_exits_2_like_every_bad_argument(capsys) -> None:
    assert main(["logprobs", "--backend", "mock", "--opt", "foo", "hi"]) == 2
    err = capsys.readouterr().err
    assert "--opt takes KEY=VALUE, got 'foo'" in err and err.startswith("genlm logprobs: error")


@pytest.mark.parametrize("as_json", [False, True])
def test_doctor_says_the_model_is_missing_and_fails(capsys, as_json: bool) -> None:
    argv = ["doctor", "--model", "/nonexistent"] + (["--json"] if as_json else [])
    assert main(argv) == 2
    out = capsys.readouterr()
    if as_json:
        dt = json.loads(out.out)["dtype_auto"]
        assert dt["dtype"] is None and "does not exist" in dt["error"]
    else:
        assert "'/nonexistent' does not exist" in out.err
        assert "dtype='auto' (every backend): float32" not in out.out


def test_beam_params_eos_given_as_one_string_is_one_token() -> None:
    from genlm_core.bytes import BeamParams

    for eos in ("<|endoftext|>", b"<|endoftext|>", ["<|endoftext|>"], (b"<|endoftext|>",)):
        assert BeamParams(K=5, eos_tokens=eos).eos_tokens == (b"<|endoftext|>",)
