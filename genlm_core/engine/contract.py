"""The Engine part: what a plugin writes, and nothing the core decides.

A backend plugin writes one class, an :class:`Engine`: it loads from what the core hands
it and computes the next-token logits of distinct contexts::

    from genlm_core.engine import Engine

    class MyEngine(Engine):
        @classmethod
        def load(cls, checkpoint, config, services):
            return cls(my_engine.load(checkpoint.model, device=services.device, dtype=services.dtype))

        def __init__(self, model):
            self.model, self.tokenizer = model, model.tokenizer

        def forward(self, contexts):      # list[tuple[int, ...]], validated and distinct
            return self.model.last_logits(contexts)   # (B, >= vocab) logits

The talk is one way. The core reads the checkpoint, places the engine
(:mod:`~genlm_core.engine.placement`: device and dtype, before the engine is imported; the
engine class answers one question, :meth:`Engine.dtypes_on`) and calls
:meth:`Engine.load` with the :class:`~genlm_core.engine.checkpoint.Checkpoint`, the
validated config and the :class:`~genlm_core.engine.services.EngineServices` (the
placement, KV reuse on request, the row width). It then reads what the loaded engine says
(its tokenizer or vocabulary, EOS ids, token positions) once and calls its methods; it
never writes into the engine.

The backend (:class:`~genlm_core.engine.backend.BaseLogprobBackend`) decides everything
else once for every engine: the vocabulary, the context limit (the smaller of the
checkpoint's and the engine's :attr:`Engine.max_positions`), the default EOS ids,
validation, batching, caching, normalisation, the sampling checks and clamps, locking,
statistics and shutdown.

Optional capabilities are declared in :attr:`Engine.supports` (a set of the names in
:data:`CAPABILITIES`); the core calls the matching methods only for an engine that
declares it, and refuses an engine that declares one without writing its methods:

* ``"sample"``: :meth:`Engine.sample`, the engine's own sampler;
* ``"burst"``: bursts (:mod:`genlm_core.engine.burst`) through the core's decode step
  (the rows' distinct contexts through ``forward``); ``"decode"``: bursts through the
  engine's own :meth:`Engine.decode_step` and :meth:`Engine.end_burst`, rows kept between steps;
* ``"lora"``: LoRA adapters, :meth:`Engine.load_adapter` and :meth:`Engine.use_adapter`;
  the backend keeps the names, the lock, and drops the caches an adapter switch makes
  stale (:attr:`Engine.adapter_keyed_kv`).

KV prefix reuse is not a capability: an engine that resumes contexts from cached KV asks
``services.kv_reuse(...)`` once at load (:mod:`genlm_core.engine.services`).
docs/plugins.md is the page a plugin author reads.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from genlm_core.config import BackendConfig

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from genlm_core.engine.checkpoint import Checkpoint
    from genlm_core.engine.services import EngineServices
    from genlm_core.token import Token

__all__ = [
    "BURST_CAPABILITIES",
    "CAPABILITIES",
    "Engine",
    "SampleRequest",
    "check_engine",
]

#: optional capability -> the :class:`Engine` methods it promises
CAPABILITIES: dict[str, tuple[str, ...]] = {
    "sample": ("sample",),  # a sampler of the engine's own, called with batches of SampleRequest
    # bursts (genlm_core.engine.burst) through the core's decode step: the rows' distinct
    # contexts through forward (no method)
    "burst": (),
    # bursts through the engine's own decode step, keeping rows between steps
    "decode": ("decode_step", "end_burst"),
    "lora": ("load_adapter", "use_adapter"),  # LoRA adapters, kept by the backend
}

#: the capabilities that offer bursts (``supports_burst``): either one
BURST_CAPABILITIES: frozenset[str] = frozenset({"burst", "decode"})


@dataclass(frozen=True)
class SampleRequest:
    """One ``sample`` call, checked and clamped by the core: ``prompt`` is a valid context,
    ``max_tokens`` >= 1 fits the context limit, ``eos`` are the ids that stop it (the EOS
    token itself is not returned), ``temperature`` 0 (greedy) or between
    :data:`~genlm_core.engine.sampling.MIN_TEMPERATURE` and ``MAX_TEMPERATURE`` (a finite
    float32 divisor: :func:`~genlm_core.engine.sampling.sampling_temperature`), ``seed``
    None or an int."""

    prompt: tuple[int, ...]
    max_tokens: int
    eos: frozenset[int]
    temperature: float
    seed: int | None


class Engine:
    """The part of a backend a plugin writes: its engine's calls.

    Write :meth:`load` (or an ``__init__(checkpoint, config, services)``) and
    :meth:`forward`; set :attr:`tokenizer`. Everything else has a default.
    """

    # ------------------------------------------------------------------ what the class declares
    #: the config the engine takes (its registration may name it instead); its
    #: ``default_dtype`` is the engine's one default dtype
    config_class: ClassVar[type[BackendConfig]] = BackendConfig
    #: optional capabilities this engine implements (names of :data:`CAPABILITIES`)
    supports: ClassVar[frozenset[str]] = frozenset()
    #: what :meth:`forward` returns: ``"logits"`` (the core cuts each row to the vocabulary
    #: and normalises it in float32) or ``"logprobs"`` (the rows are final: float32,
    #: normalised, exactly ``len(byte_vocab)`` wide, each a compact tensor of its own)
    returns: ClassVar[Literal["logits", "logprobs"]] = "logits"
    #: run async batches in a worker thread (a wait on another process or the network) or on
    #: the event loop's own thread (an engine computing in this process: genlm-hf,
    #: llama.cpp); the ``forward_thread`` option wins
    forward_in_thread: bool = True
    #: capability ``"lora"``: whether the engine keys its KV by adapter (vLLM), so that
    #: switching adapters keeps it; else the core drops the engine's caches on a switch
    adapter_keyed_kv: bool = False
    #: capability ``"decode"``: whether :meth:`decode_step` computes each row as
    #: :meth:`forward` computes it (the same kernels and shapes). False where a burst runs
    #: other kernels (vLLM's one-token decode over kept KV against its prefill): the parity
    #: gate then measures it on the machine (:func:`genlm_core.testing.burst.same_arithmetic`).
    decode_same_arithmetic: bool = True

    # ------------------------------------------------------------------ what a loaded engine says
    # (read once, when the backend takes the engine)
    #: the tokenizer (``encode``/``decode``, ``eos_token_id``); the vocabulary is decoded from it
    tokenizer: Any = None
    #: the exact byte vocabulary, when the engine knows it (None: decoded from the tokenizer)
    byte_vocab: list[Token] | None = None
    #: the tokens as strings (None: from ``byte_vocab``)
    str_vocab: list[str] | None = None
    #: the EOS ids of the engine's tokenizer (None: ``tokenizer.eos_token_id``); the
    #: checkpoint's ``generation_config.json`` / ``config.json`` win over them
    eos_token_ids: list[int] | None = None
    #: the token positions the engine holds (its KV cells, vLLM's ``max_model_len``, a
    #: server's limit + 1): the core's context limit is then at most ``N - 1``, as for a
    #: checkpoint's (the predicted token needs a position too); None: no bound of its own
    max_positions: int | None = None
    #: where its rows come back, when not where it computes (an engine handing back numpy rows)
    rows_device: Any = None
    #: the model's configuration as the engine loaded it, for a checkpoint whose files were
    #: not on this machine before loading (a hub id the engine fetched, a model built in
    #: memory): the core reads the context limit and EOS ids from it then
    model_config: Mapping[str, Any] | None = None
    generation_config: Mapping[str, Any] | None = None
    #: what the engine computes in and where, read only where the core did not place it
    #: (the placement says None: a model served elsewhere, an engine built by hand)
    dtype: str = "float32"
    device: Any = "cpu"
    #: the services of an engine built by hand (``EngineServices(config)``), where the
    #: backend holding it finds them; a loaded engine's are the ones :meth:`load` received
    services: EngineServices | None = None

    # ------------------------------------------------------------------ loading
    @classmethod
    def dtypes_on(cls, device: str) -> Collection[str] | None:
        """The one question the core asks an engine class, before it loads: the dtypes it
        computes in on ``device`` (None: any). The core refuses any other dtype there.
        Raise ``ValueError`` naming the fix where the engine cannot run on ``device`` at all."""
        return None

    @classmethod
    def load(cls, checkpoint: Checkpoint, config: BackendConfig, services: EngineServices) -> Engine:
        """The engine for ``checkpoint`` (read by the core: folder checked, ``model=None``
        resolved), ``config`` (validated) and ``services`` (the placement, KV reuse, the row
        width: :mod:`genlm_core.engine.services`). The default calls
        ``cls(checkpoint, config, services)``."""
        return cls(checkpoint, config, services)  # type: ignore[call-arg]

    # ------------------------------------------------------------------ model calls
    def forward(self, contexts: list[tuple[int, ...]]) -> torch.Tensor | Sequence[torch.Tensor]:
        """Next-token scores of each context (see :attr:`returns`), in the order given.

        The contexts are validated and distinct: the backend merges identical ones."""
        raise NotImplementedError(f"{type(self).__name__} must implement forward(contexts)")

    def forward_uncached(self, contexts: list[tuple[int, ...]]) -> torch.Tensor | Sequence[torch.Tensor]:
        """:meth:`forward` without any engine cache (the reference computation); engines
        with KV reuse override it."""
        return self.forward(contexts)

    def decode_step(
        self, rows: Mapping[int, tuple[int, ...]], released: Collection[int]
    ) -> torch.Tensor | Sequence[torch.Tensor]:
        """The capability ``"decode"``: one step of a burst (:mod:`genlm_core.engine.burst`),
        over rows the engine keeps between steps.

        ``rows`` (never empty) maps each live row's handle to its context: its context at
        the previous step plus the token drawn there, or a prompt just added (a handle
        not seen before, or one released and added again). ``released`` holds the handles
        dropped since the last step, whose state the engine may free or hand to a new row
        whose context extends theirs. Returns the scores of every row in the order of
        ``rows`` (see :attr:`returns`); a row repeating another's context gets its own row.
        A row is its handle: an engine matches a step's rows to what it kept by handle,
        never by context alone. The burst ends with :meth:`end_burst`.

        An engine without state of its own between steps writes no decode step: it
        declares ``"burst"`` and the core's decode step runs the rows' distinct contexts
        through :meth:`forward` (whose KV reuse computes each row's new token only)."""
        raise NotImplementedError(f"{type(self).__name__} declares no decode step of its own")

    def end_burst(self, released: Collection[int]) -> None:
        """The capability ``"decode"``: the burst ended; ``released`` holds every handle the
        engine may still keep state for (those released since the last step, and the rows
        live at the end). Free their state (an engine keeping KV hands it to its prefix
        cache first, where a later call finds it). Called once per burst that added rows,
        also when the burst failed, under the engine lock."""
        raise NotImplementedError(f"{type(self).__name__} declares no decode step of its own")

    def sample(self, requests: list[SampleRequest]) -> list[list[int]]:
        """The capability ``"sample"``: the tokens of every request, drawn by the engine's own
        sampler, stopping before (and without) any token of ``request.eos``."""
        raise NotImplementedError(f"{type(self).__name__} declares no sampler")

    # ------------------------------------------------------------------ LoRA ("lora")
    def load_adapter(self, name: str, folder: str) -> None:
        """Load the LoRA adapter in ``folder`` under ``name`` without activating it (the
        backend has checked the name and the folder)."""
        raise NotImplementedError(f"{type(self).__name__} declares no LoRA support")

    def use_adapter(self, name: str | None) -> None:
        """Compute with the loaded adapter ``name`` from the next call on (None: the base
        model). The backend holds the engine lock and drops the caches it makes stale."""
        raise NotImplementedError(f"{type(self).__name__} declares no LoRA support")

    # ------------------------------------------------------------------ housekeeping
    def clear_cache(self) -> None:
        """Drop engine-side caches (the backend then clears the KV reuse it lent)."""

    @property
    def healthy(self) -> bool:
        """Whether the engine can answer (engines with processes of their own refine it)."""
        return True

    def context_limit_error(self, tokens: int) -> str | None:
        """Why a context of ``tokens`` tokens, past the core's limit, does not fit, when the
        engine's own setting bounds it (its KV budget: the option, the size the context
        needs, the fix), for the caller's ``ValueError``; None: the model's window does
        (the core's sentence then says so)."""
        return None

    def stats(self) -> dict[str, Any]:
        """The engine's own counters (``stats()["engine"]`` adds the KV-reuse counters)."""
        return {}

    def stats_sections(self) -> dict[str, Any]:
        """Sections of ``stats()`` of the engine's own beside ``"engine"`` (a client's
        ``"transport"``): name -> dict."""
        return {}

    def info(self) -> dict[str, Any]:
        """What runs where, beyond the backend, model, device and vocabulary size."""
        return {}

    def close(self) -> None:
        """Release the engine (the backend calls it once, after its batchers stopped; the KV
        reuse it lent is dropped after)."""


#: what to write instead, after the error naming a missing method or an old capability
_CAPABILITY_HINTS: dict[str, str] = {
    "decode": (
        ": an engine keeping a burst's rows between steps writes both decode_step(rows, released) "
        "and end_burst(released) (a burst's end, formerly decode_step({}, released)); an engine "
        "without state between steps declares 'burst' instead and gets the core's decode step"
    ),
    "kv": (
        "; KV prefix reuse is asked for at load instead: self.kv = services.kv_reuse(...) in "
        "Engine.load(checkpoint, config, services) (docs/plugins.md)"
    ),
}


def check_engine(engine: Any) -> None:
    """Refuse an engine that declares a capability without writing its method, or an
    unknown capability (the message names it and what to write)."""
    cls = type(engine)
    for name in getattr(cls, "supports", ()):
        methods = CAPABILITIES.get(name)
        if methods is None:
            raise TypeError(
                f"{cls.__name__}.supports names {name!r}, which is not a capability "
                f"(known: {', '.join(sorted(CAPABILITIES))})" + _CAPABILITY_HINTS.get(name, "")
            )
        for method in methods:
            if getattr(cls, method, None) is getattr(Engine, method):
                raise TypeError(
                    f"{cls.__name__}.supports declares {name!r} but does not define {method}()"
                    + _CAPABILITY_HINTS.get(name, "")
                )
    if getattr(cls, "returns", "logits") not in ("logits", "logprobs"):
        raise TypeError(f"{cls.__name__}.returns must be 'logits' or 'logprobs', got {cls.returns!r}")
