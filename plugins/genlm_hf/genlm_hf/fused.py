"""A fused decode step for Llama-architecture models: the decode step in fewer kernels.

A captured decode step (:mod:`genlm_hf.step`) replays every kernel the model's forward
launches. transformers' Llama layer launches about 48 for one new token: its RMSNorm is
six elementwise kernels (cast, square, mean, add, rsqrt, two multiplies), q, k and v
are three GEMMs, the rotary embedding ten more (``rotate_half`` is a slice, a negation
and a concatenation, for q and for k), and the residual adds are kernels of their own. A
replay of such small kernels costs a few microseconds each whatever they compute
(docs/gpu.md has the figures).

:class:`FusedLlama` computes the same step from the same weights in fewer kernels:

- RMSNorm is ``torch.nn.functional.rms_norm`` (one fused kernel on CUDA);
- q, k and v are one GEMM over their weights concatenated, and the MLP's gate and up
  projections one GEMM too. The model's own ``q_proj``/``k_proj``/``v_proj`` (and
  ``gate_proj``/``up_proj``) weights become views of the concatenated tensor, so no
  weight is held twice and the model's forward (prompts, the eager pass) reads the very
  same numbers;
- the rotary embedding is applied to q and k together, in place in the GEMM's output (a
  concatenation swapping the halves, then ``q * cos + rot * sin'`` where ``sin'`` carries
  ``rotate_half``'s negation), with ``cos``/``sin`` computed once a step by the model's
  own rotary module (so its rope type and scaling are the model's);
- attention is the KV pool's (:class:`~genlm_hf.attention.PoolPass`): the new key and
  value go into the pool, a shared prefix is read once for every row;
- the output and down projections add their residual in the GEMM, in place (``addmm_``:
  an ``addmm`` into a new tensor first copies the residual there, one more kernel each).

Rows equal the model's own forward up to rounding order (a fused residual add, float32
normalisation inside the RMSNorm kernel): ``plugins/genlm_hf/tests/test_hf_fused.py``
checks it against the uncached model at the derived bounds of
:mod:`genlm_core.testing.tolerance`, for float32 and bfloat16, with grouped-query
attention, scaled rope and every architecture below.

Eligible: transformers' ``LlamaForCausalLM`` (SmolLM2, Llama 2/3, TinyLlama, ...),
``MistralForCausalLM`` and ``Qwen2ForCausalLM`` (q/k/v biases: one bias for the one GEMM)
without a sliding window, and ``Qwen3ForCausalLM`` (q and k normalised per head: one norm
over both, times their weights), whose projections are plain ``torch.nn.Linear`` layers
(no quantisation, no LoRA adapters: an engine that loads an adapter turns the fused step
off) without output or MLP biases, on one device, with SiLU and a rope type whose
frequencies do not depend on the length (``default``, ``linear``, ``llama3``). Anything
else runs the model's own forward (``stats()["engine"]["fused_decode_off"]`` says why).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["ARCHITECTURES", "FusedLlama", "fused_reason"]

#: rope types whose inverse frequencies are fixed (``dynamic`` rescales them with the length)
_STATIC_ROPE = ("default", "linear", "llama3")


def _rope_type(config: Any) -> str:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return str(
        params.get("rope_type", params.get("type", "default")) if isinstance(params, dict) else "default"
    )


#: transformers' causal LMs of the Llama family the fused step runs (Qwen2: q/k/v biases;
#: Qwen3: q and k normalised per head)
ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


def _is_transformers_class(model: Any) -> bool:
    cls = type(model)
    return cls.__name__ in ARCHITECTURES and cls.__module__.startswith("transformers.models.")


def fused_reason(model: Any) -> str | None:
    """Why ``model`` cannot take the fused step; None when it can."""
    if not _is_transformers_class(model):
        names = ", ".join(ARCHITECTURES)
        return f"{type(model).__name__} is not one of transformers' {names}"
    config = model.config
    if getattr(config, "mlp_bias", False):
        return "the model's MLP projections have biases"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r} (the fused step computes SiLU)"
    if (getattr(config, "pretraining_tp", 1) or 1) != 1:
        return "pretraining_tp > 1"
    if getattr(config, "sliding_window", None) is not None:
        return f"sliding-window attention (sliding_window={config.sliding_window})"
    rope = _rope_type(config)
    if rope not in _STATIC_ROPE:
        return f"rope type {rope!r} (fused: {', '.join(_STATIC_ROPE)})"
    if len(set((getattr(model, "hf_device_map", None) or {}).values())) > 1:
        return "the model is dispatched over several devices (device_map)"
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        for lin in (
            attn.q_proj,
            attn.k_proj,
            attn.v_proj,
            attn.o_proj,
            mlp.gate_proj,
            mlp.up_proj,
            mlp.down_proj,
        ):
            if type(lin) is not torch.nn.Linear:
                return f"a projection is a {type(lin).__name__} (quantised or adapted), not a plain Linear"
        if attn.o_proj.bias is not None or mlp.down_proj.bias is not None or mlp.gate_proj.bias is not None:
            return "the model's output or MLP projections have biases"
        if len({lin.bias is None for lin in (attn.q_proj, attn.k_proj, attn.v_proj)}) > 1:
            return "some of the q/k/v projections have biases and others not"
    head = model.lm_head
    if type(head) is not torch.nn.Linear or head.bias is not None:
        return f"the head is a {type(head).__name__}, not a plain Linear"
    params = {(p.device, p.dtype) for p in model.parameters()}
    if len(params) != 1:
        return "the model's weights are not all of one device and dtype"
    return None


def _concat(mods: list[torch.nn.Linear], name: str) -> torch.Tensor:
    """One tensor of ``mods``' ``name`` (``weight``: ``(sum of outs, in)``; ``bias``), each
    module's own becoming a view of it."""
    whole = torch.cat([getattr(m, name).detach() for m in mods], dim=0).contiguous()
    start = 0
    for m in mods:
        rows = getattr(m, name).shape[0]
        getattr(m, name).data = whole[start : start + rows]
        start += rows
    return whole


