"""MLXEngine: mlx-lm models as a genlm-core engine.

Importing this module does not import mlx; creating an engine does.

* ``forward`` left-pads the batch's contexts and prefills them together in steps of
  ``prefill_step_size`` (:func:`genlm_mlx.prefill.forward`).
* KV prefix reuse (capability ``"resume"``): the KV state of every computed context is
  handed back to the core as a chain of segments (its prefix's, then its own new tokens:
  :class:`genlm_mlx.shared_prefix.KVChain`), which keeps it in its prefix cache under
  ``kv_cache_bytes`` (each context counts its own tokens), and hands it back with a later
  context that extends it (:mod:`genlm_core.engine.kv_calls`). Rows that extend one prompt
  read its KV once, not a copy each (:mod:`genlm_mlx.shared_prefix`). Models whose caches cannot
  be reused (recurrent or sliding-window layers) get a warning and no prefix caching.
* ``sample`` uses mlx-lm's ``generate_step`` and ``make_sampler``, seeded
  (:mod:`genlm_mlx.sampling`).
* bursts keep each step's batch caches for the next step (capability ``"kept_batches"``:
  the core's :class:`~genlm_core.engine.decode_batches.DecodeBatches` over
  :class:`genlm_mlx.decode.MLXDecodeOps`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from genlm_core.config import ConfigError
from genlm_core.engine import Checkpoint, Engine, EngineServices, SampleRequest, note
from genlm_core.engine.call_plan import MIN_COMMON
from genlm_core.engine.kv_reuse import too_large_for_budget
from genlm_core.engine.kv_rows import KVPolicy, ResumeRow, RowsOut
from genlm_mlx.config import MLXConfig

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["MLXEngine"]


class MLXEngine(Engine[MLXConfig]):
    """Batched, prefix-caching next-token logits from an mlx-lm model.

    Args:
        model: an mlx-lm model (``mlx_lm.load(...)[0]``).
        tokenizer: mlx-lm's ``TokenizerWrapper`` or a Hugging Face tokenizer; the
            vocabulary is decoded from the underlying Hugging Face tokenizer.
        config: :class:`MLXConfig`.
        model_config: the model's ``config.json`` as a dict (default: the model's ``args``).
    """

    config_class = MLXConfig
    supports = frozenset({"sample", "resume", "kept_batches"})
    rows_device = "cpu"  # rows come back from mlx as numpy arrays

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        config: MLXConfig | None = None,
        *,
        model_config: dict[str, Any] | None = None,
    ) -> None:
        from genlm_mlx import prefill  # imports mlx
        from genlm_mlx.decode import MLXDecodeOps

        config = config or MLXConfig()
        self.mlx_model = model
        self.mlx_tokenizer = tokenizer
        self.tokenizer = getattr(tokenizer, "_tokenizer", tokenizer)  # the core decodes its vocabulary
        if not model_config:  # built by hand: the model's own arguments hold the same keys
            args = getattr(model, "args", None)
            model_config = dict(vars(args)) if hasattr(args, "__dict__") else {}
        self.model_config = model_config
        self.prefill_step_size = config.prefill_step_size
        self._batch_size = config.batch_size
        self.kv_cache_bytes = config.kv_cache_bytes
        #: why the model's caches cannot be resumed (None: they can)
        self.kv_reuse_problem = prefill.kv_reuse_problem(model)
        #: whether computed contexts' KV is handed back to be kept
        self.reuse = (
            bool(config.prefix_cache) and config.kv_cache_bytes != 0 and self.kv_reuse_problem is None
        )
        #: why rows cannot read a prompt's KV once (None: they do; :mod:`genlm_mlx.shared_prefix`)
        self.sharing_problem = prefill.sharing_problem(model) if self.reuse else "no KV is kept"
        if self.reuse and self.sharing_problem is not None:
            note(f"mlx: each row holds its own copy of a shared prompt's KV: {self.sharing_problem}")
        #: what the core's decode step over kept batches calls (a burst's rows, KV kept between steps)
        self._decode_ops = MLXDecodeOps(model, config.prefill_step_size, share=self.sharing_problem is None)
        self._kv_token_bytes = 0  # KV bytes per token, known after the first payload
        self._said_too_large = False  # a context's KV past the whole budget was reported

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, checkpoint: Checkpoint, config: MLXConfig, services: EngineServices) -> "MLXEngine":
        """Load with mlx-lm after mapping transformers-5 config keys (:mod:`genlm_mlx.hf_config`)
        and cast the weights to the dtype the core placed."""
        from mlx_lm import load

        model_path = checkpoint.model
        note(f"mlx: loading {model_path} with mlx-lm")
        local = Path(model_path).expanduser()  # type: ignore[arg-type]
        try:
            folder = local if local.exists() else _download(model_path)  # type: ignore[arg-type]
            overrides = _config_overrides(folder, model_path)  # type: ignore[arg-type]
            model, tokenizer, model_config = load(str(folder), model_config=overrides, return_config=True)
        except (OSError, ValueError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"mlx: mlx_lm.load could not load {model_path!r}: {exc}") from exc
        _cast(model, str(services.dtype))
        return cls(model, tokenizer, config, model_config=model_config)

    # ------------------------------------------------------------------ what it is
    @property
    def device(self) -> str:
        """Where mlx computes (read where the core did not place the engine: built by hand)."""
        import mlx.core as mx

        return "mps" if mx.default_device().type == mx.gpu else "cpu"

    @property
    def dtype(self) -> str:
        """The dtype of the model's floating weights (what mlx computes in; read where the core
        did not place the engine: built by hand)."""
        return _weight_dtype(self.mlx_model)

    # ------------------------------------------------------------------ model calls
    def kv_policy(self) -> KVPolicy:
        # branch_tokens: rows that share a prompt nobody kept yet run it once first
        return KVPolicy(problem=self.kv_reuse_problem, budget=self.kv_cache_bytes, branch_tokens=MIN_COMMON)

    def kv_size(self, payload: Any) -> int:
        """A kept context's own tokens of KV: the segments it shares with the prefixes it
        extends are counted by them (kept while it is: release ``"resident"``)."""
        return payload.own_bytes()

    def forward_rows(self, rows: list[ResumeRow]) -> RowsOut:
        """The rows' logits, each resuming from its kept prefix's KV (the batch runs from
        the first position no row has kept: :func:`genlm_mlx.prefill.forward`); the KV of
        every context computed is handed back (those within the budget)."""
        import torch

        from genlm_mlx import prefill

        contexts = [r.context for r in rows]
        if not self.reuse:
            out = prefill.forward(self.mlx_model, contexts, None, self.prefill_step_size)
            return RowsOut(torch.from_numpy(out.logits), computed=out.computed, reused=out.reused)
        budget = self.kv_cache_bytes
        max_kv_tokens = (
            budget // self._kv_token_bytes if budget is not None and self._kv_token_bytes else None
        )
        out = prefill.forward(
            self.mlx_model,
            contexts,
            [r.payload for r in rows],
            self.prefill_step_size,
            want_kv=True,
            max_kv_tokens=max_kv_tokens,
            depths=[r.depth for r in rows],
            share=self.sharing_problem is None,
        )
        kept = []
        for ctx, kv in zip(contexts, out.payloads or []):
            if kv is not None:
                own = kv.segments[-1]
                self._kv_token_bytes = own.nbytes // max(1, own.shape[3])
                kept.append((ctx, kv))
            elif max_kv_tokens is not None and len(ctx) > max_kv_tokens and not self._said_too_large:
                self._said_too_large = True  # left out above: the core never sees it
                size = len(ctx) * self._kv_token_bytes
                too_large_for_budget(len(ctx), size, budget, "kv_cache_bytes")  # type: ignore[arg-type]
        return RowsOut(torch.from_numpy(out.logits), kept, computed=out.computed, reused=out.reused)

    def decode_ops(self) -> Any:
        """A burst's batches, their caches kept between steps (:mod:`genlm_mlx.decode`)."""
        return self._decode_ops

    def forward_uncached(self, contexts: list[tuple[int, ...]]) -> "torch.Tensor":
        import torch

        from genlm_mlx import prefill

        out = prefill.forward(self.mlx_model, contexts, None, self.prefill_step_size)
        return torch.from_numpy(out.logits)

    def sample(self, requests: list[SampleRequest]) -> list[list[int]]:
        """mlx-lm's ``generate_step`` and ``make_sampler``, one request at a time (each
        seeds mlx's generator, so none interleaves its draws with another's)."""
        from genlm_mlx.sampling import sample_tokens

        return [
            sample_tokens(
                self.mlx_model,
                r.prompt,
                r.max_tokens,
                set(r.eos),
                r.temperature,
                r.seed,
                r.width if r.width is not None else sys.maxsize,  # None: every id the model scores
                self.prefill_step_size,
            )  # fmt: skip
            for r in requests
        ]

    # ------------------------------------------------------------------ housekeeping
    def clear_cache(self) -> None:
        import mlx.core as mx

        mx.clear_cache()

    def close(self) -> None:
        self.clear_cache()

    def stats(self) -> dict[str, Any]:
        return {"device": self.device}  # a burst's kept batches: the core's (decode_batches_*)


