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
validated config and the :class:`~genlm_core.engine.services.EngineServices` (a frozen
value: the placement and the backend's name). It then reads what the loaded engine says
(its tokenizer or vocabulary, EOS ids, token positions, how it keeps KV) once and calls its
methods with everything a call needs (the rows to resume, the width of a row); it never
writes into the engine, and the engine never calls back into the core.

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
  stale (:attr:`Engine.adapter_keyed_kv`);
* ``"resume"``: KV prefix reuse. The engine resumes contexts from kept KV: it declares
  how its KV is kept once (:meth:`Engine.kv_policy`) and computes the rows the core hands
  it, each with the depth and payload to resume from (:meth:`Engine.forward_rows`); the
  core looks prefixes up, makes room, keeps what the engine hands back and releases it
  (:mod:`genlm_core.engine.kv_calls`, :mod:`genlm_core.engine.kv_rows`);
* ``"kept_batches"``: with ``"resume"``, bursts through the core's decode step over
  batches whose KV the engine keeps between steps (:meth:`Engine.decode_ops`,
  :mod:`genlm_core.engine.decode_batches`).

docs/plugins.md is the page a plugin author reads.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, TypeVar

from genlm_core.config import BackendConfig

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from genlm_core.engine.checkpoint import Checkpoint
    from genlm_core.engine.decode_batches import DecodeOps
    from genlm_core.engine.kv_rows import KVPolicy, ResumeRow, RowsOut
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
    # KV prefix reuse: the core hands rows to resume (genlm_core.engine.kv_calls)
    "resume": ("kv_policy", "forward_rows"),
    # bursts over batches whose KV the engine keeps between steps (with "resume")
    "kept_batches": ("decode_ops",),
}

#: the capabilities that offer bursts (``supports_burst``): either one
BURST_CAPABILITIES: frozenset[str] = frozenset({"burst", "decode", "kept_batches"})


@dataclass(frozen=True)
class SampleRequest:
    """One ``sample`` call, checked and clamped by the core: ``prompt`` is a valid context,
    ``max_tokens`` >= 1 fits the context limit, ``eos`` are the ids that stop it (the EOS
    token itself is not returned), ``temperature`` 0 (greedy) or between
    :data:`~genlm_core.engine.sampling.MIN_TEMPERATURE` and ``MAX_TEMPERATURE`` (a finite
    float32 divisor: :func:`~genlm_core.engine.sampling.sampling_temperature`), ``seed``
    None or an int, ``width`` the ids it may draw."""

    prompt: tuple[int, ...]
    max_tokens: int
    eos: frozenset[int]
    temperature: float
    seed: int | None
    #: the width of a row the core reads (``len(byte_vocab)``): ids at or past it are never
    #: drawn (an engine whose logits are padded wider masks them); None: every id the model scores
    width: int | None = None


#: the config class an engine takes (``class MyEngine(Engine[MyConfig])``: load() receives one)
ConfigT = TypeVar("ConfigT", bound=BackendConfig)