class _Layer:
    __slots__ = (
        "w_in",
        "eps_in",
        "qkv",
        "qkv_bias",
        "qk_norm",
        "eps_qk",
        "o",
        "w_post",
        "eps_post",
        "gate_up",
        "down",
        "inter",
    )

    def __init__(self, layer: Any, heads: int, kv_heads: int) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.w_in = layer.input_layernorm.weight.detach()
        self.eps_in = float(layer.input_layernorm.variance_epsilon)
        projections = [attn.q_proj, attn.k_proj, attn.v_proj]
        self.qkv = _concat(projections, "weight")
        self.qkv_bias = _concat(projections, "bias") if attn.q_proj.bias is not None else None
        # Qwen3: q and k normalised per head before the rotary embedding, each with its own
        # weight: one weightless norm over every head of both, times their weights stacked
        self.qk_norm: torch.Tensor | None = None
        self.eps_qk = 0.0
        if getattr(attn, "q_norm", None) is not None:
            q_w, k_w = attn.q_norm.weight.detach(), attn.k_norm.weight.detach()
            self.qk_norm = torch.cat([q_w.expand(heads, -1), k_w.expand(kv_heads, -1)]).contiguous()
            self.eps_qk = float(attn.q_norm.variance_epsilon)
        self.o = attn.o_proj.weight.detach()
        self.w_post = layer.post_attention_layernorm.weight.detach()
        self.eps_post = float(layer.post_attention_layernorm.variance_epsilon)
        self.gate_up = _concat([mlp.gate_proj, mlp.up_proj], "weight")
        self.down = mlp.down_proj.weight.detach()
        self.inter = mlp.gate_proj.weight.shape[0]


class FusedLlama:
    """The fused step of one model of :data:`ARCHITECTURES` (see the module); build it with
    :meth:`build`, which re-points the model's q/k/v and gate/up weights at the
    concatenated tensors (values unchanged, nothing held twice)."""

    def __init__(self, model: Any) -> None:
        config = model.config
        inner = model.model
        self.embed = inner.embed_tokens.weight.detach()
        self.rotary = inner.rotary_emb
        self.layers = [
            _Layer(layer, config.num_attention_heads, config.num_key_value_heads) for layer in inner.layers
        ]
        self.w_final = inner.norm.weight.detach()
        self.eps_final = float(inner.norm.variance_epsilon)
        self.head = model.lm_head.weight.detach()
        attn = inner.layers[0].self_attn
        self.head_dim = int(attn.head_dim)
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.groups = self.heads // self.kv_heads
        self.scaling = float(attn.scaling)
        self.hidden = int(config.hidden_size)

    @classmethod
    def build(cls, model: Any) -> FusedLlama:
        reason = fused_reason(model)
        if reason is not None:
            raise ValueError(f"hf: the fused decode step cannot run this model: {reason}")
        with torch.no_grad():
            return cls(model)

    def step(self, ids: torch.Tensor, pos: torch.Tensor, attend: Any) -> torch.Tensor:
        """The ``(B, V')`` logits of token ``ids[i, 0]`` at position ``pos[i, 0]`` of row
        ``i``; each layer's queries, new keys and values go to ``attend(layer, q, k, v,
        scaling)`` (a :class:`~genlm_hf.attention.PoolPass`'s: it writes the KV into the
        pool and attends, returning ``[B, 1, Hq, D]``). Reads only static tensors
        (capturable)."""
        B = ids.shape[0]
        D, Hq, Hk = self.head_dim, self.heads, self.kv_heads
        h = F.embedding(ids.view(B), self.embed)  # (B, hidden)
        cos, sin = self.rotary(h, pos)  # (B, 1, D) in the model's dtype, its rope type's scaling
        half = D // 2
        # rotate_half(x) * sin == cat(x2, x1) * cat(-sin1, sin2): the negation moves to sin, once
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        for i, lw in enumerate(self.layers):
            a = F.rms_norm(h, (self.hidden,), lw.w_in, lw.eps_in)
            qkv = F.linear(a, lw.qkv, lw.qkv_bias)  # (B, (Hq + 2 Hk) D): [q | k | v] per row
            qk = qkv[:, : (Hq + Hk) * D].view(B, Hq + Hk, D)
            x = qk
            if lw.qk_norm is not None:
                x = F.rms_norm(qk, (D,), None, lw.eps_qk) * lw.qk_norm
            rot = torch.cat((x[..., half:], x[..., :half]), dim=-1)
            torch.addcmul(x * cos, rot, sin, out=qk)  # rotated in place
            q = qkv[:, : Hq * D].view(B, Hq, 1, D)
            k = qkv[:, Hq * D : (Hq + Hk) * D].view(B, Hk, 1, D)
            v = qkv[:, (Hq + Hk) * D :].view(B, Hk, 1, D)
            out = attend(i, q, k, v, self.scaling).reshape(B, Hq * D)
            h.addmm_(out, lw.o.t())  # in place: no copy of h into a new output first
            a = F.rms_norm(h, (self.hidden,), lw.w_post, lw.eps_post)
            gate_up = F.linear(a, lw.gate_up)
            h.addmm_(F.silu(gate_up[:, : lw.inter]) * gate_up[:, lw.inter :], lw.down.t())
        h = F.rms_norm(h, (self.hidden,), self.w_final, self.eps_final)
        return F.linear(h, self.head)
