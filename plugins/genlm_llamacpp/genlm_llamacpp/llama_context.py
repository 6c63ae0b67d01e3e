"""A thin layer over llama.cpp's C API (llama-cpp-python's ctypes bindings).

One model, one context with a *unified* KV cache of ``n_ctx`` cells shared by up to
``n_seq_max`` sequences (copying a sequence's prefix to another sequence shares its
cells: ``llama_memory_seq_cp`` is bookkeeping, not a copy), one reusable
``llama_batch`` of ``n_batch`` tokens. Imports llama_cpp (the shared library).
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

import llama_cpp as L
import numpy as np

from genlm_core.registry.hardware import host_memory
from genlm_llamacpp.cpu_buffers import extra_buffers_choice

__all__ = ["LlamaContext", "NoKVSpace", "Row", "default_kv_cells", "kv_cell_bytes", "kv_type_for"]

_backend_ready = False

#: ggml type ids of the KV cache types the config offers (ggml.h ``enum ggml_type``)
KV_TYPES = {"f32": 0, "f16": 1, "q8_0": 8, "bf16": 30}


def kv_type_for(dtype: str, weights_type: str) -> str:
    """The KV cache type ``dtype`` means for a GGUF whose weights are ``weights_type``."""
    if dtype == "auto":  # the checkpoint's own precision
        return {"F32": "f32", "BF16": "bf16"}.get(weights_type, "f16")
    return {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}[dtype]


#: bytes of one KV entry per value of each cache type (q8_0: 34 bytes a block of 32)
KV_TYPE_BYTES = {"f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32}
#: default KV cells per sequence: 256 particles extending a 4,096-token prompt by 200
#: tokens each (55,296 cells) fit in n_seq_max=256 sequences' 65,536 cells
CELLS_PER_SEQUENCE = 256


def kv_cell_bytes(model: object, kv_cache_type: str) -> int:
    """Bytes of one token's keys and values over every layer of ``model``."""
    layers = int(L.llama_model_n_layer(model))
    heads = max(1, int(L.llama_model_n_head(model)))
    kv_heads = int(L.llama_model_n_head_kv(model)) or heads
    head_dim = int(L.llama_model_n_embd(model)) // heads
    return int(2 * layers * kv_heads * head_dim * KV_TYPE_BYTES[kv_cache_type])


def default_kv_cells(n_ctx: int, n_seq_max: int, cell_bytes: int, memory: int | None = None) -> int:
    """``kv_cells=None``: :data:`CELLS_PER_SEQUENCE` cells per sequence (the prompt particles
    share held once, every particle's own tokens), at least ``n_ctx``, and at most a quarter
    of the machine's memory (llama.cpp zeroes its whole KV buffer at load, so the cells are
    resident from the start; genlm-hf's ``kv_cache_bytes="auto"`` bound is that quarter too)."""
    want = max(n_ctx, n_seq_max * CELLS_PER_SEQUENCE)
    if memory is None:
        memory = host_memory()
    most = memory // 4 // max(1, cell_bytes)
    return max(n_ctx, min(want, most))


class NoKVSpace(RuntimeError):
    """llama_decode found no free KV cells for the batch (return code 1)."""


@dataclass(frozen=True)
class Row:
    """One token of a batch: its id, position, KV sequence and whether its logits are read."""

    token: int
    pos: int
    seq: int
    logits: bool


