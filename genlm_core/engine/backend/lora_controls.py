"""LoRA adapters (capability ``"lora"``): the backend keeps the names and the active one,
holds the engine lock and drops the caches a switch makes stale. A part of
:class:`~genlm_core.engine.backend.BaseLogprobBackend` (its ``lora_controls``).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from genlm_core.engine.backend.cache_controls import CacheControls
    from genlm_core.engine.contract import Engine
    from genlm_core.engine.lora import LoraAdapters

__all__ = ["LoraControls"]


class LoraControls:
    """``load_lora``, ``set_lora``, ``clear_lora`` and what is loaded.

    Args:
        engine: loads and switches the adapters (capability ``"lora"``).
        engine_lock: held by every load and switch.
        adapters: the adapters loaded, by name, and the active one.
        cache_controls: drops what a switch makes stale.
        name: the backend's name, for messages.
    """

    def __init__(
        self,
        engine: Engine,
        engine_lock: threading.RLock,
        adapters: LoraAdapters,
        cache_controls: CacheControls,
        name: str,
    ) -> None:
        self.engine = engine
        self.engine_lock = engine_lock
        self.adapters = adapters
        self.cache_controls = cache_controls
        self.name = name

    @property
    def supports_lora(self) -> bool:
        """Whether LoRA adapters load here (the engine declares ``"lora"``)."""
        return "lora" in self.engine.supports

    def _require_lora(self) -> None:
        if not self.supports_lora:
            raise NotImplementedError(
                f"{self.name}: this backend loads no LoRA adapters (its engine "
                f"{type(self.engine).__name__} does not declare the 'lora' capability); use a backend "
                "that does (hf, vllm)"
            )

    @property
    def active_lora(self) -> str | None:
        """The active adapter's name (None: the base model)."""
        return self.adapters.active

    @property
    def loras(self) -> dict[str, str]:
        """Loaded adapters: name -> folder."""
        return dict(self.adapters.paths)

    def load_lora(self, path: Any, name: str = "default") -> None:
        """Load the LoRA adapter folder ``path`` under ``name``; the active adapter does not
        change (no result changes, no cache is dropped)."""
        self._require_lora()
        folder = self.adapters.check_new(path, name)
        with self.engine_lock:
            self.engine.load_adapter(name, folder)
            self.adapters.add(folder, name)

    def add_new_lora(self, lora_path: Any, lora_name: str = "default") -> None:
        """genlm-backend's name of :meth:`load_lora`."""
        self.load_lora(lora_path, lora_name)

    def set_lora(self, name: str = "default") -> None:
        """Compute with the loaded adapter ``name`` from now on; drops the cached rows (and
        the engine's KV, unless the engine keys it by adapter)."""
        self._require_lora()
        self.adapters.require(name)
        self._activate_adapter(name)

    def clear_lora(self) -> None:
        """Back to the base model; drops the cached rows as :meth:`set_lora` does."""
        self._require_lora()
        self._activate_adapter(None)

    def _activate_adapter(self, name: str | None) -> None:
        with self.engine_lock:
            self.engine.use_adapter(name)
            self.adapters.active = name
            self.cache_controls.drop_stale(engine_caches=not self.engine.adapter_keyed_kv)