class Engine(Generic[ConfigT]):
    """The part of a backend a plugin writes: its engine's calls.

    Write :meth:`load` (or an ``__init__(checkpoint, config, services)``) and
    :meth:`forward` (or, resuming from kept KV, :meth:`kv_policy` and
    :meth:`forward_rows`); set :attr:`tokenizer`. Everything else has a default.
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
    #: the load() option that sets :attr:`max_positions` (vLLM ``max_model_len``, llama.cpp
    #: ``n_ctx``): a context past the limit it sets, below the model's own window, is refused
    #: with its name and the fix (raise it, or truncate); None: the core names the model's window
    max_positions_option: str | None = None
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

    # ------------------------------------------------------------------ loading
    @classmethod
    def dtypes_on(cls, device: str) -> Collection[str] | None:
        """The one question the core asks an engine class, before it loads: the dtypes it
        computes in on ``device`` (None: any). The core refuses any other dtype there.
        Raise ``ValueError`` naming the fix where the engine cannot run on ``device`` at all."""
        return None

    @classmethod
    def load(cls, checkpoint: Checkpoint, config: ConfigT, services: EngineServices) -> Engine[ConfigT]:
        """The engine for ``checkpoint`` (read by the core: folder checked, ``model=None``
        resolved), ``config`` (validated, of the engine's config class) and ``services``
        (the placement and the backend's name: :mod:`genlm_core.engine.services`). The
        default calls ``cls(checkpoint, config, services)``."""
        return cls(checkpoint, config, services)  # type: ignore[call-arg]

    # ------------------------------------------------------------------ model calls
    def forward(self, contexts: list[tuple[int, ...]]) -> torch.Tensor | Sequence[torch.Tensor]:
        """Next-token scores of each context (see :attr:`returns`), in the order given.

        The contexts are validated and distinct: the backend merges identical ones. An
        engine declaring ``"resume"`` need not write it: the core calls
        :meth:`forward_rows`, and this default runs every context from its start through
        it, keeping nothing."""
        if "resume" not in self.supports:
            raise NotImplementedError(f"{type(self).__name__} must implement forward(contexts)")
        from genlm_core.engine.kv_rows import ResumeRow

        out = self.forward_rows([ResumeRow(tuple(c)) for c in contexts])
        owners = {id(o): o for o in (self.kv_owner(p) for _, p in out.kept) if o is not None}
        for owner in owners.values():
            self.release_kv(owner)
        return out.rows

    # ------------------------------------------------------------------ KV reuse ("resume")
    def kv_policy(self) -> KVPolicy:
        """The capability ``"resume"``: how this engine's KV is kept (read once, when the
        backend takes the engine): the budget and its option, which kept contexts the
        core releases first, whether nested contexts are read off a row."""
        raise NotImplementedError(f"{type(self).__name__} declares no KV reuse")

    def forward_rows(self, rows: list[ResumeRow]) -> RowsOut:
        """The capability ``"resume"``: compute ``rows`` (distinct contexts, each resuming
        from ``depth`` tokens of KV in the engine's own ``payload``) and hand back their
        scores and the payloads of the contexts computed (:class:`~genlm_core.engine.kv_rows.RowsOut`).
        The core made room first (:meth:`kv_shortfall`). A payload handed in is read, never
        changed: the engine copies or forks what it extends. On an error the engine frees
        what it took for the call."""
        raise NotImplementedError(f"{type(self).__name__} declares no KV reuse")

    def kv_shortfall(self, rows: list[ResumeRow]) -> int:
        """How much room ``rows`` lack, in the engine's own unit (0: they fit). The core
        releases kept contexts the rows do not read until it is 0, or runs them in parts."""
        return 0

    def kv_size(self, payload: Any) -> int:
        """What a payload costs against :attr:`KVPolicy.budget
        <genlm_core.engine.kv_rows.KVPolicy.budget>` (default: the bytes it keeps alive)."""
        from genlm_core.engine.memory import sizeof

        return sizeof(payload)

    def kv_owner(self, payload: Any) -> Any:
        """The engine resource a payload reads, shared by several payloads (a llama.cpp KV
        sequence), or the payload itself when the engine frees it explicitly (None: the
        payload owns its memory and needs no release)."""
        return None

    def release_kv(self, owner: Any) -> None:
        """Free ``owner`` (see :meth:`kv_owner`): no kept payload and no running call reads it."""

    def decode_ops(self) -> DecodeOps:
        """The capability ``"kept_batches"``: what the core's decode step over kept batches
        calls (:class:`~genlm_core.engine.decode_batches.DecodeOps`)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no batches between steps")

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
        """Drop engine-side caches (the core first releases every kept payload)."""

    @property
    def healthy(self) -> bool:
        """Whether the engine can answer (engines with processes of their own refine it)."""
        return True

    def context_limit_error(self, tokens: int) -> str | None:
        """Why a context of ``tokens`` tokens, past the core's limit, does not fit, when the
        engine's own setting bounds it (its KV budget: the option, the size the context
        needs, the fix), for the caller's ``ValueError``; None: the core's sentence names
        what does (:attr:`max_positions_option`, or the model's window)."""
        return None

    def stats(self) -> dict[str, Any]:
        """The engine's own counters (``stats()["engine"]`` adds the core's KV-reuse counters)."""
        return {}

    def stats_sections(self) -> dict[str, Any]:
        """Sections of ``stats()`` of the engine's own beside ``"engine"`` (a client's
        ``"transport"``): name -> dict."""
        return {}

    def info(self) -> dict[str, Any]:
        """What runs where, beyond the backend, model, device and vocabulary size."""
        return {}

    def close(self) -> None:
        """Release the engine (the backend calls it once, after its batchers stopped and it
        dropped every kept payload without handing it back)."""


#: what to write instead, after the error naming a missing method or an old capability
_CAPABILITY_HINTS: dict[str, str] = {
    "decode": (
        ": an engine keeping a burst's rows between steps writes both decode_step(rows, released) "
        "and end_burst(released) (a burst's end, formerly decode_step({}, released)); an engine "
        "without state between steps declares 'burst' instead and gets the core's decode step"
    ),
    "kv": (
        "; KV prefix reuse is the capability 'resume': declare it and write kv_policy() and "
        "forward_rows(rows) (docs/plugins.md)"
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
    supports = getattr(cls, "supports", ())
    if "kept_batches" in supports and "resume" not in supports:
        raise TypeError(
            f"{cls.__name__}.supports declares 'kept_batches' without 'resume': kept batches hand "
            "their KV to the core's prefix cache; declare 'resume' too (kv_policy, forward_rows)"
        )
    if "resume" not in supports and getattr(cls, "forward", None) is Engine.forward:
        raise TypeError(
            f"{cls.__name__} does not define forward(contexts): write it, or declare 'resume' "
            "and write kv_policy() and forward_rows(rows)"
        )
    if getattr(cls, "returns", "logits") not in ("logits", "logprobs"):
        raise TypeError(f"{cls.__name__}.returns must be 'logits' or 'logprobs', got {cls.returns!r}")
