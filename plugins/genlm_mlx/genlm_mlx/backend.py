"""MLXBackend: genlm-core's LogprobBackend on mlx-lm models.

Importing this module does not import mlx; creating a backend does.

* ``_forward`` left-pads the batch's contexts and prefills them together in steps
  of ``prefill_step_size`` (:func:`genlm_mlx.engine.forward`). The shared base
  gives batching (AutoBatcher), the output cache, validation and the entry points.
* KV prefix reuse: the KV state of every computed context is stored in a core
  :class:`~genlm_core.prefix_cache.PrefixCache` (one contiguous mlx array per
  prefix, LRU-evicted under ``kv_cache_bytes``); a later context resumes from its
  deepest cached proper prefix. Models whose caches cannot be reused (recurrent or
  sliding-window layers) get a warning and no prefix caching.
* ``sample`` uses mlx-lm's ``generate_step`` and ``make_sampler``, seeded.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from genlm_core.backend import BaseLogprobBackend
from genlm_core.config import ConfigError
from genlm_core.prefix_cache import PrefixCache
from genlm_core.progress import note
from genlm_mlx.config import MLXConfig

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["MLXBackend"]


class MLXBackend(BaseLogprobBackend):
    """Batched, prefix-caching next-token log-probabilities from an mlx-lm model.

    Args:
        model: an mlx-lm model (``mlx_lm.load(...)[0]``).
        tokenizer: mlx-lm's ``TokenizerWrapper`` or a Hugging Face tokenizer; the
            vocabulary is decoded from the underlying Hugging Face tokenizer.
        config: :class:`MLXConfig`.
        model_config: the model's ``config.json`` as a dict (for the context limit).
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
        super().__init__(hf_tokenizer, config or MLXConfig(), eos_token_ids=_eos_ids(tokenizer))
        self.eos_token_ids = [e for e in self.eos_token_ids if 0 <= e < self.vocab_size]
        self._max_len = engine.context_limit(model, model_config, hf_tokenizer)
        self.kv_reuse_problem = engine.kv_reuse_problem(model)
        self.prefix_cache: PrefixCache | None = None
        self._kv_token_bytes = 0  # KV bytes per token, known after the first payload
        self.forward_calls = 0
        self.tokens_computed = 0
        self.tokens_reused = 0
        if self.config.prefix_cache and self.config.kv_cache_bytes != 0:
            if self.kv_reuse_problem is None:
                self.prefix_cache = PrefixCache(kv_budget_bytes=self.config.kv_cache_bytes)
            else:
                warnings.warn(
                    f"genlm-mlx: model {type(model).__module__}.{type(model).__name__} cannot reuse "
                    f"KV state ({self.kv_reuse_problem}); prefix caching is disabled.",
                    UserWarning,
                    stacklevel=2,
                )

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_config(cls, config: MLXConfig) -> "MLXBackend":  # type: ignore[override]
        config.check_model()  # before mlx_lm is imported
        from mlx_lm import load

        model_path = config.model
        if model_path is None:
            from genlm_core.embedded import smollm2_path

            model_path = str(smollm2_path())
        note(f"mlx: loading {model_path} with mlx-lm")
        try:
            model, tokenizer, model_config = load(model_path, return_config=True)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"mlx: mlx_lm.load could not load {model_path!r}: {exc}") from exc
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

    def _forward(self, contexts: list[tuple[int, ...]]) -> "torch.Tensor":
        import torch

        cache = self.prefix_cache
        if cache is None:
            return self._forward_uncached(contexts)
        pasts = [cache.deepest_kv(c, max_depth=len(c) - 1)[1] for c in contexts]
        budget = self.config.kv_cache_bytes
        max_kv_tokens = (
            budget // self._kv_token_bytes if budget is not None and self._kv_token_bytes else None
        )
        out = self._engine.forward(
            self.mlx_model,
            contexts,
            pasts,
            self.config.prefill_step_size,
            want_kv=True,
            max_kv_tokens=max_kv_tokens,
        )
        self._count(out)
        for ctx, kv in zip(contexts, out.payloads or []):
            if kv is not None:
                self._kv_token_bytes = kv.nbytes // max(1, kv.shape[3])
                cache.insert(ctx, kv=kv)
        return torch.from_numpy(out.logits)

    def _forward_uncached(self, contexts: list[tuple[int, ...]]) -> "torch.Tensor":
        import torch

        out = self._engine.forward(self.mlx_model, contexts, None, self.config.prefill_step_size)
        self._count(out)
        return torch.from_numpy(out.logits)

    def _count(self, out: Any) -> None:
        self.forward_calls += 1
        self.tokens_computed += out.computed
        self.tokens_reused += out.reused

    def _clear_engine_cache(self) -> None:
        import mlx.core as mx

        if self.prefix_cache is not None:
            self.prefix_cache.clear()
        mx.clear_cache()

    def _close_engine(self) -> None:
        self._clear_engine_cache()

    # ------------------------------------------------------------------ extras
    def cache_kv(self, prompt_token_ids: Sequence[int]) -> None:
        """Compute ``prompt_token_ids`` now so later contexts that extend it reuse its KV."""
        ctx = self.validate(prompt_token_ids)
        self.batcher.run_sync([ctx])

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        if self.prefix_cache is not None:
            out["prefix_cache"] = self.prefix_cache.stats()
        out["engine"] = {
            "forward_calls": self.forward_calls,
            "tokens_computed": self.tokens_computed,
            "tokens_reused": self.tokens_reused,
            "kv_reuse": self.prefix_cache is not None,
            "device": self.device,
        }
        return out

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


def _eos_ids(tokenizer: Any) -> list[int]:
    """EOS ids: mlx-lm's wrapper knows the generation config's list too."""
    ids = getattr(tokenizer, "eos_token_ids", None)
    if ids:
        return sorted(int(i) for i in ids)
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        return [eos]
    return [int(e) for e in eos or []]
