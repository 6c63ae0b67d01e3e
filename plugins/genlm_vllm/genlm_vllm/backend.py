"""VLLMBackend: genlm-core's backend holding a :class:`~genlm_vllm.engine.VLLMEngine`.

The engine is the vLLM part (logits capture, vLLM's sampler, its processes, read
through the backend: ``llm.in_process``, ``llm.workers``); this class adds LoRA
adapters (a :class:`~genlm_core.protocols.LoraBackend`). ``EngineDiedError``, ``VLLMNotInstalledError``,
``INSTALL_HINT``, ``engine_kwargs`` and ``check_dtype`` are importable from here too.
"""

from __future__ import annotations

from typing import Any

from genlm_core.engine import BaseLogprobBackend, LoraAdapters
from genlm_vllm.config import VLLMConfig
from genlm_vllm.engine import VLLMEngine
from genlm_vllm.launch import INSTALL_HINT, VLLMNotInstalledError, check_dtype, engine_kwargs
from genlm_vllm.lifecycle import EngineDiedError

__all__ = [
    "INSTALL_HINT",
    "EngineDiedError",
    "VLLMBackend",
    "VLLMNotInstalledError",
    "check_dtype",
    "engine_kwargs",
]


class VLLMBackend(BaseLogprobBackend):
    """LogprobBackend on a ``vllm.LLM`` engine (V1).

    Build it with ``genlm_core.load("vllm", model=...)``, ``VLLMBackend.from_name`` or
    ``VLLMBackend(VLLMEngine(llm, config), config)`` around an ``LLM`` you made yourself
    with :func:`engine_kwargs` (it must carry the capture processor and worker extension).
    """

    config_class = VLLMConfig
    backend_name = "vllm"
    engine_class = VLLMEngine
    engine: VLLMEngine

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.adapters = LoraAdapters()
        self._lora_requests: dict[str, Any] = {}

    # ------------------------------------------------------------------ LoRA
    def load_lora(self, path: str, name: str = "default") -> None:
        """Register the adapter folder ``path`` under ``name`` (needs ``enable_lora=True``);
        the active adapter does not change (no result changes, no cache is dropped)."""
        if not self.engine.lora_enabled():
            raise ValueError("LoRA is disabled: build the backend with enable_lora=True")
        folder = self.adapters.check_new(path, name)
        self._lora_requests[name] = self.engine.new_lora_request(name, folder)
        self.adapters.add(folder, name)

    def add_new_lora(self, lora_path: str, lora_name: str = "default") -> None:
        """genlm-backend's name of :meth:`load_lora`."""
        self.load_lora(lora_path, lora_name)

    def set_lora(self, name: str = "default") -> None:
        """Use adapter ``name`` for every later call; drops the output cache (vLLM keys its
        prefix cache by adapter: no KV to drop)."""
        self.adapters.require(name)
        with self.engine_lock:
            self.engine.lora_request = self._lora_requests[name]
            self.adapters.active = name
            if self.output_cache is not None:
                self.output_cache.clear()

    def clear_lora(self) -> None:
        """Back to the base model; drops the output cache."""
        with self.engine_lock:
            self.engine.lora_request = None
            self.adapters.active = None
            if self.output_cache is not None:
                self.output_cache.clear()

    @property
    def active_lora(self) -> str | None:
        return self.adapters.active
