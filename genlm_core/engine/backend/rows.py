"""An engine's scores as normalised rows: float32, each its caller's own.

Logits are normalised here (float32 ``log_softmax`` of the first ``vocab_size`` of each
row, padded vocabularies cut); an engine returning final rows (``returns = "logprobs"``)
keeps its own. A row no caller may read (a NaN, no finite score:
:mod:`~genlm_core.engine.row_checks`) is an :class:`EngineOutputError` in its place.
A part of :class:`~genlm_core.engine.backend.BaseLogprobBackend` (its ``rows``): the
engine, the vocabulary's size and the KV reuse it computes through are its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from genlm_core.engine import memory
from genlm_core.engine.memory import compact, private_copies
from genlm_core.engine.row_checks import EngineOutputError, row_error, unreadable_rows

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from genlm_core.engine.contract import Engine
    from genlm_core.engine.kv_calls import KVCalls

__all__ = ["Rows"]


class Rows:
    """The backend's rows of an engine's scores (see the module).

    Args:
        engine: computes the scores (``forward``, ``forward_uncached``) and says what they
            are (``returns``).
        vocab_size: the tokenizer's vocabulary: each row's width (a padded one is cut).
        name: the backend's name, for messages.
        kv_calls: where an engine that resumes from kept KV is called (None: the engine).
        cache_to_cpu: whether the output cache moves the rows it keeps to the CPU (it
            copies a batch's rows to the host in one transfer: no device copies for it).
    """

    def __init__(
        self,
        engine: Engine,
        vocab_size: int,
        name: str,
        kv_calls: KVCalls | None = None,
        cache_to_cpu: bool = False,
    ) -> None:
        self.engine = engine
        self.vocab_size = vocab_size
        self.name = name
        self.kv_calls = kv_calls
        self.cache_to_cpu = cache_to_cpu

    def logits(self, out: Any) -> "torch.Tensor":
        """An engine's logits as one ``(rows, vocab)`` float32 batch (padded vocabulary cut)."""
        import torch

        if not isinstance(out, torch.Tensor):
            out = torch.stack([torch.as_tensor(r) for r in out])
        if out.ndim == 1:
            out = out.unsqueeze(0)
        if out.shape[-1] < self.vocab_size:
            raise EngineOutputError(
                f"{self.name}: the model returned {out.shape[-1]} scores per row, "
                f"fewer than the {self.vocab_size} tokens of its tokenizer"
            )
        return out[:, : self.vocab_size].to(torch.float32)

    def finalize(self, out: Any) -> "torch.Tensor":
        """The core's normalisation of an engine's logits: the float32 ``log_softmax`` of
        :meth:`logits`' batch (no copy before it where ``out`` is that batch already)."""
        import torch

        return torch.log_softmax(self.logits(out), dim=-1)

    def compute(
        self,
        contexts: list[tuple[int, ...]],
        uncached: bool = False,
        for_cache: list["torch.Tensor"] | None = None,
    ) -> list["torch.Tensor | EngineOutputError"]:
        """The normalised row of every context, each a compact tensor of its own (not a
        view into a batch: a caller holding one row would keep the whole batch alive).

        Logits are normalised here (float32 ``log_softmax`` of the first ``vocab_size``
        of each row); an engine returning final rows (``returns = "logprobs"``) keeps its own.
        A row no caller may read (a NaN, no finite score: :mod:`~genlm_core.engine.row_checks`)
        is an :class:`EngineOutputError` in its place. ``for_cache``: filled, where the rows
        were normalised as one fresh batch, with rows nobody else holds for the output
        cache to adopt (:meth:`OutputCache.adopt_many
        <genlm_core.engine.caches.OutputCache.adopt_many>`): that batch's rows, or on a GPU a
        copy of each made in the callers' batched copy."""
        calls = self.kv_calls if self.kv_calls is not None else self.engine
        out = calls.forward_uncached(contexts) if uncached else calls.forward(contexts)
        return self.normalised(out, contexts, for_cache)

    def compute_or_raise(
        self, contexts: list[tuple[int, ...]], uncached: bool = False
    ) -> list["torch.Tensor"]:
        """:meth:`compute`, raising the first row's error (a caller that needs every row)."""
        rows = self.compute(contexts, uncached)
        for row in rows:
            if isinstance(row, EngineOutputError):
                raise row
        return rows  # type: ignore[return-value]

    def normalised(
        self,
        out: Any,
        contexts: Sequence[tuple[int, ...]],
        for_cache: list["torch.Tensor"] | None = None,
    ) -> list["torch.Tensor | EngineOutputError"]:
        """The engine's scores as normalised float32 rows, each compact (see :meth:`compute`)."""
        import torch

        copied = False  # the rows are private copies already (no compact() below)
        if self.engine.returns == "logits" and not isinstance(out, torch.Tensor):
            # rows one by one (an engine handing back each row as it comes): each row is
            # normalised into a tensor of its own, no batch and no copy after it. What is
            # checked is what a caller reads: each row cut to the vocabulary (a padded
            # column's NaN is no caller's; a finite one does not make a masked row readable)
            scores = [torch.as_tensor(r)[..., : self.vocab_size] for r in out]
            rows = self.normalised_rows(scores)
        elif self.engine.returns == "logits":
            scores = self.logits(out)
            normalised = self.finalize(scores)  # a fresh batch: nobody else holds it
            rows = list(normalised.unbind(0))
            n = len(rows)
            # each caller's row a tensor of its own, copied before _row_errors reads the
            # batch on the host: on a GPU the copies (one batched copy) are queued behind
            # the step and the host's work runs beside it, not after it
            on_gpu = normalised.device.type in memory.BATCHED_COPY_DEVICES and n > 1
            # a cache that moves rows to the CPU takes the batch's rows as they are (it copies
            # them to the host in one transfer): no device copies for it (cache_to_cpu)
            if for_cache is not None and on_gpu and not self.cache_to_cpu:
                # on a GPU the output cache gets a copy of each row too, in the same batched
                # copy: blocks of a batch's rows, long-lived and of every size, held the
                # caching allocator's large segments (bench_serve's server on an H100: 2,636
                # MB of GPU memory with blocks, 2,252 with rows), where rows pack its small pool
                copies = private_copies(rows + rows)
                rows, copied = copies[:n], True
                for_cache.extend(copies[n:])
            elif for_cache is not None:
                for_cache.extend(rows)  # the cache adopts the batch's rows; the callers get copies
                rows, copied = private_copies(rows), True
            elif on_gpu:
                rows, copied = private_copies(rows), True
        else:
            rows = list(out.unbind(0)) if hasattr(out, "unbind") else list(out)
            for row in rows:
                if tuple(row.shape) != (self.vocab_size,):
                    raise EngineOutputError(
                        f"{self.name}: the engine returned a row of shape {tuple(row.shape)}, "
                        f"not ({self.vocab_size},)"
                    )
            scores = out if isinstance(out, torch.Tensor) else rows
        if len(rows) != len(contexts):
            raise EngineOutputError(
                f"{self.name}: the engine returned {len(rows)} rows for {len(contexts)} "
                "contexts; forward() returns one row per context, in the order given"
            )
        errors = self.row_errors(scores, contexts, "forward")
        if copied:
            return [errors.get(i, r) for i, r in enumerate(rows)]
        return [errors[i] if i in errors else compact(r) for i, r in enumerate(rows)]

    def normalised_rows(self, out: Sequence["torch.Tensor"]) -> list["torch.Tensor"]:
        """Each of an engine's rows of logits normalised alone: the float32 ``log_softmax``
        of its first ``vocab_size`` scores (the kernel normalises a row alike alone or in a
        batch), each a tensor of its own."""
        import torch

        rows = []
        for row in out:
            if row.shape[-1] < self.vocab_size:
                raise EngineOutputError(
                    f"{self.name}: the model returned {row.shape[-1]} scores per row, "
                    f"fewer than the {self.vocab_size} tokens of its tokenizer"
                )
            rows.append(torch.log_softmax(row[..., : self.vocab_size].to(torch.float32), dim=-1))
        return rows

    def row_errors(
        self, scores: Any, contexts: Sequence[tuple[int, ...]], call: str
    ) -> dict[int, EngineOutputError]:
        """Row index -> its error, for every row of the engine's ``scores`` no caller may
        read (one reduction over the batch; ``{}`` for a healthy one)."""
        return {
            i: row_error(self.name, self.engine, i, contexts[i], scores[i], call)
            for i in unreadable_rows(scores)
        }

    def normalised_batch(self, out: Any, contexts: Sequence[tuple[int, ...]]) -> "torch.Tensor":
        """An engine's decode-step scores of ``contexts`` as one ``(n, vocab)`` float32 tensor
        of normalised rows (no copy where the engine returned exactly that); a row no caller
        may read raises its :class:`EngineOutputError`."""
        import torch

        if self.engine.returns == "logits":
            scores = self.logits(out)
            out = self.finalize(scores)
        else:
            if not isinstance(out, torch.Tensor):
                out = torch.stack(list(out))
            scores = out
        n = len(contexts)
        if tuple(out.shape) != (n, self.vocab_size):
            raise EngineOutputError(
                f"{self.name}: the engine's decode step returned scores of shape "
                f"{tuple(out.shape)}, not ({n}, {self.vocab_size})"
            )
        for error in self.row_errors(scores, contexts, "decode_step").values():
            raise error
        return out.to(torch.float32)
