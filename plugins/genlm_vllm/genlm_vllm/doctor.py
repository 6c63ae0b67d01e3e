"""genlm-vllm's section of ``genlm doctor``: the parallel layouts this machine allows
(docs/scale-out.md). Imports nothing heavy (no torch, no vllm)."""

from __future__ import annotations

import importlib.metadata as md
import os
from typing import Any

__all__ = ["RESIDENT_LINE", "SCALE_OUT_ENV", "doctor_section", "scale_out"]

#: the resident path's default and where a running backend says what it did
RESIDENT_LINE = (
    "resident rows: on by default (VLLMConfig.resident; a call extending a live row's context "
    "continues its vLLM session); stats()['engine'] says rows_resumed / rows_restarted / "
    "resident_rows / resident_evicted / resident_expired"
)

#: environment variables that decide how a vLLM engine is laid out over processes/machines
SCALE_OUT_ENV = (
    "VLLM_ENABLE_V1_MULTIPROCESSING",
    "VLLM_CPU_OMP_THREADS_BIND",
    "VLLM_CPU_KVCACHE_SPACE",
    "CUDA_VISIBLE_DEVICES",
    "RAY_ADDRESS",
)


def scale_out(hw: Any) -> dict[str, Any]:
    """The ranks one node can hold, ray's version and the layout's environment variables."""
    try:
        ray = md.version("ray")
    except md.PackageNotFoundError:
        ray = None
    if hw.cuda:
        ranks = hw.cuda_devices
        note = f"tensor_parallel_size * pipeline_parallel_size <= {ranks} GPU(s) on this node"
    else:
        ranks = hw.cpu_count
        note = (
            f"CPU ranks bind their OpenMP threads: set VLLM_CPU_OMP_THREADS_BIND to one core list "
            f"per rank ('|'-separated, e.g. '0|1'), <= {hw.cpu_count} cores in all"
        )
    return {
        "max_ranks_on_this_node": ranks,
        "note": note,
        "ray": ray,
        "env": {k: os.environ[k] for k in SCALE_OUT_ENV if k in os.environ},
    }


def doctor_section(hw: Any) -> dict[str, Any]:
    """The ``genlm_doctor`` hook's answer: title, printed lines, JSON data."""
    so = scale_out(hw)
    lines = [
        f"ranks on this node: up to {so['max_ranks_on_this_node']} ({so['note']})",
        f"ray: {so['ray'] or 'not installed (pip install ray: distributed_executor_backend=ray)'}",
        *(f"{k}={v}" for k, v in so["env"].items()),
        RESIDENT_LINE,
    ]
    return {"title": "Scale-out (vLLM; docs/scale-out.md)", "lines": lines, "data": {"scale_out": so}}
