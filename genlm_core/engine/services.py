"""What the core hands an engine at load: :class:`EngineServices`, a frozen value.

``Engine.load(checkpoint, config, services)`` receives, besides the checkpoint the core
read and the validated config:

* ``services.placement`` (``services.device``, ``services.dtype``): the
  :class:`~genlm_core.engine.placement.Placement` decided before the engine was imported
  (load the model there, in that dtype);
* ``services.name``: the backend's name, for the engine's messages.

It is input only: the engine reads it and writes nothing into it, and the core reads
nothing back from it. What a call needs is passed with the call (the rows to resume and
their payloads: :mod:`genlm_core.engine.kv_rows`; the width of a row:
:attr:`~genlm_core.engine.contract.SampleRequest.width`). An engine built by hand
(around a model loaded by the caller) needs none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from genlm_core.engine.placement import Placement

if TYPE_CHECKING:  # pragma: no cover
    from genlm_core.config import BackendConfig

__all__ = ["EngineServices"]


@dataclass(frozen=True)
class EngineServices:
    """The core's input to one engine's load: its config, placement and name.

    Args:
        config: the backend's validated config.
        placement: where and in what the engine computes (default: not placed by the core,
            an engine built by hand: its own ``device`` and ``dtype`` say it).
        name: the backend's name, for messages (default: the config's component).
    """

    config: BackendConfig
    placement: Placement = field(default_factory=Placement)
    name: str = ""

    def __post_init__(self) -> None:
        if self.placement is None:
            object.__setattr__(self, "placement", Placement())
        if not self.name:
            object.__setattr__(self, "name", type(self.config).component or "backend")

    @property
    def device(self) -> str | None:
        """Where the engine computes (None: not placed by the core)."""
        return self.placement.device

    @property
    def dtype(self) -> str | None:
        """What the engine computes in (None: not placed by the core)."""
        return self.placement.dtype
