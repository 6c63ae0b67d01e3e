"""Where weights live: llama.cpp's extra CPU buffer types (AMX, REPACK) are kept off
exactly where the build reports AMX, whose matmul segfaults on Q4_1 weights at the first
decode on some Xeons (Sapphire Rapids class). The decision reads llama.cpp's own system
info, so it holds for any llama-cpp-python build, ours or one a user compiled."""

from __future__ import annotations

import json

import llama_cpp
import pytest
import torch
from genlm_llamacpp.cpu_buffers import amx_buffer_in, extra_buffers_choice, use_extra_buffers
from genlm_llamacpp.doctor import buffers_section

import genlm_core

# llama_print_system_info() of llama-cpp-python 0.3.36 built natively on an AMX Xeon
AMX_XEON = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX_VNNI = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
    "AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | AMX_INT8 = 1 | LLAMAFILE = 1 | "
    "OPENMP = 1 | REPACK = 1 |"
)
# the same build on an AMD EPYC (AVX2) and on an AVX-512 machine without AMX
AVX2_EPYC = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |"
AVX512 = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | "
    "AVX512_VNNI = 1 | AVX512_BF16 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |"
)


def test_the_amx_build_keeps_weights_out_of_the_extra_buffers() -> None:
    assert amx_buffer_in(AMX_XEON)
    assert use_extra_buffers(None, AMX_XEON) is False
    for info in (AVX2_EPYC, AVX512, "CPU : AMX_INT8 = 0 | REPACK = 1 |"):
        assert not amx_buffer_in(info) and use_extra_buffers(None, info) is True
    # an explicit choice is the user's (e.g. a llama.cpp build whose AMX path is fixed)
    assert use_extra_buffers(True, AMX_XEON) is True and use_extra_buffers(False, AVX2_EPYC) is False


def test_the_backend_applies_the_decision_for_this_build(tiny_gguf) -> None:
    info = llama_cpp.llama_print_system_info().decode()
    llm = genlm_core.load("llamacpp", model=str(tiny_gguf), n_threads=2)
    try:
        engine = llm.stats()["engine"]
        assert engine["system_info"] == info.strip()
        assert engine["cpu_extra_buffers"] is use_extra_buffers(None, info)
        assert engine["cpu_extra_buffers_reason"] == extra_buffers_choice(None, info)[1]
    finally:
        llm.close()


def test_genlm_doctor_reports_the_decision_for_this_build_and_why(capsys) -> None:
    """`genlm doctor` (through the plugin's genlm_doctor hook, no engine imported in its
    process) says what a model loaded here gets: off with the AMX reason on an AMX build,
    on with its reason elsewhere; the JSON holds the decision and the system info read."""
    from genlm_core.tools.cli import main

    info = llama_cpp.llama_print_system_info().decode().strip()
    use = use_extra_buffers(None, info)
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "llama.cpp CPU buffers (genlm-llamacpp):" in out
    assert f"extra buffer types (AMX, REPACK): {'on' if use else 'off'} by default: " in out
    assert ("reports no AMX_INT8" if use else "reports AMX_INT8 = 1") in out
    assert main(["doctor", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["sections"]["llamacpp"]["data"]
    assert data == {
        "cpu_extra_buffers": use,
        "reason": extra_buffers_choice(None, info)[1],
        "system_info": info,
    }


def test_the_doctor_section_names_each_decision_and_its_reason() -> None:
    off = buffers_section(AMX_XEON)
    assert off["lines"] == [f"extra buffer types (AMX, REPACK): off by default: {off['data']['reason']}"]
    assert "AMX_INT8 = 1" in off["data"]["reason"] and "#20824" in off["data"]["reason"]
    assert "cpu_extra_buffers=True" in off["data"]["reason"]  # how to override it
    on = buffers_section(AVX2_EPYC)
    assert on["lines"][0].startswith("extra buffer types (AMX, REPACK): on by default: ")
    assert on["data"]["cpu_extra_buffers"] is True and "no AMX_INT8" in on["data"]["reason"]
    unknown = buffers_section(None, "llama_cpp did not load (ImportError: nope)")
    assert unknown["data"]["cpu_extra_buffers"] is None and "did not load" in unknown["lines"][0]


@pytest.mark.slow
def test_q4_1_without_extra_buffers_computes_what_the_default_computes(smollm2_gguf) -> None:
    """Q4_1 with weights in plain CPU buffers (what an AMX host gets) gives the rows of the
    default placement bit for bit: x86 has no REPACK kernel for Q4_1, so where the default
    keeps the extra buffers on (every non-AMX host) the same kernels run either way."""
    rows = {}
    for setting in (None, False):
        llm = genlm_core.load(
            "llamacpp", model=str(smollm2_gguf), n_threads=2, cpu_extra_buffers=setting, batch_invariant=True
        )
        try:
            rows[setting] = llm.next_token_logprobs_sync(llm.tokenizer.encode("The capital of France is"))
            if setting is False:
                assert llm.stats()["engine"]["cpu_extra_buffers"] is False
        finally:
            llm.close()
    assert torch.equal(rows[None], rows[False])
