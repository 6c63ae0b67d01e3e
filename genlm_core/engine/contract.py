"""The Engine part: what a plugin writes, and nothing the core decides.

A backend plugin writes one class, an :class:`Engine`: it loads its engine from the
:class:`~genlm_core.engine.checkpoint.Checkpoint` the core has read, and computes the
next-token logits of distinct contexts::

    from genlm_core.engine import Engine

    class MyEngine(Engine):
        def __init__(self, checkpoint, config):
            self.model, self.tokenizer = my_engine.load(checkpoint.model, dtype=checkpoint.dtype)

        def forward(self, contexts):      # list[tuple[int, ...]], validated and distinct
            return self.model.last_logits(contexts)   # (B, >= vocab) logits

The backend (:class:`~genlm_core.engine.backend.BaseLogprobBackend`) holds the engine
and decides everything else once for every engine: the vocabulary, the context limit
(the smaller of the checkpoint's and :attr:`Engine.max_context_length`), the default
EOS ids, dtype refusals, validation, batching, caching, normalisation, the sampling
checks and clamps, locking, statistics and shutdown.

Optional capabilities are declared in :attr:`Engine.supports` (a set of the names in
:data:`CAPABILITIES`); the core calls the matching methods only for an engine that
declares it, and refuses an engine that declares one without writing its methods:

* ``"sample"``: :meth:`Engine.sample`, the engine's own sampler;
* ``"burst"``: bursts (:mod:`genlm_core.engine.burst`) through the core's decode step
  (the rows' distinct contexts through ``forward``); ``"decode"``: bursts through the
  engine's own :meth:`Engine.decode_step` and :meth:`Engine.end_burst`, rows kept between steps;
* ``"kv"``: the engine resumes a context from the KV state of a prefix. The core builds
  its :class:`~genlm_core.engine.kv_reuse.KVReuse` (the registered prefix cache the
  config names, under the config's budget) and hands it to the engine as :attr:`Engine.kv`
  before the first call; the engine says what a payload costs (:meth:`Engine.kv_sizeof`),
  which engine resource it reads (:meth:`Engine.kv_owner`) and how to free one
  (:meth:`Engine.release_kv`), and why a model cannot reuse KV (:meth:`Engine.kv_problem`);
* ``"lora"``: LoRA adapters, :meth:`Engine.load_adapter` and :meth:`Engine.use_adapter`;
  the backend keeps the names, the lock, and drops the caches an adapter switch makes
  stale (:attr:`Engine.adapter_keyed_kv`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from genlm_core.config import BackendConfig
from genlm_core.engine.dtypes import UnsupportedDtypeError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from genlm_core.engine.checkpoint import Checkpoint
    from genlm_core.engine.kv_reuse import KVReuse
    from genlm_core.token import Token

__all__ = [
    "BURST_CAPABILITIES",
    "CAPABILITIES",
    "DEFAULTED_CAPABILITIES",
    "Engine",
    "SampleRequest",
    "check_engine",
    "refuse_unsupported_dtype",
]

#: optional capability -> the :class:`Engine` methods it promises
CAPABILITIES: dict[str, tuple[str, ...]] = {
    "sample": ("sample",),  # a sampler of the engine's own, called with batches of SampleRequest
    # bursts (genlm_core.engine.burst) through the core's decode step: the rows' distinct
    # contexts through forward (no method)
    "burst": (),
    # bursts through the engine's own decode step, keeping rows between steps
    "decode": ("decode_step", "end_burst"),
    "kv": (),  # KV prefix reuse, wired by the core (the methods have defaults)
    "lora": ("load_adapter", "use_adapter"),  # LoRA adapters, kept by the backend
}

#: capabilities whose methods have a default the core writes: declaring one is enough
DEFAULTED_CAPABILITIES: frozenset[str] = frozenset({"burst", "kv"})

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

    Write :meth:`forward` (and load the engine in ``__init__(checkpoint, config)`` or
    :meth:`load`); set :attr:`tokenizer`. Everything else has a default.
    """

    #: the config the engine takes (its registration may name it instead)
    config_class: ClassVar[type[BackendConfig]] = BackendConfig
    #: optional capabilities this engine implements (names of :data:`CAPABILITIES`)
    supports: ClassVar[frozenset[str]] = frozenset()
    #: what :meth:`forward` returns: ``"logits"`` (the core cuts each row to the vocabulary
    #: and normalises it in float32) or ``"logprobs"`` (the rows are final: float32,
    #: normalised, exactly ``len(byte_vocab)`` wide, each a compact tensor of its own)
    returns: ClassVar[Literal["logits", "logprobs"]] = "logits"

    #: the tokenizer (``encode``/``decode``, ``eos_token_id``); the vocabulary is decoded from it
    tokenizer: Any = None
    #: the exact byte vocabulary, when the engine knows it (None: decoded from the tokenizer)
    byte_vocab: "list[Token] | None" = None
    #: the tokens as strings (None: from ``byte_vocab``)
    str_vocab: list[str] | None = None
    #: the EOS ids of the engine's tokenizer (None: ``tokenizer.eos_token_id``); the
    #: checkpoint's ``generation_config.json`` / ``config.json`` win over them
    eos_token_ids: list[int] | None = None
    #: the model the engine runs whatever ``model=`` said (a server's): the core refuses a
    #: config naming another one, and ``model=None`` becomes this one (None: the checkpoint's)
    serves_model: str | None = None
    #: the longest context the engine itself accepts (None: no bound of its own)
    max_context_length: int | None = None
    #: the token positions the engine holds (its KV cells, ``max_model_len``): the core's
    #: context limit is then ``N - 1``, as for a checkpoint's (the predicted token needs a
    #: position too); None: no bound of its own
    max_positions: int | None = None
    #: what the engine computes in (``"float32"``, ``"float16"``, ``"bfloat16"``), read from it
    dtype: str = "float32"
    #: where it computes (``"cpu"``, ``"cuda"``, ``"mps"``...)
    device: Any = "cpu"
    #: where its rows come back, when not on :attr:`device` (e.g. an engine handing back numpy rows)
    rows_device: Any = None
    #: run async batches in a worker thread (a wait on another process or the network) or on
    #: the event loop's own thread (genlm-hf on any device, llama.cpp); ``forward_thread`` wins
    forward_in_thread: bool = True
    #: the model's configuration as the engine loaded it, for a checkpoint whose files were
    #: not on this machine before loading (a hub id the engine fetched, a model built in
    #: memory): the core reads the context limit and EOS ids from it then
    model_config: Mapping[str, Any] | None = None
    generation_config: Mapping[str, Any] | None = None
    #: the width of a row the core reads: ``len(byte_vocab)``, set by the core when it holds
    #: the engine (an engine's logits may be wider: padded vocabularies are cut)
    vocab_size: int | None = None
    #: KV prefix reuse (capability ``"kv"``): the core's :class:`~genlm_core.engine.kv_reuse.KVReuse`,
    #: set before the first call (a disabled one when reuse is off or the model cannot);
    #: the backend then offers ``cache_kv``, ``clear_kv_cache``, ``prefix_cache`` and their counters
    kv: "KVReuse | None" = None
    #: capability ``"lora"``: whether the engine keys its KV by adapter (vLLM), so that
    #: switching adapters keeps it; else the core drops the engine's caches on a switch
    adapter_keyed_kv: bool = False
    #: whether :meth:`decode_step` computes each row as :meth:`forward` computes it (the
    #: core's decode step and decode batches over the engine's own KV: the same kernels
    #: and shapes). False where a burst runs other kernels (vLLM's one-token decode over
    #: kept KV against its prefill): the parity gate then measures it on the machine
    #: (:func:`genlm_core.testing.burst.same_arithmetic`).
    decode_same_arithmetic: bool = True

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, checkpoint: "Checkpoint", config: BackendConfig) -> "Engine":
        """The engine for ``checkpoint`` (read by the core: folder checked, ``model=None``
        resolved, dtype resolved). The default calls ``cls(checkpoint, config)``."""
        return cls(checkpoint, config)  # type: ignore[call-arg]

    @classmethod
    def supported_dtypes(cls, config: BackendConfig) -> tuple[str, Collection[str] | None]:
        """``(device, dtypes the engine can compute in there)`` (None: any), asked before
        :meth:`load`: the core refuses any other dtype there, before any weight is read."""
        return "cpu", None

    # ------------------------------------------------------------------ model calls
    def forward(self, contexts: list[tuple[int, ...]]) -> "torch.Tensor | Sequence[torch.Tensor]":
        """Next-token scores of each context (see :attr:`returns`), in the order given.

        The contexts are validated and distinct: the backend merges identical ones."""
        raise NotImplementedError(f"{type(self).__name__} must implement forward(contexts)")

    def forward_uncached(self, contexts: list[tuple[int, ...]]) -> "torch.Tensor | Sequence[torch.Tensor]":
        """:meth:`forward` without any engine cache (the reference computation); engines
        with KV reuse override it."""
        return self.forward(contexts)

    def decode_step(
        self, rows: Mapping[int, tuple[int, ...]], released: Collection[int]
    ) -> "torch.Tensor | Sequence[torch.Tensor]":
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

    # ------------------------------------------------------------------ KV reuse ("kv")
    def kv_problem(self) -> str | None:
        """Why this model cannot resume from cached KV (recurrent or sliding-window layers,
        a batch-invariant mode), or None when it can. The core then keeps no prefix cache."""
        return None

    #: the load() option that sets :meth:`kv_budget` (named when the budget is too small)
    kv_budget_option: str = "kv_cache_bytes"

    def kv_budget(self, config: BackendConfig) -> int | None:
        """The prefix cache's bound, in the unit :meth:`kv_sizeof` counts (default: the
        config's ``kv_cache_bytes``, in bytes; None: no bound; 0: no reuse)."""
        return getattr(config, "kv_cache_bytes", None)

    def kv_sizeof(self, payload: Any) -> int:
        """What one cached payload costs against :meth:`kv_budget` (default: the bytes it
        keeps alive)."""
        from genlm_core.engine.memory import sizeof

        return sizeof(payload)

    def kv_owner(self, payload: Any) -> Any:
        """The engine resource ``payload`` reads (a llama.cpp KV sequence that several
        cached prefixes share), or None for a payload that owns its memory. The core counts
        the cached entries and the running calls reading each owner and calls
        :meth:`release_kv` when none is left."""
        return None

    def release_kv(self, owner: Any) -> None:
        """Free ``owner`` (see :meth:`kv_owner`): no cached prefix reads it any more."""

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
        """Drop engine-side caches (KV)."""
        if self.kv is not None:
            self.kv.clear()

    @property
    def healthy(self) -> bool:
        """Whether the engine can answer (engines with processes of their own refine it)."""
        return True

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
        """Release the engine (the backend calls it once, after its batchers stopped)."""
        if self.kv is not None:
            self.kv.clear()


