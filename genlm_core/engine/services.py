"""What the core lends an engine: :class:`EngineServices`, handed to ``Engine.load``.

``Engine.load(checkpoint, config, services)`` receives, besides the checkpoint the core
read and the validated config, the things an engine uses from the core:

* ``services.device`` and ``services.dtype``: the :class:`~genlm_core.engine.placement.Placement`
  decided before the engine was imported (load the model there, in that dtype);
* ``services.kv_reuse(...)``: KV prefix reuse for an engine that resumes contexts from
  the KV state of a prefix (a :class:`~genlm_core.engine.kv_reuse.KVReuse` under the
  config's ``prefix_cache``, ``kv_cache_bytes`` and ``prefix_cache_impl``); the engine
  asks once, at load, saying what its model allows and what a payload costs;
* ``services.vocab_size``: the width of a row the core reads (``len(byte_vocab)``), known
  once the backend holds the engine, before its first call.

The engine reads them; the core writes nothing into the engine. The backend reads what
it lent back from here (the KV reuse for ``cache_kv``, ``prefix_cache`` and the counters).
An engine built by hand (around a model loaded by the caller) makes its own,
``EngineServices(config)``, and keeps them as its ``services`` attribute, where the
backend holding it finds them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from genlm_core.engine.placement import Placement

if TYPE_CHECKING:  # pragma: no cover
    from genlm_core.config import BackendConfig
    from genlm_core.engine.kv_reuse import KVReuse

__all__ = ["EngineServices"]

#: ``kv_reuse(budget=...)`` not given: the config's ``kv_cache_bytes``
_CONFIG_BUDGET: Any = object()


class EngineServices:
    """The core's side of one engine: its placement, its KV reuse and the row width.

    Args:
        config: the backend's validated config (the KV-reuse options are read from it).
        placement: where and in what the engine computes (None: not placed by the core,
            an engine built by hand: its own ``device`` and ``dtype`` say it).
        name: the backend's name, for messages.
    """

    def __init__(
        self, config: BackendConfig, placement: Placement | None = None, name: str | None = None
    ) -> None:
        self.config = config
        self.placement = placement if placement is not None else Placement()
        self.name = name or type(config).component or "backend"
        #: the engine's KV reuse (None until it asks for one with :meth:`kv_reuse`)
        self.kv: KVReuse | None = None
        self._vocab_size: int | None = None

    @property
    def device(self) -> str | None:
        """Where the engine computes (None: not placed by the core)."""
        return self.placement.device

    @property
    def dtype(self) -> str | None:
        """What the engine computes in (None: not placed by the core)."""
        return self.placement.dtype

    @property
    def vocab_size(self) -> int:
        """The width of a row the core reads: ``len(byte_vocab)`` (an engine's logits may be
        wider: padded vocabularies are cut). Known once the backend holds the engine, before
        its first call: read it in calls, not while loading."""
        if self._vocab_size is None:
            raise RuntimeError(
                f"{self.name}: services.vocab_size is known once the backend holds the engine "
                "(the vocabulary is read from the engine's tokenizer then): read it in forward() "
                "and the other calls, not in load(); an engine built by hand is held with "
                "BaseLogprobBackend(engine, config), which finds engine.services"
            )
        return self._vocab_size

    def set_vocab_size(self, width: int) -> None:
        """The backend's: the width it read from the engine's vocabulary."""
        self._vocab_size = int(width)

    def kv_reuse(
        self,
        *,
        problem: str | None = None,
        sizeof: Callable[[Any], int] | None = None,
        budget: int | None = _CONFIG_BUDGET,
        budget_option: str = "kv_cache_bytes",
        owner: Callable[[Any], Any] | None = None,
        release: Callable[[Any], None] | None = None,
    ) -> KVReuse:
        """The engine's KV prefix reuse, asked once at load (:class:`~genlm_core.engine.kv_reuse.KVReuse`).

        Reuse is on when the config's ``prefix_cache`` is, the budget is not 0 and
        ``problem`` is None (a model that cannot resume from cached KV says why: recurrent
        or sliding-window layers; reuse asked for then warns and stays off).

        Args:
            problem: why this model cannot reuse KV, or None.
            sizeof: what a payload costs against the budget (default: the bytes it keeps alive).
            budget: the cache's bound in ``sizeof``'s unit (default: the config's
                ``kv_cache_bytes``; None: no bound; 0: no reuse).
            budget_option: the load() option that sets ``budget`` (named when it is too small).
            owner: the engine resource a payload reads (a llama.cpp KV sequence several
                cached prefixes share; None: payloads own their memory).
            release: frees an owner nothing reads any more.
        """
        from genlm_core.engine.kv_reuse import KVReuse

        if self.kv is not None:
            raise RuntimeError(f"{self.name}: the engine asked for its KV reuse twice; ask once, in load()")
        if budget is _CONFIG_BUDGET:
            budget = getattr(self.config, "kv_cache_bytes", None)
        self.kv = KVReuse.for_config(
            self.config,
            budget,
            name=self.name,
            problem=problem,
            sizeof=sizeof,
            budget_option=budget_option,
            owner=owner,
            release=release,
        )
        return self.kv