class LlamaContext:
    """A llama.cpp model and context. Not thread-safe: callers hold one lock."""

    def __init__(
        self,
        path: str,
        *,
        n_ctx: int | None,
        n_seq_max: int,
        kv_cells: int | None = None,
        batch_invariant: bool = False,
        n_batch: int,
        n_threads: int | None,
        n_gpu_layers: int,
        kv_cache_type: str | None = None,
        dtype: str = "auto",
        flash_attn: bool | None = None,
        extra_buffers: bool | None = None,
    ) -> None:
        global _backend_ready
        logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # its load chatter
        if not _backend_ready:
            L.llama_backend_init()
            _backend_ready = True
        #: llama.cpp's build and CPU features ("CPU : SSE3 = 1 | ... | AMX_INT8 = 1 | ...")
        self.system_info = L.llama_print_system_info().decode(errors="replace").strip()
        #: weights may go to llama.cpp's extra CPU buffer types (AMX, REPACK), and why
        self.extra_buffers, self.extra_buffers_reason = extra_buffers_choice(extra_buffers, self.system_info)
        mparams = L.llama_model_default_params()
        mparams.n_gpu_layers = n_gpu_layers
        mparams.use_extra_bufts = self.extra_buffers
        self.model = L.llama_model_load_from_file(path.encode(), mparams)
        if not self.model:
            raise ValueError(f"llamacpp: llama.cpp could not load the GGUF file {path!r}")
        desc = ctypes.create_string_buffer(256)
        L.llama_model_desc(self.model, desc, len(desc))
        #: the GGUF's weight type as llama.cpp names it ("F32", "F16", "Q4_1", ...)
        self.weights_type = desc.value.decode(errors="replace").split(" ", 2)[-1].removeprefix("all ")
        #: weights below 16 bits: their kernels re-quantise the activations (to 8 bits)
        self.quantized = self.weights_type.upper() not in ("F32", "F16", "BF16")
        if kv_cache_type is None:
            kv_cache_type = kv_type_for(dtype, self.weights_type)
        self.kv_cache_type = kv_cache_type
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = int(L.llama_vocab_n_tokens(self.vocab))
        self.n_ctx_train = int(L.llama_model_n_ctx_train(self.model))
        if n_ctx is None:
            n_ctx = min(self.n_ctx_train, 4096) if self.n_ctx_train > 0 else 4096
        #: every context computed alone (LlamaCppConfig.batch_invariant)
        self.batch_invariant = batch_invariant
        #: bytes of one KV cell (keys and values of one token, every layer)
        self.cell_bytes = kv_cell_bytes(self.model, kv_cache_type)
        if kv_cells is None:  # alone: one context at a time; else room for the particles in flight
            kv_cells = n_ctx if self.batch_invariant else default_kv_cells(n_ctx, n_seq_max, self.cell_bytes)
        threads = n_threads or os.cpu_count() or 1
        cparams = L.llama_context_default_params()
        # llama.cpp pads the cells to a multiple of 256, but clamps n_batch to the
        # unpadded value first: pass the padded count
        cparams.n_ctx = -(-kv_cells // 256) * 256
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_batch
        cparams.n_seq_max = n_seq_max
        # it reserves one output per sequence and asserts that fits n_outputs_max
        cparams.n_outputs_max = max(n_batch, n_seq_max)
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.kv_unified = True  # one cell pool: shared prefixes are stored once
        cparams.no_perf = True
        cparams.type_k = cparams.type_v = KV_TYPES[kv_cache_type]
        if flash_attn is None and kv_cache_type == "f32":
            flash_attn = False  # the CPU flash attention computes in f16 (~1e-3 off float32)
        # llama_flash_attn_type: -1 auto, 0 disabled, 1 enabled
        cparams.flash_attn_type = -1 if flash_attn is None else int(flash_attn)
        self.ctx = L.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            L.llama_model_free(self.model)
            self.model = None
            raise ValueError(
                f"llamacpp: llama.cpp could not create a context (n_ctx={n_ctx}, n_seq_max={n_seq_max}, "
                f"n_batch={n_batch}) for {path!r}"
            )
        self.max_context = min(n_ctx, kv_cells)  # the longest context accepted
        self.n_positions = n_ctx  # n_ctx, resolved: what bounds a context when kv_cells does not
        self.n_ctx = int(L.llama_n_ctx(self.ctx))  # KV cells: llama.cpp rounds up to 256s
        self.n_batch = int(L.llama_n_batch(self.ctx))
        self.n_seq_max = int(L.llama_n_seq_max(self.ctx))
        self.mem = L.llama_get_memory(self.ctx)
        self.batch = L.llama_batch_init(self.n_batch, 0, 1)
        self._tokens = np.ctypeslib.as_array(self.batch.token, shape=(self.n_batch,))
        self._pos = np.ctypeslib.as_array(self.batch.pos, shape=(self.n_batch,))
        self._nseq = np.ctypeslib.as_array(self.batch.n_seq_id, shape=(self.n_batch,))
        self._logits = np.ctypeslib.as_array(self.batch.logits, shape=(self.n_batch,))
        self._seq = [self.batch.seq_id[i] for i in range(self.n_batch)]

    # ------------------------------------------------------------------ KV sequences
    def seq_copy(self, src: int, dst: int, n_tokens: int) -> None:
        """Let sequence ``dst`` share the first ``n_tokens`` positions of ``src``."""
        L.llama_memory_seq_cp(self.mem, src, dst, 0, n_tokens)

    def seq_remove(self, seq: int) -> None:
        L.llama_memory_seq_rm(self.mem, seq, -1, -1)

    def clear(self) -> None:
        """Free every cell (metadata only: a cell's stale data is never read unmasked)."""
        L.llama_memory_clear(self.mem, False)

    # ------------------------------------------------------------------ decoding
    def decode(self, rows: Sequence[Row]) -> np.ndarray:
        """One ``llama_decode`` over ``rows`` (at most ``n_batch``): the logits of the rows
        marked ``logits``, in order, as an ``(outputs, n_vocab)`` float32 *view* of
        llama.cpp's output buffer, valid until the next decode (copy or consume it first:
        no copy is made here)."""
        n = len(rows)
        if not 0 < n <= self.n_batch:
            raise ValueError(f"llamacpp: a decode holds 1 to {self.n_batch} tokens, got {n}")
        self._tokens[:n] = [r.token for r in rows]
        self._pos[:n] = [r.pos for r in rows]
        self._nseq[:n] = 1
        flags = [r.logits for r in rows]
        self._logits[:n] = flags
        seq = self._seq
        for i, r in enumerate(rows):
            seq[i][0] = r.seq
        self.batch.n_tokens = n
        rc = L.llama_decode(self.ctx, self.batch)
        if rc == 1:
            raise NoKVSpace("llama_decode: no free KV cells for the batch")
        if rc != 0:
            raise RuntimeError(f"llamacpp: llama_decode failed with code {rc}")
        outputs = sum(flags)
        if not outputs:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        # llama_get_logits: the output rows in batch order, contiguous
        return np.ctypeslib.as_array(L.llama_get_logits(self.ctx), shape=(outputs, self.n_vocab))

    # ------------------------------------------------------------------ vocabulary
    def token_bytes(self, token: int) -> bytes:
        """The bytes of ``token`` as llama.cpp renders it (special tokens as their text)."""
        buf = ctypes.create_string_buffer(64)
        n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = L.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, True)
        return buf.raw[:n]

    def tokenize(self, text: str, add_special: bool, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 8
        arr = (L.llama_token * cap)()
        n = L.llama_tokenize(self.vocab, data, len(data), arr, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            arr = (L.llama_token * cap)()
            n = L.llama_tokenize(self.vocab, data, len(data), arr, cap, add_special, parse_special)
        return list(arr[:n])

    def eos_ids(self) -> list[int]:
        """Every end-of-generation token id (EOS, EOT, ...)."""
        return [t for t in range(self.n_vocab) if L.llama_vocab_is_eog(self.vocab, t)]

    def eos_id(self) -> int | None:
        """The GGUF's EOS id (``tokenizer.ggml.eos_token_id``)."""
        eos = int(L.llama_vocab_eos(self.vocab))
        return eos if eos >= 0 else None

    def bos_id(self) -> int | None:
        bos = int(L.llama_vocab_bos(self.vocab))
        return bos if bos >= 0 else None

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        if self.ctx:
            L.llama_batch_free(self.batch)
            L.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            L.llama_model_free(self.model)
            self.model = None
