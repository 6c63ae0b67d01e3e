"""Do two engines give the same distributions? (``genlm compare``)

Switching a program from one backend to another must keep its distributions. This
module runs the same token contexts through several backends and reports, for
every pair, the largest absolute difference of next-token log-probabilities, the
KL divergence, how often the most likely token agrees, and the context where they
differ most. :func:`compare_backends` loads backends by name (one at a time);
:func:`compare_loaded` takes backends already loaded (tests, benchmarks);
:func:`compare_rows` compares rows already computed.

:func:`compare_paths` (``genlm compare --paths``) compares one backend with itself: the
same contexts computed alone, in one batch, and by extending a cached prefix's KV
(:data:`PATHS`). In float32 these differ by reduction order only (~1e-5); in 16-bit
dtypes a row depends on its batch-mates and on the KV it extends (docs/numerics.md).
Besides the largest difference over the whole vocabulary, each pair reports it over
the ``top_k`` most likely tokens of its first member, where a program's mass is
(16-bit tail logprobs move most).

Contexts come from prompts tokenized once (by the first backend's tokenizer), so
every backend sees the same token ids. The default prompts mix lengths, share
prefixes (which exercises prefix caches) and include a long context.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "DEFAULT_PROMPTS",
    "DEFAULT_TOLERANCE",
    "PATHS",
    "CompareResult",
    "PairStats",
    "compare_backends",
    "compare_loaded",
    "compare_paths",
    "compare_rows",
    "read_prompts",
    "tokenize_prompts",
]

#: largest |Δ logprob| accepted by default: float32 engines agree to ~1e-4 on
#: SmolLM2-135M (30 layers); a misread config or another dtype is off by >= 1e-2
DEFAULT_TOLERANCE = 1e-3

_LONG = (
    "Montreal is the largest city in the Canadian province of Quebec. It is set on an island "
    "in the Saint Lawrence River, named after Mount Royal, the triple-peaked hill at its centre. "
    "The city has a long history of trade on the river, a metro system with rubber tyres, and a "
    "festival season that fills the summer. Its neighbourhoods each have their own character: "
    "the old port with its stone buildings, the Plateau with outdoor staircases, and the "
    "downtown towers that stop below the height of the mountain. In winter, much of the "
    "city moves underground, where kilometres of tunnels link shops, offices and stations. "
)

#: the tokens whose logprobs ``top_k_max_abs`` compares (the most likely of a pair's first row)
TOP_K = 50

#: how one backend can compute a context's row (``genlm compare --paths``)
PATHS: dict[str, str] = {
    "alone": "each context in a forward pass of its own, no cache read (next_token_logprobs_uncached)",
    "batched": "every context in one batch, caches cleared first (batch_next_token_logprobs_sync)",
    "extended": "each context after its first half, so the engine extends that prefix's cached KV",
}

#: mixed lengths, shared prefixes, digits and punctuation, one long context
DEFAULT_PROMPTS: tuple[str, ...] = (
    "The",
    "The capital of France is",
    "The capital of France is Paris. The capital of Germany is",
    "The capital of France is Paris. The capital of Italy is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "1, 2, 3, 5, 8, 13, 21,",
    "Once upon a time, in a small village by the sea, there lived",
    _LONG * 2 + "The name of the hill is",
)


@dataclass
class PairStats:
    """How backends ``a`` and ``b`` differ over the contexts."""

    a: str
    b: str
    max_abs: float  # largest |logprob_a - logprob_b| over every context and token
    max_kl: float  # largest KL(p_a || p_b) over the contexts (nats)
    mean_kl: float
    top1_agree: int  # contexts whose most likely token is the same
    n_contexts: int
    worst_context: int  # index of the context with the largest |Δ logprob|
    per_context_max_abs: list[float] = field(default_factory=list)
    #: largest |Δ logprob| over the ``top_k`` most likely tokens of ``a``'s row, every context
    top_k_max_abs: float = math.nan
    top_k: int = TOP_K

    def ok(self, tolerance: float) -> bool:
        return self.max_abs <= tolerance


@dataclass
class CompareResult:
    """The pairwise comparison of several backends on the same contexts."""

    backends: dict[str, dict[str, Any]]  # name -> {"dtype", "device", "model"[, "weights" for GGUFs]}
    contexts: list[list[int]]
    texts: list[str]
    pairs: list[PairStats]

    def ok(self, tolerance: float) -> bool:
        return all(p.ok(tolerance) for p in self.pairs)

    def as_dict(self, tolerance: float | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "backends": self.backends,
            "contexts": [{"text": t, "tokens": len(c)} for t, c in zip(self.texts, self.contexts)],
            "pairs": [asdict(p) for p in self.pairs],
        }
        if tolerance is not None:
            out["tolerance"] = tolerance
            out["ok"] = self.ok(tolerance)
        return out

    def to_json(self, tolerance: float | None = None) -> str:
        return json.dumps(self.as_dict(tolerance), indent=2)

    def table(self, tolerance: float | None = None) -> str:
        """A text table, one line per pair (what ``genlm compare`` prints)."""
        lengths = [len(c) for c in self.contexts]
        head = [
            f"{len(self.contexts)} contexts ({min(lengths)}-{max(lengths)} tokens); "
            + ", ".join(
                f"{n}: {b['dtype']} on {b['device']}"
                + (f" ({b['weights']} weights)" if "weights" in b else "")
                + (f" ({b['tokens_reused']} tokens from cached KV)" if "tokens_reused" in b else "")
                for n, b in self.backends.items()
            )
        ]
        k = self.pairs[0].top_k if self.pairs else TOP_K
        cols = ("pair", "max |Δ logprob|", f"top-{k}", "max KL", "mean KL", "top-1 agree", "worst context")
        rows = []
        for p in self.pairs:
            text = self.texts[p.worst_context]
            short = text if len(text) <= 40 else text[:37] + "..."
            rows.append(
                (
                    f"{p.a} vs {p.b}",
                    f"{p.max_abs:.3g}" + ("" if tolerance is None or p.ok(tolerance) else "  FAIL"),
                    f"{p.top_k_max_abs:.3g}",
                    f"{p.max_kl:.3g}",
                    f"{p.mean_kl:.3g}",
                    f"{p.top1_agree}/{p.n_contexts}",
                    f"#{p.worst_context} ({len(self.contexts[p.worst_context])} tok) {short!r}",
                )
            )
        widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
        lines = head + ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
        lines.append("  ".join("-" * w for w in widths))
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in rows]
        if tolerance is not None:
            verdict = "OK" if self.ok(tolerance) else "FAIL"
            lines.append(f"{verdict}: tolerance {tolerance:g} on max |Δ logprob|")
        return "\n".join(lines)


def compare_rows(rows: Mapping[str, "torch.Tensor"], top_k: int = TOP_K) -> list[PairStats]:
    """Pairwise statistics of ``{name: (contexts, vocab) logprobs}`` (same contexts, same order)."""
    import torch

    names = list(rows)
    shapes = {n: tuple(rows[n].shape) for n in names}
    if len(set(shapes.values())) > 1:
        raise ValueError(f"compare: backends returned different shapes {shapes}; do they share a tokenizer?")
    out = []
    for a, b in itertools.combinations(names, 2):
        la = rows[a].detach().to("cpu", torch.float64)
        lb = rows[b].detach().to("cpu", torch.float64)
        both_inf = torch.isneginf(la) & torch.isneginf(lb)
        diff = torch.where(both_inf, torch.zeros_like(la), (la - lb).abs())
        per_ctx = diff.amax(dim=1)
        top = la.topk(min(top_k, la.shape[1]), dim=1).indices
        pa = la.exp()
        kl = torch.where(pa > 0, pa * (la - lb), torch.zeros_like(la)).sum(dim=1).clamp_min(0)
        out.append(
            PairStats(
                a=a,
                b=b,
                max_abs=float(per_ctx.max()),
                max_kl=float(kl.max()),
                mean_kl=float(kl.mean()),
                top1_agree=int((la.argmax(dim=1) == lb.argmax(dim=1)).sum()),
                n_contexts=int(la.shape[0]),
                worst_context=int(per_ctx.argmax()),
                per_context_max_abs=[float(x) for x in per_ctx],
                top_k_max_abs=float(diff.gather(1, top).max()) if la.numel() else 0.0,
                top_k=top_k,
            )
        )
    return out


def read_prompts(path: str | Path) -> list[str]:
    """Prompts from a file: a JSON list of strings (``.json``), else one prompt per line."""
    text = Path(path).read_text(encoding="utf-8")
    if str(path).endswith(".json"):
        data = json.loads(text)
        if not isinstance(data, list) or not all(isinstance(p, str) for p in data):
            raise ValueError(f"--prompts {path}: expected a JSON list of strings")
        prompts = data
    else:
        prompts = [line for line in text.splitlines() if line.strip()]
    if not prompts:
        raise ValueError(f"--prompts {path}: no prompts in the file")
    return prompts


def tokenize_prompts(llm: Any, prompts: Sequence[str], limit: int | None = None) -> list[list[int]]:
    """Token ids of ``prompts`` by ``llm``'s tokenizer; longer ones keep their last ``limit`` tokens."""
    contexts = []
    for text in prompts:
        ids = [int(t) for t in llm.tokenizer.encode(text, add_special_tokens=False)]
        if not ids:
            raise ValueError(f"compare: the prompt {text!r} has no tokens")
        contexts.append(ids[-limit:] if limit is not None else ids)
    return contexts


