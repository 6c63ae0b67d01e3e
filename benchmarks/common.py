"""Shared helpers for the benchmarks: machine description, JSON + Markdown output."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: where every benchmark writes its JSON + Markdown: ``$GENLM_BENCH_OUT`` when set (the GPU
#: check, scripts/gpu_check.py, runs the benchmarks into a folder of its own), else benchmarks/out
OUT_DIR = Path(os.environ.get("GENLM_BENCH_OUT") or Path(__file__).resolve().parent / "out")


def load_options(text: str) -> dict[str, Any]:
    """``--options``: a JSON object of extra ``load()`` options (an argparse ``type``)."""
    import argparse

    try:
        value = json.loads(text) if text else {}
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(
            f"not JSON ({e}): pass an object, e.g. '{{\"cache_size\": 0}}'"
        ) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object of load() options")
    return value


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.machine()}",
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        info["load_avg_1m"] = os.getloadavg()[0]
    except OSError:
        pass
    return info


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_info(device: str = "cpu", dtype: str | None = None, model: str | None = None) -> dict[str, Any]:
    """What a benchmark's figures ran on, named: ``device`` ("cpu", "cuda", "cuda:1", ...)
    with its name (the GPU's ``torch.cuda.get_device_name``, its memory and the CUDA
    version; the CPU's model), the dtype and the model folder's name. Imports torch."""
    import torch

    info: dict[str, Any] = {"device": device, "dtype": dtype, "torch": torch.__version__}
    if model is not None:
        info["model"] = Path(str(model)).name
    if torch.device(device).type == "cuda":
        index = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(index)
        info.update(
            device_name=torch.cuda.get_device_name(index),
            gpu_memory_gb=round(props.total_memory / 2**30, 1),
            capability=f"{props.major}.{props.minor}",
            cuda=torch.version.cuda,
        )
    else:
        info["device_name"] = cpu_model() if torch.device(device).type == "cpu" else device
    return info


def device_line(info: dict[str, Any]) -> str:
    """One Markdown line naming the device, dtype and model of :func:`device_info`."""
    parts = [f"Device: {info.get('device_name')} (`{info.get('device')}`)"]
    if info.get("dtype"):
        parts.append(f"dtype {info['dtype']}")
    if info.get("model"):
        parts.append(f"model {info['model']}")
    if info.get("cuda"):
        parts.append(f"CUDA {info['cuda']}")
    return ", ".join(parts) + f", torch {info.get('torch')}"


def median_time(fn: Callable[[], Any], repeat: int = 20, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def markdown_table(rows: list[dict[str, Any]], cols: list[str] | None = None) -> str:
    if not rows:
        return "(no rows)"
    cols = cols or list(rows[0])

    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return str(v)

    out = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for r in rows:
        out.append("| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |")
    return "\n".join(out)


def write_results(
    name: str,
    rows: list[dict[str, Any]],
    extra: dict[str, Any] | None = None,
    cols: list[str] | None = None,
    device: dict[str, Any] | None = None,
    title: str | None = None,
) -> Path:
    """``OUT_DIR/name.json`` (the machine, ``device`` - :func:`device_info` - the rows and
    ``extra``) and ``name.md`` (the heading ``title``, default ``name``, the device's line,
    then the rows' table)."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"{name}.json"
    payload = {"benchmark": name, "machine": machine(), **({"device": device} if device else {})}
    payload["rows"] = rows
    payload.update(extra or {})  # (bench_burst's extra carries its rows whole: they win)
    path.write_text(json.dumps(payload, indent=2))
    table = markdown_table(rows, cols)
    head = f"{device_line(device)}\n\n" if device else ""
    title = title or name
    (OUT_DIR / f"{name}.md").write_text(f"## {title}\n\n{head}{table}\n")
    print(f"\n## {title}\n\n{head}{table}\n\n(JSON: {path})")
    return path


def ensure_venv(venv: Path, torch_pin: str, pins: list[str], check: str) -> Path:
    """A venv at ``venv`` holding ``pins`` (CPU ``torch_pin`` installed first and kept),
    created unless ``python -c check`` already succeeds there. Returns its python."""
    py = venv / "bin" / "python"
    probe = [str(py), "-c", check]
    if py.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return py
    print(f"[bench] creating {venv} ({', '.join(pins)})", flush=True)
    subprocess.run(["python3.11", "-m", "venv", str(venv)], check=True)
    pip = [str(py), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, torch_pin], check=True)  # the CPU wheel, before anything pulls CUDA
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(torch_pin + "\n")  # keep that torch: no CUDA build sneaks in
    subprocess.run([*pip, "-c", f.name, *pins], check=True)
    subprocess.run(probe, check=True)
    return py
