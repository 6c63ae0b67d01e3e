"""MLXBackend: genlm-core's LogprobBackend on mlx-lm models.

Importing this module does not import mlx; creating a backend does.

* ``_forward`` left-pads the batch's contexts and prefills them together in steps
  of ``prefill_step_size`` (:func:`genlm_mlx.engine.forward`). The shared base
  gives batching (AutoBatcher), the output cache, validation and the entry points.
* KV prefix reuse: the KV state of every computed context is stored in the core
  :class:`~genlm_core.engine.kv_reuse.KVReuse` (one contiguous mlx array per prefix,
  LRU-evicted under ``kv_cache_bytes``); a later context resumes from its deepest
  cached proper prefix. Models whose caches cannot be reused (recurrent or
  sliding-window layers) get a warning and no prefix caching.
* The context limit, default EOS ids, dtype and ``model=None`` follow the checkpoint
  policy of :mod:`genlm_core.engine.checkpoint`.
* ``sample`` uses mlx-lm's ``generate_step`` and ``make_sampler``, seeded.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from genlm_core.config import ConfigError
from genlm_core.engine import BaseLogprobBackend, KVReuse, KVReuseBackend, checkpoint, note, resolve_dtype
from genlm_mlx.config import MLXConfig

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["MLXBackend"]


class MLXBackend(KVReuseBackend, BaseLogprobBackend):
    """Batched, prefix-caching next-token log-probabilities from an mlx-lm model.

    Args:
        model: an mlx-lm model (``mlx_lm.load(...)[0]``).
        tokenizer: mlx-lm's ``TokenizerWrapper`` or a Hugging Face tokenizer; the
            vocabulary is decoded from the underlying Hugging Face tokenizer.
        config: :class:`MLXConfig`.
        model_config: the model's ``config.json`` as a dict (context limit; default:
            the model's ``args``).
    """

    config_class = MLXConfig
    backend_name = "mlx"
    config: MLXConfig

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        config: MLXConfig | None = None,
        *,
        model_config: dict[str, Any] | None = None,
    ) -> None:
        from genlm_mlx import engine  # imports mlx

        self._engine = engine
        self.mlx_model = model
        self.mlx_tokenizer = tokenizer
        hf_tokenizer = getattr(tokenizer, "_tokenizer", tokenizer)
        config = config or MLXConfig()
        super().__init__(hf_tokenizer, config)  # default EOS ids: the checkpoint policy
        if not model_config:  # built by hand: the model's own arguments hold the same keys
            args = getattr(model, "args", None)
            model_config = dict(vars(args)) if hasattr(args, "__dict__") else {}
        self._max_len = checkpoint.context_limit(model_config)
        self.kv_reuse_problem = engine.kv_reuse_problem(model)
        self._kv_token_bytes = 0  # KV bytes per token, known after the first payload
        wanted = self.config.prefix_cache and self.config.kv_cache_bytes != 0
        self.kv = KVReuse(self.config.kv_cache_bytes, enabled=wanted and self.kv_reuse_problem is None)
        if wanted and self.kv_reuse_problem is not None:
            warnings.warn(
                f"genlm-mlx: model {type(model).__module__}.{type(model).__name__} cannot reuse "
                f"KV state ({self.kv_reuse_problem}); prefix caching is disabled.",
                UserWarning,
                stacklevel=2,
            )

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, config: MLXConfig) -> "MLXBackend":  # type: ignore[override]
        """Load with mlx-lm after mapping transformers-5 config keys (:mod:`genlm_mlx.hf_config`)
        and cast the weights to the resolved ``dtype`` (:mod:`genlm_core.engine.dtypes`)."""
        config.check_model()  # before mlx_lm is imported
        from mlx_lm import load

        if config.model is None:  # the checkpoint policy: the embedded SmolLM2
            config = config.model_copy(update={"model": checkpoint.default_model()})
        model_path = config.model
        note(f"mlx: loading {model_path} with mlx-lm")
        local = Path(model_path).expanduser()
        try:
            folder = local if local.exists() else _download(model_path)
            overrides = _config_overrides(folder, model_path)
            model, tokenizer, model_config = load(str(folder), model_config=overrides, return_config=True)
        except (OSError, ValueError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"mlx: mlx_lm.load could not load {model_path!r}: {exc}") from exc
        _cast(model, resolve_dtype(config.dtype, folder))
        return cls(model, tokenizer, config, model_config=model_config)

    # ------------------------------------------------------------------ engine hooks
    @property
    def max_context_length(self) -> int | None:
        return self._max_len

    @property
    def device(self) -> str:
        import mlx.core as mx

        return "mps" if mx.default_device().type == mx.gpu else "cpu"

    def _rows_device(self) -> str:
        return "cpu"  # rows come back from mlx as numpy arrays

    @property
    def dtype(self) -> str:
        """The dtype of the model's floating weights (what mlx computes in)."""
        return _weight_dtype(self.mlx_model)

    def _forward(self, contexts: list[tuple[int, ...]]) -> "torch.Tensor":
        import torch

        if not self.kv.enabled:
            return self._forward_uncached(contexts)
        starts = self.kv.lookup(contexts)
        budget = self.config.kv_cache_bytes
        max_kv_tokens = (
            budget // self._kv_token_bytes if budget is not None and self._kv_token_bytes else None
        )
        out = self._engine.forward(
            self.mlx_model,
            contexts,
            [kv for _, kv in starts],
            self.config.prefill_step_size,
            want_kv=True,
            max_kv_tokens=max_kv_tokens,
        )
        self.kv.count(out.computed, out.reused)
        for ctx, kv in zip(contexts, out.payloads or []):
            if kv is not None:
                self._kv_token_bytes = kv.nbytes // max(1, kv.shape[3])
                self.kv.store(ctx, kv)
        return torch.from_numpy(out.logits)

    def _forward_uncached(self, contexts: list[tuple[int, ...]]) -> "torch.Tensor":
        import torch

        out = self._engine.forward(self.mlx_model, contexts, None, self.config.prefill_step_size)
        self.kv.count(out.computed, out.reused)
        return torch.from_numpy(out.logits)

    def _clear_engine_cache(self) -> None:
        import mlx.core as mx

        self.kv.clear()
        mx.clear_cache()

    def _close_engine(self) -> None:
        self._clear_engine_cache()

    # ------------------------------------------------------------------ extras
    def _engine_stats(self) -> dict[str, Any]:
        return {"device": self.device}

    async def sample(
        self,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        eos_token_ids: Sequence[int] | None = None,
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[int]:
        """Sample with mlx-lm (``generate_step``, ``make_sampler``); stop before EOS ids.

        ``seed`` seeds mlx's generator; ``temperature=0`` is greedy. Runs in a worker
        thread under the model lock, so concurrent samples do not interleave draws.
        """
        ctx = self.validate(prompt_token_ids)
        max_tokens, temperature, eos = self._check_sample_args(max_tokens, temperature, eos_token_ids)
        if self._max_len is not None:
            max_tokens = min(max_tokens, self._max_len - len(ctx))
        return await asyncio.to_thread(self._sample_sync, ctx, max_tokens, eos, temperature, seed)

    def _sample_sync(
        self, ctx: tuple[int, ...], max_tokens: int, eos: set[int], temperature: float, seed: int | None
    ) -> list[int]:
        from genlm_mlx.sampling import sample_tokens

        with self.batcher.model_lock:
            return sample_tokens(
                self.mlx_model,
                ctx,
                max_tokens,
                eos,
                temperature,
                seed,
                self.vocab_size,
                self.config.prefill_step_size,
            )


def _download(model: str) -> Path:
    """mlx-lm's own resolution of a hub id to a local snapshot (its cache first)."""
    from mlx_lm.utils import _download as download

    return Path(download(model))


def _config_overrides(folder: Path, name: str) -> dict[str, Any]:
    """Keys transformers 5 moved that mlx-lm's model class reads (see :mod:`genlm_mlx.hf_config`)."""
    from mlx_lm.utils import _get_classes, load_config

    from genlm_mlx.hf_config import args_fields, mlx_overrides

    config = load_config(folder)
    _, args_class = _get_classes(config)
    return mlx_overrides(config, args_fields(args_class), where=repr(name))


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
