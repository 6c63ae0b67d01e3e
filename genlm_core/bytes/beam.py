"""`ByteBeamState`: a byte-level language model over any token-level LogprobBackend.

The beam holds candidate tokenizations of the bytes read so far
(:class:`~genlm_core.bytes.state.LazyTrieState`). Reading a byte moves every
candidate down the token-byte trie, and also commits the current token of every
candidate that can end one here (extension) and reads the byte from a fresh
token. Every new context of a step is scored in one batched model call and one
batched trie call (``asyncio.gather`` over the candidates, merged by the core
AutoBatchers, so several beams advancing together share the calls too).

``logZ`` is the log probability that the model's byte stream starts with the
bytes read (exact with ``K=None, prune_threshold=0``; a lower bound otherwise).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from genlm_core.bytes.dist import EOS, EOT_INDEX, ByteDistribution, check_temperature
from genlm_core.bytes.heal import TokenHealer
from genlm_core.bytes.lm import StatefulTokenizedLM
from genlm_core.bytes.lookahead import Lookahead
from genlm_core.bytes.masses import EOSMode, mass_trie_for, mode_of
from genlm_core.bytes.params import BeamParams
from genlm_core.bytes.state import LazyTrieState
from genlm_core.engine.progress import progress_bar

__all__ = ["ByteBeamState", "BeamError", "EmptyBeamError", "TerminatedBeamError", "materialize_all"]

_LN2 = math.log(2.0)


class BeamError(ValueError):
    """The beam cannot answer the request (see the subclasses)."""


class EmptyBeamError(BeamError):
    """No candidate can read the bytes given (probability zero under the beam)."""


class TerminatedBeamError(BeamError):
    """Every candidate has consumed EOS: the sequence has ended."""


def _logsumexp(xs: Sequence[float]) -> float:
    xs = [x for x in xs if x > -math.inf]
    if not xs:
        return -math.inf
    m = max(xs)
    return m + math.log(sum(math.exp(x - m) for x in xs))


async def materialize_all(states: Sequence[LazyTrieState]) -> None:
    """Materialize ``states``: first every model call (one batch), then every trie
    call (one batch)."""
    todo = [s for s in states if not s.materialized]
    if not todo:
        return
    need_lp = [s for s in todo if s._logprobs is None]
    if need_lp:
        await asyncio.gather(*(s.fetch_logprobs() for s in need_lp))
    await asyncio.gather(*(s.materialize() for s in todo))


def _as_bytes(bs: Any, name: str = "bs") -> bytes:
    """``bs`` as ``bytes``: ``bytes``, ``bytearray`` and ``memoryview`` only.

    An ``int`` is not a byte string (``bytes(5)`` is five NUL bytes) and text has
    no bytes until it is encoded (genlm-bytes reads neither), so both raise a
    ``TypeError`` that says what to pass."""
    if isinstance(bs, bytes):
        return bs
    if isinstance(bs, (bytearray, memoryview)):
        return bytes(bs)
    if isinstance(bs, str):
        raise TypeError(
            f"{name} must be bytes, got str {bs[:40]!r}; encode the text first, e.g. {name}.encode('utf-8')"
        )
    if isinstance(bs, (int, np.integer)) and not isinstance(bs, bool):
        raise TypeError(
            f"{name} must be bytes, got int {bs!r}; to read the single byte {bs!r} pass bytes([{bs!r}]) "
            f"(or use `await (beam << {bs!r})`)"
        )
    raise TypeError(
        f"{name} must be bytes (or bytearray/memoryview), got {type(bs).__name__}; "
        "convert a sequence of byte values with bytes(...)"
    )


class ByteBeamState:
    """A beam of tokenization candidates (immutable; operations return new beams).

    Build one with ``await ByteBeamState.initial(llm, BeamParams(K=5))``.
    """

    def __init__(
        self, states: Sequence[LazyTrieState], params: BeamParams, mode: Any = EOSMode.WITH_EOS
    ) -> None:
        live = [s for s in states if s.weight > -math.inf]
        self.states: tuple[LazyTrieState, ...] = tuple(sorted(live, key=lambda s: -s.weight))
        self.params = params
        self.mode = mode_of(mode)
        self.logZ: float = _logsumexp([s.weight for s in self.states])

    # ------------------------------------------------------------------ construction
    @classmethod
    async def initial(
        cls, llm: Any, params: BeamParams | dict[str, Any] | None = None, **options: Any
    ) -> "ByteBeamState":
        """The beam before any byte: one candidate at the root, materialized.

        Args:
            llm: a LogprobBackend (``byte_vocab``, ``eos_token_ids``,
                ``next_token_logprobs``).
            params: :class:`BeamParams` (or a dict of its options); ``options``
                override single fields, e.g. ``K=None``.
        """
        if params is None:
            params = BeamParams.build(**options)
        elif isinstance(params, dict):
            params = BeamParams.build(**{**params, **options})
        elif options:
            params = BeamParams.build(**{**params.model_dump(exclude_unset=True), **options})
        eos = params.eos_tokens
        if eos is None:
            eos = tuple(llm.byte_vocab[i] for i in getattr(llm, "eos_token_ids", ()) or ())
        trie = mass_trie_for(llm, eos, params.trie)
        lm = StatefulTokenizedLM.initial(llm, params.initial_context, params.max_context_length)
        state = LazyTrieState.initial(lm, trie, EOSMode.WITH_EOS)
        await state.materialize()
        return cls([state], params)

    @classmethod
    def from_config(cls, config: BeamParams) -> Any:  # registry hook: needs an llm
        raise TypeError("use `await ByteBeamState.initial(llm, params)` (a beam needs a backend)")

    # ------------------------------------------------------------------ container
    def __iter__(self) -> Iterator[LazyTrieState]:
        return iter(self.states)

    def __len__(self) -> int:
        return len(self.states)

    def __bool__(self) -> bool:
        return True

    @property
    def terminated(self) -> bool:
        """Every candidate has consumed EOS."""
        return bool(self.states) and all(s.terminated for s in self.states)

    @property
    def trie(self) -> Any:
        return self.states[0].trie if self.states else None

    def _new(self, states: Sequence[LazyTrieState]) -> "ByteBeamState":
        return ByteBeamState(states, self.params, self.mode)

    # ------------------------------------------------------------------ stepping
    async def extend(self, logZ: float | None = None, floor: float | None = None) -> list[LazyTrieState]:
        """Commit the current token of every candidate that can end one here.

        Extensions whose share of ``logZ`` (plus the extensions' own weights) is
        at most ``prune_threshold`` are dropped; the rest are materialized in one
        batched model call and one batched trie call. ``floor`` (internal) also
        skips unmaterialized extensions whose weight is below it.
        """
        keep = self._extensions(self.logZ if logZ is None else logZ, floor)
        await materialize_all(keep)
        return keep

    def _extensions(self, logZ: float, floor: float | None) -> list[LazyTrieState]:
        """The extensions :meth:`extend` keeps (no model call)."""
        cands = [e for s in self.states for e in s.extend()]
        for e in cands:
            logZ = float(np.logaddexp(logZ, e.weight))
        thr = self.params.log_prune_threshold
        keep = [e for e in cands if e.weight - logZ > thr]
        if floor is not None:
            keep = [e for e in keep if e.materialized or e.weight >= floor]
        return keep

    def _moved(self, a: int, keep_k: int | None) -> tuple[list[LazyTrieState], float, float | None]:
        """The candidates after reading ``a`` without a new token, their ``logZ``, and
        the weight an extension must reach to matter when only ``keep_k`` survive."""
        new_states = [t for s in self.states if (t := s << a) is not None]
        logZ = _logsumexp([s.weight for s in new_states])
        floor = None
        if keep_k is not None and len(new_states) >= keep_k:
            floor = sorted((s.weight for s in new_states), reverse=True)[keep_k - 1]
        return new_states, logZ, floor

    async def _pending(self, a: int, keep_k: int | None) -> list[LazyTrieState]:
        """The contexts ``_advance(a, keep_k)`` will ask the model for."""
        await materialize_all(self.states)
        _, logZ, floor = self._moved(a, keep_k)
        return [e for e in self._extensions(logZ, floor) if not e.materialized]

    async def __lshift__(self, a: int) -> "ByteBeamState":
        """The beam after reading byte ``a`` (0-255, or ``257`` = EOS). An empty
        result (``logZ == -inf``) means no candidate could read it; a beam that
        has consumed EOS raises :class:`TerminatedBeamError`."""
        return await self._advance(a, None)

    async def _advance(self, a: int, keep_k: int | None) -> "ByteBeamState":
        """``self << a``; with ``keep_k`` the caller only needs the ``keep_k`` best
        candidates of the result (exactly), so an extension that cannot beat the
        ``keep_k``-th candidate already known is not scored (reading a byte never
        raises a weight)."""
        a = _check_symbol(a)
        self._check_not_terminated(f"read byte {a}")
        await materialize_all(self.states)
        new_states, logZ, floor = self._moved(a, keep_k)
        for e in await self.extend(logZ, floor):
            t = e << a
            if t is not None:
                new_states.append(t)
        new = self._new(new_states)
        if not new.states and self.params.heal and a != EOS:
            healed = await self._heal(a)
            if healed is not None:
                if self.params.verbose:
                    print("[heal] applied adaptive token healing")
                new = healed
        if self.params.verbose:
            print(new.pretty())
        return new

    async def _heal(self, a: int) -> "ByteBeamState | None":
        healer = TokenHealer(self.params.heal_max_backoff, self.params.heal_max_splits, self.params.verbose)
        for s in self.states:
            h = await healer.try_heal(s, a)
            if h is not None:
                return self._new([h])
        return None

    def _check_not_terminated(self, what: str) -> None:
        if self.terminated:
            raise TerminatedBeamError(
                f"cannot {what}: every candidate has consumed EOS, the sequence has ended "
                "(start again from a beam before EOS)"
            )

    async def logp_next(self) -> ByteDistribution:
        """Distribution of the next byte (0-255) or EOS (257) given the bytes read.

        The end-of-token entry (``dist[None]``) is always ``-inf`` at the beam
        level: token boundaries are summed out. Raises :class:`EmptyBeamError`
        for an empty beam and :class:`TerminatedBeamError` once every candidate
        has consumed EOS (never NaN).
        """
        if not self.states:
            raise EmptyBeamError("the beam is empty: no tokenization of the bytes read has non-zero weight")
        live = [s for s in self.states if not s.terminated]
        if not live:
            raise TerminatedBeamError("every candidate has consumed EOS: the sequence has ended")
        await materialize_all(live)
        rows = [s.logp_next.ps + s.weight for s in live]
        for e in await self.extend(_logsumexp([s.weight for s in live])):
            rows.append(e.logp_next.ps + e.weight)
        q = np.stack(rows)
        q[:, EOT_INDEX] = -np.inf
        logps = np.logaddexp.reduce(q, axis=0)
        Z = _logsumexp(logps.tolist())
        if Z == -math.inf:
            raise EmptyBeamError("no candidate can read any further byte")
        return ByteDistribution(logps - Z)

    def prune(self) -> "ByteBeamState":
        """Keep the candidates whose share of the mass exceeds ``prune_threshold``,
        at most ``K`` of them (``K=None``: no limit)."""
        thr = self.params.log_prune_threshold
        keep = [s for s in self.states if s.weight - self.logZ > thr]
        if self.params.K is not None:
            keep = keep[: self.params.K]
        return self._new(keep)

    def with_mode(self, mode: Any) -> "ByteBeamState":
        """The beam read in another EOS mode (``EOSMode.WITH_EOS``: EOS tokens end
        the sequence; ``WITHOUT_EOS``: ordinary tokens). Exact, no model call."""
        mode = mode_of(mode)
        return ByteBeamState([s.with_mode(mode) for s in self.states], self.params, mode)

    # ------------------------------------------------------------------ sequences
    async def _prefill_without_eos(self, bs: bytes, bar: Any = None) -> "ByteBeamState":
        if bs:
            self._check_not_terminated(f"read {bs[:20]!r}")
        beam = self.with_mode(EOSMode.WITHOUT_EOS)
        # Before the last byte, only the K best candidates survive the next prune():
        # extensions that cannot reach them are skipped (same beam, fewer model
        # calls). Exact only without a probability threshold, which depends on logZ.
        K = self.params.K if self.params.prune_threshold == 0 else None
        last = len(bs) - 1
        look = None
        # one candidate (K=1) follows a single path, token after token: nothing to overlap
        if self.params.lookahead and self.params.K != 1 and len(bs) > 1 and beam.states:
            trie = beam.states[0].trie
            rows = getattr(getattr(beam.states[0].lm.model, "config", None), "batch_size", None)
            look = Lookahead(
                trie.token_index(),
                bs,
                horizon=self.params.lookahead,
                width=self.params.lookahead_width,
                margin=self.params.lookahead_margin,
                max_rows=rows if isinstance(rows, int) and rows > 0 else 32,
            )
        for i, b in enumerate(bs):
            pruned = beam.prune()
            keep_k = K if i < last else None
            if look is not None:
                await look.before(pruned.states, i, await pruned._pending(b, keep_k))
            beam = await pruned._advance(b, keep_k)
            if bar is not None:
                bar.update(1)
            if not beam.states:
                break
        return beam

    async def prefill(self, bs: bytes, *, progress: bool = False) -> "ByteBeamState":
        """Read ``bs`` (``bytes``, ``bytearray`` or ``memoryview``; text must be
        encoded first), pruning before each byte. EOS tokens are ordinary tokens
        while prefilling; the result is back in this beam's mode. Raises
        :class:`TerminatedBeamError` on a beam that has consumed EOS. ``progress``
        shows a bar of the bytes read on stderr."""
        beam = await self._read(_as_bytes(bs), "reading bytes", progress)
        return beam.with_mode(self.mode)

    async def _read(self, data: bytes, what: str, progress: bool) -> "ByteBeamState":
        """``_prefill_without_eos(data)`` with a progress bar labelled ``what``."""
        bar = progress_bar(len(data), what, "byte", show=progress)
        try:
            return await self._prefill_without_eos(data, bar)
        finally:
            bar.close()

    async def log_prefix_prob(self, bs: bytes, *, progress: bool = False) -> float:
        """``log P(bs | bytes read so far)``: the log probability that the model's
        byte stream continues with ``bs`` (EOS tokens are ordinary tokens)."""
        after = await self._read(_as_bytes(bs), "scoring bytes", progress)
        return after.logZ - self.with_mode(EOSMode.WITHOUT_EOS).logZ

    async def bits_per_byte(self, bs: bytes, *, progress: bool = False) -> float:
        """``-log2 P(bs | bytes read so far) / len(bs)`` (``bs`` as in :meth:`prefill`)."""
        data = _as_bytes(bs)
        if not data:
            raise ValueError("bits_per_byte of an empty byte string")
        return -(await self.log_prefix_prob(data, progress=progress)) / (len(data) * _LN2)

    async def _generate(
        self,
        context: bytes,
        n: int,
        choose: Callable[[ByteDistribution], int | None],
        progress: bool = False,
    ) -> bytes:
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be a non-negative int, got {n!r}")
        ctx = _as_bytes(context, "context")
        state = await self.prefill(ctx, progress=progress)
        out = bytearray()
        bar = progress_bar(n, "generating bytes", "byte", show=progress)
        for _ in range(n):
            state = state.prune()
            if not state.states:
                break
            q = await state.logp_next()
            b = choose(q)
            if b is None or b == EOS:
                break
            state = await (state << b)
            out.append(b)
            bar.update(1)
        bar.close()
        return ctx + bytes(out)

    async def greedy(self, context: bytes = b"", n: int = 32, *, progress: bool = False) -> bytes:
        """``context`` followed by up to ``n`` most probable bytes; stops at EOS.
        The context is read once (after the bytes this beam has read). ``progress``
        shows bars of the context's bytes read and of the bytes generated on stderr."""
        return await self._generate(context, n, lambda q: q.argmax(), progress)

    async def sample(
        self,
        context: bytes = b"",
        n: int = 32,
        seed: int | None = None,
        temperature: float = 1.0,
        *,
        draw: Callable[[ByteDistribution], int | None] | None = None,
        progress: bool = False,
    ) -> bytes:
        """``context`` followed by up to ``n`` sampled bytes; stops at EOS.
        ``seed`` makes the draw reproducible; ``temperature`` is a finite number
        >= 0 (0: greedy); ``draw``, a function of the next byte's distribution returning
        the byte (or EOS, or None: stop), replaces the seeded draw; ``progress`` as in
        :meth:`greedy`."""
        t = check_temperature(temperature)
        if draw is None:
            rng = np.random.default_rng(seed)
            draw = lambda q: q.sample(rng, t)  # noqa: E731
        return await self._generate(context, n, draw, progress)

    @staticmethod
    async def advance_batch(
        beams: Sequence["ByteBeamState"], next_bytes: Sequence[int]
    ) -> list["ByteBeamState"]:
        """Prune and advance several beams concurrently (their calls are batched)."""
        if len(beams) != len(next_bytes):
            raise ValueError("beams and next_bytes must have the same length")
        return list(await asyncio.gather(*(b.prune() << x for b, x in zip(beams, next_bytes))))

    # ------------------------------------------------------------------ lifecycle
    async def cleanup(self) -> None:
        """Drop memoized extensions of the candidates (the shared trie and the
        backend stay open: they belong to the backend)."""
        for s in self.states:
            s.forget()

    async def __aenter__(self) -> "ByteBeamState":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.cleanup()

    # ------------------------------------------------------------------ display
    def pretty(self, k: int = 10) -> str:
        lines = [f"logZ: {self.logZ:.4f}  candidates: {len(self.states)}"]
        for s in self.states[:k]:
            p = math.exp(s.weight - self.logZ) if self.logZ > -math.inf else 0.0
            lines.append(f"  ({p:.4f}) {s!r}")
        if len(self.states) > k:
            lines.append(f"  ... {len(self.states) - k} more")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<ByteBeamState logZ={self.logZ:.4f} candidates={len(self.states)} mode={self.mode.value}>"


def _check_symbol(a: Any) -> int:
    if isinstance(a, bool) or not isinstance(a, (int, np.integer)):
        raise TypeError(f"a beam reads one byte (int 0-255) or EOS (257), got {a!r}")
    a = int(a)
    if not (0 <= a <= 255 or a == EOS):
        raise ValueError(f"a beam reads one byte (0-255) or EOS (257), got {a}")
    return a