def _download(model: str) -> Path:
    """A hub id's local snapshot (the hub cache first), with the files mlx-lm reads
    (``mlx_lm.utils.DEFAULT_ALLOW_PATTERNS``): public huggingface_hub and mlx-lm API only."""
    from huggingface_hub import snapshot_download
    from mlx_lm.utils import DEFAULT_ALLOW_PATTERNS

    return Path(snapshot_download(model, allow_patterns=DEFAULT_ALLOW_PATTERNS))


def _model_args_class(config: dict[str, Any]) -> type:
    """The ``ModelArgs`` class of the mlx-lm model module ``config`` names: its
    ``model_type`` through mlx-lm's public remapping tables (by architecture first)."""
    import importlib

    from mlx_lm.utils import MODEL_ARCHITECTURE_REMAPPING, MODEL_REMAPPING

    model_type = config["model_type"]
    architectures = config.get("architectures") or ()
    if isinstance(architectures, str):
        architectures = (architectures,)
    remapped = next(
        (
            MODEL_ARCHITECTURE_REMAPPING[(model_type, a)]
            for a in architectures
            if (model_type, a) in MODEL_ARCHITECTURE_REMAPPING
        ),
        MODEL_REMAPPING.get(model_type, model_type),
    )
    try:
        return importlib.import_module(f"mlx_lm.models.{remapped}").ModelArgs
    except ImportError as exc:
        raise ConfigError(f"mlx: mlx-lm has no model for model_type {model_type!r} ({exc})") from exc


def _config_overrides(folder: Path, name: str) -> dict[str, Any]:
    """Keys transformers 5 moved that mlx-lm's model class reads (see :mod:`genlm_mlx.hf_config`)."""
    from mlx_lm.utils import load_config

    from genlm_mlx.hf_config import args_fields, mlx_overrides

    config = load_config(folder)
    return mlx_overrides(config, args_fields(_model_args_class(config)), where=repr(name))


def _weight_dtype(model: Any) -> str:
    import mlx.core as mx
    from mlx.utils import tree_flatten

    for _, value in tree_flatten(model.parameters()):
        if mx.issubdtype(value.dtype, mx.floating):
            return str(value.dtype).removeprefix("mlx.core.")
    return "float32"


def _cast(model: Any, dtype: str) -> None:
    """Cast the floating weights to ``dtype`` (mlx computes in its inputs' dtype)."""
    import mlx.core as mx

    model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