def _context_limit(llms: Sequence[Any]) -> int | None:
    limits = [llm.max_context_length for llm in llms if llm.max_context_length is not None]
    return min(limits) if limits else None


def _run(llm: Any, contexts: Sequence[Sequence[int]]) -> "torch.Tensor":
    """Next-token logprobs of every context, one call each (shortest first, so shared
    prefixes come from the prefix caches): one padded batch would multiply the work of
    CPU engines by the longest context (mlx-lm on SmolLM2: 8 x 385 tokens, ~13 min here)."""
    import torch

    order = sorted(range(len(contexts)), key=lambda i: len(contexts[i]))
    out: list[Any] = [None] * len(contexts)
    for i in order:
        out[i] = llm.next_token_logprobs_sync(contexts[i]).detach().cpu()
    return torch.stack(out)


def _describe(llm: Any) -> dict[str, Any]:
    out = {"dtype": llm.dtype, "device": str(llm.device), "model": llm.config.model}
    weights = getattr(llm, "weights_type", None)  # engines whose weights are not in dtype (GGUF)
    if weights is not None:
        out["weights"] = weights
    return out


def compare_loaded(llms: Mapping[str, Any], prompts: Sequence[str] = DEFAULT_PROMPTS) -> CompareResult:
    """Compare backends already loaded (``{label: backend}``) on ``prompts``."""
    if len(llms) < 2:
        raise ValueError(f"compare: needs at least two backends, got {list(llms)}")
    first = next(iter(llms.values()))
    contexts = tokenize_prompts(first, prompts, _context_limit(list(llms.values())))
    rows = {name: _run(llm, contexts) for name, llm in llms.items()}
    return CompareResult(
        backends={name: _describe(llm) for name, llm in llms.items()},
        contexts=contexts,
        texts=list(prompts),
        pairs=compare_rows(rows),
    )


