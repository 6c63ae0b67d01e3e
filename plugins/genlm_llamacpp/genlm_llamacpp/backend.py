"""LlamaCppBackend: genlm-core's LogprobBackend on llama.cpp, reading GGUF files directly.

Importing this module does not import llama_cpp; creating a backend does.

* ``_forward`` computes many contexts per engine call: every context gets a KV
  sequence of its own, its new tokens go into one ``llama_decode`` batch (split in
  ``n_batch``-token decodes when longer) and the logits of its last position are read.
* KV prefix reuse: each computed context keeps its sequence, recorded in the core
  :class:`~genlm_core.prefix_cache.PrefixCache` (the payload is the sequence id; its
  size is its token count, bounded by ``kv_cache_tokens``). A later context copies the
  sequence of its deepest cached proper prefix (``llama_memory_seq_cp``: the unified
  KV cache shares the cells) and computes only its remaining tokens, so a particle's
  one-token extension computes one token. Sequences are evicted least recently used
  first when the cache's token budget, the ``n_seq_max`` sequences or the ``n_ctx``
  cells run out; an evicted sequence is removed from llama.cpp (``seq_rm``).
* The byte vocabulary comes from the GGUF's tokenizer (:mod:`genlm_llamacpp.tokenizer`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from genlm_core.backend import BaseLogprobBackend
from genlm_core.config import ConfigError
from genlm_core.prefix_cache import PrefixCache
from genlm_core.progress import note
from genlm_llamacpp.config import LlamaCppConfig

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import torch

    from genlm_llamacpp.engine import Engine

__all__ = ["LlamaCppBackend", "resolve_gguf"]


@dataclass(eq=False)
class _Seq:
    """A KV sequence of the llama.cpp context holding the first ``n_tokens`` of a prefix."""

    seq_id: int
    n_tokens: int


class LlamaCppBackend(BaseLogprobBackend):
    """Batched, prefix-reusing next-token log-probabilities from a GGUF model on llama.cpp."""

    config_class = LlamaCppConfig
    backend_name = "llamacpp"
    config: LlamaCppConfig

    def __init__(self, engine: "Engine", config: LlamaCppConfig | None = None) -> None:
        from genlm_llamacpp.tokenizer import GGUFTokenizer, byte_vocab

        self.engine = engine
        vocab, strs = byte_vocab(engine)
        tokenizer = GGUFTokenizer(engine, vocab)
        super().__init__(
            tokenizer, config or LlamaCppConfig(), byte_vocab=vocab, str_vocab=strs,
            eos_token_ids=tokenizer.eos_token_ids,
        )  # fmt: skip
        self._free: list[int] = list(range(engine.n_seq_max))
        budget = self.config.kv_cache_tokens
        self.prefix_cache: PrefixCache | None = None
        if budget != 0:
            self.prefix_cache = PrefixCache(
                kv_budget_bytes=budget,  # in tokens: sizeof counts a sequence's tokens
                sizeof=lambda seq: seq.n_tokens,
                on_evict_kv=self._release,
            )
        self.forward_calls = 0
        self.decode_calls = 0
        self.tokens_computed = 0
        self.tokens_reused = 0

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, config: LlamaCppConfig) -> "LlamaCppBackend":  # type: ignore[override]
        config.check_model()
        path = resolve_gguf(config.model, config.gguf_file)
        note(f"llamacpp: loading {path}")
        from genlm_llamacpp.engine import Engine

        engine = Engine(
            path,
            n_ctx=config.n_ctx,
            n_seq_max=config.n_seq_max,
            n_batch=config.n_batch,
            n_threads=config.n_threads,
            n_gpu_layers=config.n_gpu_layers,
            kv_cache_type=config.kv_cache_type,
            dtype=config.dtype,
            flash_attn=config.flash_attn,
        )
        return cls(engine, config)

    # ------------------------------------------------------------------ engine hooks
    @property
    def max_context_length(self) -> int:
        return self.engine.max_context

    @property
    def dtype(self) -> str:
        """The precision of the KV cache and attention (activations are float32; the
        weights are the GGUF's own, :attr:`weights_type`). A q8_0 cache reads as float16."""
        return {"f32": "float32", "bf16": "bfloat16"}.get(self.engine.kv_cache_type, "float16")

    @property
    def weights_type(self) -> str:
        """The GGUF's weight type as llama.cpp names it: ``"F32"``, ``"F16"``, ``"Q4_1"``..."""
        return self.engine.weights_type

    def _forward_in_thread(self) -> bool:
        return False  # llama.cpp computes on every core already

    def _forward(self, contexts: list[tuple[int, ...]]) -> "torch.Tensor":
        return self._run(contexts, reuse=self.prefix_cache is not None)

    def _forward_uncached(self, contexts: list[tuple[int, ...]]) -> "torch.Tensor":
        return self._run(contexts, reuse=False)

    def _forward_rows(self, contexts: list[tuple[int, ...]]) -> "list[torch.Tensor]":
        """Each row normalised straight from llama.cpp's output buffer into a tensor of
        its own: no logits copy, no batch tensor, no per-row copy out of it (the
        default path's three batch-sized copies). The same float32 ``log_softmax``."""
        import torch

        unique = list(dict.fromkeys(contexts))
        rows: list[torch.Tensor] = []
        vocab = self.vocab_size

        def emit(logits: "np.ndarray") -> None:
            rows.append(torch.log_softmax(torch.from_numpy(logits[:vocab]), dim=-1))

        self._compute(unique, self.prefix_cache is not None, emit)
        if len(unique) == len(contexts):
            return rows
        first = dict(zip(unique, rows))
        seen: set[tuple[int, ...]] = set()
        out = []
        for c in contexts:  # a repeated context gets a copy of its own
            out.append(first[c].clone() if c in seen else first[c])
            seen.add(c)
        return out

    def _run(self, contexts: list[tuple[int, ...]], reuse: bool) -> "torch.Tensor":
        """Logits (float32, ``(len(contexts), n_vocab)``), copied once out of llama.cpp."""
        import numpy as np
        import torch

        unique = list(dict.fromkeys(contexts))
        out = np.empty((len(unique), self.engine.n_vocab), dtype=np.float32)
        filled = 0

        def emit(logits: "np.ndarray") -> None:
            nonlocal filled
            out[filled] = logits
            filled += 1

        self._compute(unique, reuse, emit)
        if len(unique) != len(contexts):
            where = {c: i for i, c in enumerate(unique)}
            out = out[[where[c] for c in contexts]]
        return torch.from_numpy(out)

    def _compute(
        self, unique: list[tuple[int, ...]], reuse: bool, emit: "Callable[[np.ndarray], None]"
    ) -> None:
        """Compute distinct contexts in groups; ``emit`` gets each one's logits in order
        (a view of llama.cpp's buffer, valid only during the call)."""
        self.forward_calls += 1
        for chunk in self._chunks(unique):
            self._run_chunk(chunk, reuse, emit)

    def _chunks(self, contexts: list[tuple[int, ...]]) -> list[list[tuple[int, ...]]]:
        """Groups computed together: at most half the sequences (the other half can hold
        their cached sources) and at most ``n_ctx`` tokens counted in full, so a group
        always fits the KV cells once the cache has made room."""
        most = max(1, self.engine.n_seq_max // 2)
        chunks: list[list[tuple[int, ...]]] = []
        tokens = 0
        for c in contexts:
            if not chunks or len(chunks[-1]) >= most or tokens + len(c) > self.engine.n_ctx:
                chunks.append([])
                tokens = 0
            chunks[-1].append(c)
            tokens += len(c)
        return chunks

    def _run_chunk(
        self, chunk: list[tuple[int, ...]], reuse: bool, emit: "Callable[[np.ndarray], None]"
    ) -> None:
        from genlm_llamacpp.engine import Row

        cache = self.prefix_cache
        sources: list[tuple[int, _Seq | None]] = [
            cache.deepest_kv(c, max_depth=len(c) - 1) if reuse and cache is not None else (0, None)
            for c in chunk
        ]
        protected = {id(src) for _, src in sources if src is not None}
        dsts: list[int] = []
        try:
            for _ in chunk:
                dsts.append(self._take_seq(protected))
            rows: list[Row] = []
            for c, (depth, src), dst in zip(chunk, sources, dsts):
                if src is not None:
                    self.engine.seq_copy(src.seq_id, dst, depth)
                last = len(c) - 1
                rows.extend(Row(c[p], p, dst, p == last) for p in range(depth, len(c)))
                self.tokens_reused += depth
            self.tokens_computed += len(rows)
            step = self.engine.n_batch
            for start in range(0, len(rows), step):
                for logits in self._decode(rows[start : start + step]):
                    emit(logits)
        except BaseException:
            for dst in dsts:
                self._release(_Seq(dst, 0))
            raise
        for c, dst in zip(chunk, dsts):
            if (
                reuse
                and cache is not None
                and (cache.kv_budget_bytes is None or len(c) <= cache.kv_budget_bytes)
            ):
                cache.insert(c, kv=_Seq(dst, len(c)))  # may evict (and release) older sequences
            else:
                self._release(_Seq(dst, 0))

    def _decode(self, rows: list[Any]) -> "np.ndarray":
        """``Engine.decode`` (a view of llama.cpp's logits), evicting cached sequences
        while the KV cells are full."""
        from genlm_llamacpp.engine import NoKVSpace

        while True:
            try:
                self.decode_calls += 1
                return self.engine.decode(rows)
            except NoKVSpace:
                if self.prefix_cache is None or self.prefix_cache.evict_lru_kv() is None:
                    raise RuntimeError(
                        f"llamacpp: the {self.engine.n_ctx} KV cells (n_ctx) cannot hold this batch "
                        "even with every cached prefix evicted; raise n_ctx or lower batch_size"
                    ) from None

    def _take_seq(self, protected: set[int]) -> int:
        """A free sequence id, evicting the least recently used unprotected cached one."""
        if not self._free and self.prefix_cache is not None:
            self.prefix_cache.evict_lru_kv(keep=lambda seq: id(seq) in protected)
        if not self._free:  # pragma: no cover - _chunks leaves room by construction
            raise RuntimeError(f"llamacpp: all {self.engine.n_seq_max} KV sequences (n_seq_max) are in use")
        return self._free.pop()

    def _release(self, seq: _Seq) -> None:
        """Remove a sequence's KV from llama.cpp and make its id free (PrefixCache's ``on_evict_kv``)."""
        self.engine.seq_remove(seq.seq_id)
        self._free.append(seq.seq_id)

    def _clear_engine_cache(self) -> None:
        with self.batcher.model_lock:
            if self.prefix_cache is not None:
                self.prefix_cache.clear()  # releases every sequence
            self.engine.clear()
            self._free = list(range(self.engine.n_seq_max))

    def _close_engine(self) -> None:
        with self.batcher.model_lock:
            if self.prefix_cache is not None:
                self.prefix_cache.on_evict_kv = None
                self.prefix_cache.clear()
            self.engine.close()

    # ------------------------------------------------------------------ extras
    def stats(self) -> dict[str, Any]:
        out = super().stats()
        if self.prefix_cache is not None:
            out["prefix_cache"] = self.prefix_cache.stats()
        out["engine"] = {
            "forward_calls": self.forward_calls,
            "decode_calls": self.decode_calls,
            "tokens_computed": self.tokens_computed,
            "tokens_reused": self.tokens_reused,
            "free_sequences": len(self._free),
            "n_ctx": self.engine.n_ctx,
            "n_seq_max": self.engine.n_seq_max,
            "weights_type": self.engine.weights_type,
            "kv_cache_type": self.engine.kv_cache_type,
        }
        return out


def resolve_gguf(model: str | None, gguf_file: str | None) -> str:
    """The local path of the GGUF file ``model`` (and ``gguf_file``) name.

    ``model`` may be the file, a folder holding it (``gguf_file`` names it when the
    folder holds several), or a hub id with ``gguf_file`` (downloaded by
    ``huggingface_hub``). ``None`` is the embedded SmolLM2-135M-Instruct Q4_1 GGUF.
    """
    if model is None:
        from genlm_core.embedded import smollm2_gguf_path

        return str(smollm2_gguf_path())
    path = os.path.expanduser(model)
    if os.path.isfile(path):
        if gguf_file is not None:
            raise ConfigError(
                f"llamacpp: model {model!r} is a file; gguf_file={gguf_file!r} names no file in it"
            )
        if not path.lower().endswith(".gguf"):
            raise ConfigError(
                f"llamacpp: model {model!r} is not a .gguf file; give a GGUF file or its folder"
            )
        return path
    if os.path.isdir(path):
        if gguf_file is not None:
            candidate = os.path.join(path, gguf_file)
            if not os.path.isfile(candidate):
                raise ConfigError(f"llamacpp: gguf_file={gguf_file!r} is not in the folder {model!r}")
            return candidate
        found = sorted(f for f in os.listdir(path) if f.lower().endswith(".gguf"))
        if len(found) != 1:
            what = f"holds {len(found)} .gguf files ({', '.join(found)})" if found else "holds no .gguf file"
            raise ConfigError(f"llamacpp: the folder {model!r} {what}; name one with gguf_file=...")
        return os.path.join(path, found[0])
    if gguf_file is None:
        raise ConfigError(
            f"llamacpp: model {model!r} is not a local file or folder; for a hub repository name the "
            "file too, e.g. load('llamacpp', model='org/repo', gguf_file='model.Q4_K_M.gguf')"
        )
    from huggingface_hub import hf_hub_download

    try:
        return hf_hub_download(model, gguf_file)
    except Exception as exc:  # noqa: BLE001 - the hub's errors vary by version
        raise ConfigError(f"llamacpp: could not fetch {gguf_file!r} from {model!r}: {exc}") from exc
