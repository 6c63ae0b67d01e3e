"""Say so when the real genlm-backend / genlm-bytes is installed next to genlm-compat."""

from __future__ import annotations

import importlib.metadata
import warnings


class CompatShadowWarning(UserWarning):
    """genlm-compat and the distribution it replaces are both installed."""


def warn_if_real(dist: str, module: str) -> None:
    try:
        version = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return
    warnings.warn(
        f"{dist} {version} is installed next to genlm-compat: `{module}` is genlm-compat's alias "
        f"layer over genlm-core, not {dist} (both install the same files; which one you get depends "
        f"on install order). Uninstall one: `pip uninstall {dist}` or `pip uninstall genlm-compat`.",
        CompatShadowWarning,
        stacklevel=3,
    )
