"""The bookkeeping of :class:`~genlm_core.protocols.LoraBackend` engines: which adapters
are loaded under which names, and the checks and messages every such engine shares."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["LoraAdapters"]


class LoraAdapters:
    """Adapter name -> folder, and the active name (``None``: the base model).

    The engine registers each adapter with :meth:`add` before loading it and checks
    names with :meth:`require`, so every engine refuses the same things in the same
    words; it sets :attr:`active` itself once its engine has switched.
    """

    def __init__(self) -> None:
        self.paths: dict[str, str] = {}
        self.active: str | None = None

    def check_new(self, path: Any, name: str) -> str:
        """``path`` as a string, or ``ValueError`` when the folder does not exist or
        ``name`` is loaded already."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a LoRA adapter name must be a non-empty string, got {name!r}")
        folder = os.path.expanduser(os.fspath(path))
        if not os.path.isdir(folder):
            raise ValueError(
                f"LoRA adapter folder {folder!r} not found (give the folder of adapter_config.json)"
            )
        if name in self.paths:
            raise ValueError(
                f"a LoRA adapter named {name!r} is already loaded (from {self.paths[name]}); "
                "load this one under another name"
            )
        return folder

    def add(self, path: str, name: str) -> None:
        self.paths[name] = path

    def require(self, name: str) -> None:
        """``ValueError`` unless adapter ``name`` is loaded."""
        if name not in self.paths:
            loaded = ", ".join(self.paths) or "none"
            raise ValueError(
                f"no LoRA adapter named {name!r} is loaded (loaded: {loaded}); call load_lora first"
            )