#: what to write instead, after the error naming a missing method
_CAPABILITY_HINTS: dict[str, str] = {
    "decode": (
        ": an engine keeping a burst's rows between steps writes both decode_step(rows, released) "
        "and end_burst(released) (a burst's end, formerly decode_step({}, released)); an engine "
        "without state between steps declares 'burst' instead and gets the core's decode step"
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
                f"(known: {', '.join(sorted(CAPABILITIES))})"
            )
        if name in DEFAULTED_CAPABILITIES:
            continue
        for method in methods:
            if getattr(cls, method, None) is getattr(Engine, method):
                raise TypeError(
                    f"{cls.__name__}.supports declares {name!r} but does not define {method}()"
                    + _CAPABILITY_HINTS.get(name, "")
                )
    if getattr(cls, "returns", "logits") not in ("logits", "logprobs"):
        raise TypeError(f"{cls.__name__}.returns must be 'logits' or 'logprobs', got {cls.returns!r}")


def refuse_unsupported_dtype(
    engine_class: type[Engine], checkpoint: "Checkpoint", config: BackendConfig, name: str
) -> None:
    """Raise :class:`UnsupportedDtypeError` when the dtype ``checkpoint`` resolved is not one
    ``engine_class`` computes in on its device (asked before anything loads)."""
    if checkpoint.dtype is None:
        return
    device, dtypes = engine_class.supported_dtypes(config)
    if dtypes is not None and checkpoint.dtype not in dtypes:
        raise UnsupportedDtypeError(
            name, checkpoint.dtype, device, f"the engine computes in {', '.join(sorted(dtypes))} there"
        )
