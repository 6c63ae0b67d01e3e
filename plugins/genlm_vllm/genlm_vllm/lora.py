"""LoRA adapters on a vLLM engine: the LoRA methods of
:class:`~genlm_vllm.backend.VLLMBackend`.

:class:`VLLMLora` is a mixin of the backend implementing
:class:`~genlm_core.protocols.LoraBackend` (``load_lora``, ``set_lora``, ``clear_lora``,
``active_lora``; genlm-backend's ``add_new_lora``). The bookkeeping is the core's
:class:`~genlm_core.engine.lora.LoraAdapters`; each adapter becomes a ``vllm.lora.request.LoRARequest``
that every later engine call passes (``_active_lora``). Switching runs under the model
lock; vLLM keys its prefix cache by adapter, so only the output cache is dropped.
"""

from __future__ import annotations

from typing import Any

__all__ = ["VLLMLora"]


class VLLMLora:
    """The LoRA methods of :class:`~genlm_vllm.backend.VLLMBackend` (a mixin)."""

    # set by VLLMBackend.__init__ and BaseLogprobBackend.__init__
    llm: Any
    adapters: Any  # genlm_core.engine.lora.LoraAdapters
    batcher: Any
    output_cache: Any
    _lora_ids: Any  # itertools.count
    _lora_requests: dict[str, Any]
    _active_lora: Any  # the active LoRARequest, None for the base model

    def load_lora(self, path: str, name: str = "default") -> None:
        """Register the adapter folder ``path`` under ``name`` (needs ``enable_lora=True``);
        the active adapter does not change (no result changes, no cache is dropped)."""
        if not self.llm.llm_engine.vllm_config.lora_config:
            raise ValueError("LoRA is disabled: build the backend with enable_lora=True")
        from vllm.lora.request import LoRARequest

        folder = self.adapters.check_new(path, name)
        self._lora_requests[name] = LoRARequest(name, next(self._lora_ids), folder)
        self.adapters.add(folder, name)

    def add_new_lora(self, lora_path: str, lora_name: str = "default") -> None:
        """genlm-backend's name of :meth:`load_lora`."""
        self.load_lora(lora_path, lora_name)

    def set_lora(self, name: str = "default") -> None:
        """Use adapter ``name`` for every later call; drops the output cache (vLLM keys its
        prefix cache by adapter: no KV to drop)."""
        self.adapters.require(name)
        with self.batcher.model_lock:
            self._active_lora = self._lora_requests[name]
            self.adapters.active = name
            if self.output_cache is not None:
                self.output_cache.clear()

    def clear_lora(self) -> None:
        """Back to the base model; drops the output cache."""
        with self.batcher.model_lock:
            self._active_lora = None
            self.adapters.active = None
            if self.output_cache is not None:
                self.output_cache.clear()

    @property
    def active_lora(self) -> str | None:
        return self.adapters.active
