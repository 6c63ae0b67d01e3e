"""Cheap hardware probes: no torch, no engine imports.

Like vLLM's platform probes, the answer is computed once and can be inspected
(`genlm doctor`). ``GENLM_DEVICE`` (``cuda``, ``mps``, ``cpu``) overrides it.
"""

from __future__ import annotations

import ctypes.util
import glob
import os
import platform
import shutil
from dataclasses import asdict, dataclass
from functools import lru_cache

__all__ = ["Hardware", "probe", "best_device", "host_memory", "DEVICE_ORDER"]

#: Devices from the most to the least preferred.
DEVICE_ORDER = ("cuda", "mps", "cpu")


@dataclass(frozen=True)
class Hardware:
    cuda: bool
    cuda_devices: int
    cuda_reason: str
    apple_silicon: bool
    system: str
    machine: str
    cpu_count: int
    override: str | None

    @property
    def devices(self) -> list[str]:
        """Devices present, best first."""
        if self.override:
            return [self.override] if self.override == "cpu" else [self.override, "cpu"]
        found = []
        if self.cuda:
            found.append("cuda")
        if self.apple_silicon:
            found.append("mps")
        found.append("cpu")
        return found

    def as_dict(self) -> dict:
        d = asdict(self)
        d["devices"] = self.devices
        return d


def _probe_cuda() -> tuple[bool, int, str]:
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False, 0, "CUDA_VISIBLE_DEVICES hides every GPU"
    nodes = [p for p in glob.glob("/dev/nvidia[0-9]*") if p[len("/dev/nvidia") :].isdigit()]
    lib = ctypes.util.find_library("cuda")
    if nodes and lib:
        return True, len(nodes), f"{len(nodes)} NVIDIA device(s), driver library {lib}"
    if nodes:
        return False, 0, "NVIDIA device nodes found but no libcuda (driver not installed?)"
    if shutil.which("nvidia-smi") and lib:
        return True, 1, "nvidia-smi and libcuda found"
    return False, 0, "no NVIDIA GPU found"


@lru_cache(maxsize=1)
def probe() -> Hardware:
    """Probe the machine once (cached). Never imports torch."""
    system, machine = platform.system(), platform.machine()
    override = os.environ.get("GENLM_DEVICE") or None
    if override is not None and override not in DEVICE_ORDER:
        raise ValueError(f"GENLM_DEVICE={override!r} is not one of {', '.join(DEVICE_ORDER)}")
    cuda, n, reason = _probe_cuda()
    return Hardware(
        cuda=cuda,
        cuda_devices=n,
        cuda_reason=reason,
        apple_silicon=(system == "Darwin" and machine == "arm64"),
        system=system,
        machine=machine,
        cpu_count=os.cpu_count() or 1,
        override=override,
    )


def best_device() -> str:
    return probe().devices[0]


def host_memory() -> int:
    """Bytes of the machine's RAM, or of its cgroup's limit where it has one (a container's
    memory): the CPU's memory every engine sizes its default KV bound against."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            raw = f.read().strip()
        if raw.isdigit():
            total = min(total, int(raw))
    except OSError:
        pass
    return total