def compare_backends(
    backends: Sequence[str],
    model: str | None = None,
    prompts: Sequence[str] = DEFAULT_PROMPTS,
    dtype: str = "float32",
    options: Mapping[str, Any] | None = None,
    backend_options: Mapping[str, Mapping[str, Any]] | None = None,
) -> CompareResult:
    """Load each backend in turn (``genlm_core.load``), run ``prompts``, close it, compare.

    ``options`` go to every backend; ``backend_options[name]`` to that one only (they
    win, e.g. ``{"vllm": {"enforce_eager": True}}`` or another ``model``). Contexts are
    tokenized by the first backend and cut to the shortest context limit of all.
    """
    import genlm_core

    names = list(dict.fromkeys(backends))
    if len(names) < 2:
        raise ValueError(f"compare: needs at least two different backends, got {list(backends)}")
    unknown = set(backend_options or {}) - set(names)
    if unknown:
        raise ValueError(f"compare: options for {sorted(unknown)}, which are not in --backends {names}")
    contexts: list[list[int]] | None = None
    rows: dict[str, Any] = {}
    described: dict[str, dict[str, Any]] = {}
    for name in names:
        opts: dict[str, Any] = {
            "dtype": dtype,
            **(options or {}),
            **((backend_options or {}).get(name) or {}),
        }
        opts.setdefault("model", model)
        llm = genlm_core.load(name, **opts)
        try:
            if contexts is None:  # the first backend tokenizes (and cuts to its limit)
                contexts = tokenize_prompts(llm, prompts, llm.max_context_length)
            limit = llm.max_context_length
            longest = max(len(c) for c in contexts)
            if limit is not None and longest > limit:
                raise ValueError(
                    f"compare: a context has {longest} tokens but backend {name!r} accepts at most "
                    f"{limit}; use shorter prompts or list {name!r} first"
                )
            rows[name] = _run(llm, contexts)
            described[name] = _describe(llm)
        finally:
            llm.close()
    assert contexts is not None
    return CompareResult(backends=described, contexts=contexts, texts=list(prompts), pairs=compare_rows(rows))


