"""genlm-bytes' API (``genlm.bytes``) on genlm-core's byte beam (genlm-compat)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from genlm.backend._guard import warn_if_real
from genlm.backend._surface import public_dir  # noqa: E402
from genlm.bytes.trie import AsyncTokenByteTrie, TokenByteTrie
from genlm.bytes.util import Chart, LazyByteProbs

from genlm_core.bytes import (
    EOS,
    EOT,
    LazyTrieState,
    TrieMode,
)
from genlm_core.bytes import BeamParams as _CoreBeamParams
from genlm_core.bytes import ByteBeamState as _CoreByteBeamState
from genlm_core.bytes import StatefulTokenizedLM as _CoreStatefulTokenizedLM

warn_if_real("genlm-bytes", "genlm.bytes")

__all__ = [
    "EOS",
    "EOT",
    "AsyncTokenByteTrie",
    "BeamParams",
    "ByteBeamState",
    "Chart",
    "LazyTrieState",
    "StatefulTokenizedLM",
    "TokenByteTrie",
    "TrieMode",
]

_POSITIONAL = ("K", "prune_threshold", "verbose", "eos_byte_strings", "heal", "heal_max_backoff",
               "heal_max_splits", "eos_tokens")  # fmt: skip


class BeamParams(_CoreBeamParams):
    """genlm-bytes' ``BeamParams(K, prune_threshold=0.0, verbose=False, eos_byte_strings=None,
    heal=True, heal_max_backoff=None, heal_max_splits=None, eos_tokens=None)``, positional
    as there (``eos_tokens``: the deprecated alias). ``None`` means no EOS tokens
    (genlm-core's own ``BeamParams`` takes the backend's then); a lone str or bytes is
    one token, never split into characters."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if len(args) > len(_POSITIONAL):
            raise TypeError(
                f"BeamParams takes at most {len(_POSITIONAL)} positional arguments ({len(args)} given)"
            )
        for name, value in zip(_POSITIONAL, args):
            if name in kwargs:
                raise TypeError(f"BeamParams got multiple values for argument {name!r}")
            kwargs[name] = value
        if "K" not in kwargs:
            raise TypeError("BeamParams missing required argument: 'K'")
        eos = kwargs.pop("eos_byte_strings", None)
        old = kwargs.pop("eos_tokens", None)
        if old is not None:
            if eos is not None:
                raise TypeError("Cannot specify both 'eos_byte_strings' and the deprecated 'eos_tokens'.")
            warnings.warn(
                "'eos_tokens' is deprecated, use 'eos_byte_strings' instead.",
                DeprecationWarning,
                stacklevel=2,
            )
            eos = old
        super().__init__(eos_tokens=() if eos is None else eos, **kwargs)

    @property
    def eos_byte_strings(self) -> set[bytes]:  # type: ignore[override]
        """The EOS tokens' byte strings (a set, as in genlm-bytes)."""
        return set(self.eos_tokens or ())


class StatefulTokenizedLM(_CoreStatefulTokenizedLM):
    """genlm-bytes' ``StatefulTokenizedLM(model, context, n_calls=0, max_context_length=None)``:
    ``n_calls`` (genlm-bytes' private count of the model's calls) is taken and not kept."""

    __slots__ = ()

    def __init__(
        self, model: Any, context: Any, n_calls: int = 0, max_context_length: int | None = None
    ) -> None:
        super().__init__(model, context, max_context_length)


#: genlm-bytes' ``trie_opts`` (``TokenByteTrie`` keywords) and what each becomes here
_TRIE_OPTS = ("device", "max_batch_size", "eot_sentinel", "atomic_byte_strings", "eos_byte_strings")


class ByteBeamState(_CoreByteBeamState):
    """genlm-core's byte beam with genlm-bytes' ``initial(llm, params, trie_opts=None)``;
    ``logp_next()`` gives a :class:`~genlm.bytes.util.LazyByteProbs`."""

    @classmethod
    async def initial(cls, llm: Any, params: Any, trie_opts: dict | None = None) -> Any:  # type: ignore[override]
        """``trie_opts`` are genlm-bytes' ``TokenByteTrie`` keywords: ``device="cuda"``
        runs the beam's trie on genlm-core's torch trie; ``max_batch_size`` and
        ``eot_sentinel`` change nothing the beam shows (genlm-core sizes its own
        batches); ``eos_byte_strings`` is overridden by ``params``, as in genlm-bytes;
        ``atomic_byte_strings`` raises (genlm-core's beam has no atomic tokens)."""
        opts = dict(trie_opts or {})
        unknown = sorted(set(opts) - set(_TRIE_OPTS))
        if unknown:
            raise TypeError(f"TokenByteTrie.__init__() got an unexpected keyword argument {unknown[0]!r}")
        if opts.get("atomic_byte_strings"):
            raise ValueError(
                "trie_opts atomic_byte_strings: genlm-core's byte beam reads every token byte by byte; "
                "remove the option"
            )
        device = opts.get("device")
        if device not in (None, "cpu", "cuda"):
            raise ValueError(f"Invalid device: {device}. Must be 'cpu', 'cuda' or None")
        size = opts.get("max_batch_size", 64)
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"trie_opts max_batch_size must be an int >= 1, got {size!r}")
        if device == "cuda" and params.trie is None:
            params = type(params)(**{**params.model_dump(exclude_unset=True), "trie": "torch"})
        return await super().initial(llm, params)

    def _new(self, states: Any) -> "ByteBeamState":
        return type(self)(states, self.params, self.mode)

    def with_mode(self, mode: Any) -> "ByteBeamState":
        beam = super().with_mode(mode)
        return type(self)(beam.states, beam.params, beam.mode)

    async def logp_next(self) -> LazyByteProbs:  # type: ignore[override]
        return LazyByteProbs((await super().logp_next()).ps)

    async def greedy(self, context: bytes, steps: int) -> bytes:  # type: ignore[override]
        """genlm-bytes' ``greedy(context, steps)``: ``context`` read, then the most probable
        byte ``steps`` times; it stops early at EOS (genlm-bytes fails there: EOS is no byte)."""
        return await super().greedy(context, steps)

    async def sample(  # type: ignore[override]
        self, context: bytes, steps: int, draw: Callable[[Chart], Any] | None = None
    ) -> bytes:
        """genlm-bytes' ``sample(context, steps, draw=sample_dict)``: ``draw`` gets a
        :class:`~genlm.bytes.util.Chart` of the next entry's probabilities and returns its
        key; without one, numpy's global generator seeds genlm-core's draw (so
        ``np.random.seed`` repeats a run, as with arsenal's ``sample_dict``). It stops early
        at EOS, like :meth:`greedy`."""
        if draw is None:
            return await super().sample(context, steps, seed=int(np.random.randint(2**32)))
        return await super().sample(context, steps, draw=lambda q: draw(q.materialize().map_values(np.exp)))


__dir__ = public_dir(__name__)  # the API only, as the reference lists it