def _reused(llm: Any) -> int | None:
    """Tokens the engine took from cached KV so far (engines that count them)."""
    value = llm.stats().get("engine", {}).get("tokens_reused")
    return int(value) if isinstance(value, int) else None


def _run_path(llm: Any, contexts: Sequence[Sequence[int]], path: str) -> "torch.Tensor":
    """Every context's row computed along ``path`` (:data:`PATHS`)."""
    import torch

    llm.clear_cache()
    if path == "batched":
        return llm.batch_next_token_logprobs_sync([list(c) for c in contexts]).detach().cpu()
    out = []
    for ctx in contexts:
        llm.clear_cache()
        if path == "alone":
            uncached = getattr(llm, "next_token_logprobs_uncached", None)
            row = uncached(list(ctx)) if uncached is not None else llm.next_token_logprobs_sync(list(ctx))
        else:  # extended: a context of one token has no prefix to extend and is computed alone
            if len(ctx) > 1:
                llm.next_token_logprobs_sync(list(ctx[: len(ctx) // 2]))
            row = llm.next_token_logprobs_sync(list(ctx))
        out.append(row.detach().cpu())
    llm.clear_cache()
    return torch.stack(out)


def compare_paths(
    backend: str,
    paths: Sequence[str] = tuple(PATHS),
    model: str | None = None,
    prompts: Sequence[str] = DEFAULT_PROMPTS,
    dtype: str = "float32",
    options: Mapping[str, Any] | None = None,
) -> CompareResult:
    """One backend against itself: the same contexts along each of ``paths`` (:data:`PATHS`),
    compared pairwise (labels ``backend:path``). Whether a row depends on its batch-mates
    (``alone`` vs ``batched``) or on the cached KV it extends (``alone`` vs ``extended``)."""
    import genlm_core

    paths = list(dict.fromkeys(paths))
    unknown = [p for p in paths if p not in PATHS]
    if unknown or len(paths) < 2:
        raise ValueError(
            f"compare: --paths takes at least two of {', '.join(PATHS)}, got {', '.join(paths) or 'none'}"
        )
    llm = genlm_core.load(backend, **{"dtype": dtype, "model": model, **(options or {})})
    try:
        contexts = tokenize_prompts(llm, prompts, llm.max_context_length)
        rows: dict[str, Any] = {}
        described: dict[str, dict[str, Any]] = {}
        for p in paths:
            before = _reused(llm)
            rows[f"{backend}:{p}"] = _run_path(llm, contexts, p)
            described[f"{backend}:{p}"] = {**_describe(llm), "path": PATHS[p]}
            if before is not None:  # whether "extended" really extended cached KV
                described[f"{backend}:{p}"]["tokens_reused"] = _reused(llm) - before
    finally:
        llm.close()
    return CompareResult(backends=described, contexts=contexts, texts=list(prompts), pairs=compare_rows(rows))
