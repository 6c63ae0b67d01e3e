"""The scripts of public calls run on both stacks: genlm-backend 0.3.1 + genlm-bytes 0.2.0
(the reference venv) and genlm-core + genlm-compat (installed from wheels).

Usage: ``python cases.py MODELS_JSON [CASE ...]`` prints ``{case: {observation: record}}``
as one JSON line (``--list`` prints the cases with the issue rows and public names each
covers). Only ``genlm.backend`` / ``genlm.bytes`` (and torch, NumPy, transformers) are
imported: the same file runs on either stack. ``MODELS_JSON`` holds the folders the
driver built: ``tiny-gpt2`` and ``tiny-llama`` (genlm-core's offline test models),
``gpt2-1024`` (GPT-2's real 50,257-token tokenizer, 1,024 positions, one tiny layer) and
``lora`` (a LoRA adapter of ``tiny-gpt2``).

Tolerances (the bounds each comparison states):

* logprobs: the same float32 model run by two engines that pad, batch and reuse KV
  differently: a few float32 ulps of logits of size ~10 through the layers (the bound
  of ``tests/test_anchor_oracle.py``);
* float64 trie masses of float64 weights: sums of at most ``len(vocab)`` terms taken in
  another order differ by at most ``len(vocab) * eps64`` of the total;
* float32 trie masses: genlm-bytes and ``ParallelTokenCharacterTrie`` accumulate in
  float32 (sparse mat-vec), genlm-core in float64: at most ``len(vocab) * eps32`` of
  the total apart.
"""

from __future__ import annotations

import asyncio
import json
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from recording import aobserve, encode, num, observe

warnings.simplefilter("ignore")

LOGPROB_ATOL = 1e-4
EPS64 = 2.0**-52
EPS32 = 2.0**-23


@dataclass
class Case:
    name: str
    fn: Callable[..., Any]
    rows: tuple[int, ...]
    names: tuple[str, ...]
    isolated: bool = False


CASES: dict[str, Case] = {}


def case(
    rows: tuple[int, ...] = (), names: tuple[str, ...] = (), isolated: bool = False
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a case; ``rows``: the issue rows it checks; ``names``: the public names it
    exercises; ``isolated``: run it in a process of its own (a crash ends only it)."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        CASES[fn.__name__] = Case(fn.__name__, fn, rows, names, isolated)
        return fn

    return deco


@dataclass
class Ctx:
    """The model folders and the objects built from them (one of each per process)."""

    paths: dict[str, str]
    _llms: dict[str, Any] = field(default_factory=dict)

    def llm(self, name: str = "tiny-gpt2") -> Any:
        if name not in self._llms:
            from genlm.backend import load_model_by_name

            opts = {"hf_opts": {"torch_dtype": torch.float32}}
            self._llms[name] = load_model_by_name(self.paths[name], backend="hf", llm_opts=opts)
        return self._llms[name]

    def tokenizer(self, name: str = "tiny-gpt2") -> Any:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(self.paths[name])


def weights(n: int, seed: int = 0) -> np.ndarray:
    """A distribution over ``n`` tokens, the same on both sides (integer arithmetic, then
    one normalisation): trie results are compared without the model's differences."""
    w = ((np.arange(n, dtype=np.int64) * 7919 + seed * 104729) % 1009 + 1).astype(np.float64) ** 3
    return w / w.sum()


def small_vocab() -> list[Any]:
    """Tokens with duplicate bytes, a shared prefix chain and an empty token."""
    from genlm.backend.tokenization import Token

    words = [b"ab", b"a", b"abc", b"b", b"a", b"ba", b"", b"<e>", b"bab", b"c"]
    return [Token(i, w) for i, w in enumerate(words)]


def logprobs_rec(x: Any) -> Any:
    return num(x, atol=LOGPROB_ATOL)


def long_row(x: Any) -> Any:
    """A 50k-entry logprob row: every 16th entry and the argmax (keeps the records small)."""
    return {"every16": num(x[::16], atol=LOGPROB_ATOL), "argmax": int(x.argmax()), "len": len(x)}


def csr(m: Any) -> Any:
    """A sparse torch matrix as its CSR arrays (layout, shape, row pointers, columns, values)."""
    c = m.to_sparse_csr()
    return {"layout": str(m.layout), "shape": list(m.shape), "crow": num(c.crow_indices()),
            "col": num(c.col_indices()), "values": num(c.values())}  # fmt: skip


def digest(items: list[Any]) -> Any:
    """A long vocabulary as its length and a SHA-256 of its exact entries."""
    import hashlib

    h = hashlib.sha256()
    for t in items:
        h.update(repr((getattr(t, "token_id", None), bytes(t) if isinstance(t, bytes) else t)).encode())
    return {"len": len(items), "sha256": h.hexdigest()}


def masses64(n: int) -> Callable[[Any], Any]:
    return lambda x: num(x, atol=n * EPS64)


def masses32(n: int) -> Callable[[Any], Any]:
    # float32 accumulation of up to n terms of a distribution (total 1)
    return lambda x: num(x, atol=n * EPS32)


# --------------------------------------------------------------------------- vocabularies


@case(names=("decode_vocab", "Token", "load_model_by_name", "AsyncTransformer", "bytes_to_strs"))
def vocabularies(ctx: Ctx) -> dict[str, Any]:
    """Byte vocabularies byte for byte, and the string vocabularies of every fallback."""
    from genlm.backend import decode_vocab
    from genlm.backend.tokenization.vocab import bytes_to_strs

    out = {}
    for name in ("tiny-gpt2", "tiny-llama", "gpt2-1024"):
        tok = ctx.tokenizer(name)
        byte_vocab, str_vocab = decode_vocab(tok)
        out[f"{name}.byte_vocab"] = {"value": digest(byte_vocab)}
        out[f"{name}.str_vocab"] = {"value": digest(str_vocab)}
        out[f"{name}.types"] = {"value": sorted({type(t).__name__ for t in byte_vocab})}
        for fallback in ("latin1", "replace"):
            out[f"{name}.{fallback}"] = observe(
                lambda tok=tok, f=fallback: decode_vocab(tok, byte2str_fallback=f)[1], digest
            )
        out[f"{name}.bytes_to_strs"] = observe(
            lambda tok=tok, v=byte_vocab: bytes_to_strs(tok, [bytes(t) for t in v], "replace"), digest
        )
    out["bad_fallback"] = observe(lambda: decode_vocab(tok, byte2str_fallback="nope"))
    out["llm.byte_vocab"] = observe(lambda: ctx.llm("tiny-gpt2").byte_vocab)
    out["llm.str_vocab"] = observe(lambda: ctx.llm("tiny-gpt2").str_vocab)
    return out


@case(rows=(15,), names=("Token",))
def token_objects() -> dict[str, Any]:
    from genlm.backend.tokenization import Token

    a, b, c = Token(3, b"ab"), Token(4, b"ab"), Token(3, b"xy")
    return {
        "str_id": observe(lambda: Token("1", b"a")),
        "float_id": observe(lambda: Token(1.5, b"a")),
        "str_bytes": observe(lambda: Token(1, "a")),
        "keywords": observe(lambda: Token(token_id=2, byte_string=b"q")),
        "fields": observe(lambda: [a.token_id, a.byte_string, bytes(a), len(a), a.decode()]),
        "equality": observe(
            lambda: [a == b, a == c, a == b"ab", hash(a) == hash(c), a < b, sorted([b, a]) == [a, b]]
        ),
        "helpers": observe(
            lambda: [
                Token.as_bytes(a),
                Token.as_bytes(b"z"),
                Token.is_plain_bytes(a),
                Token.is_plain_bytes(b"z"),
                b"".join([a, b]),
            ]
        ),  # fmt: skip
        "pickle": observe(lambda: __import__("pickle").loads(__import__("pickle").dumps(a))),
    }


# --------------------------------------------------------------------------- language models


@case(names=("AsyncLM", "AsyncTransformer", "load_model_by_name"))
def logprobs_every_entry_point(ctx: Ctx) -> dict[str, Any]:
    from genlm.backend.llm import AsyncLM

    llm = ctx.llm("tiny-gpt2")
    ids = llm.tokenizer.encode("The capital of France is")
    contexts = [ids, ids[:-1], ids[:2], [0]]

    async def run() -> dict[str, Any]:
        return {
            "async": await aobserve(lambda: llm.next_token_logprobs(ids), logprobs_rec),
            "batch": await aobserve(lambda: llm.batch_next_token_logprobs(contexts), logprobs_rec),
            "gather": await aobserve(
                lambda: asyncio.gather(*(llm.next_token_logprobs(c) for c in contexts)),
                lambda rows: [logprobs_rec(r) for r in rows],
            ),
        }

    out = {
        f"sync{i}": observe(lambda c=c: llm.next_token_logprobs_sync(c), logprobs_rec)
        for i, c in enumerate(contexts)
    }
    out["batch_sync"] = observe(lambda: llm.batch_next_token_logprobs_sync(contexts), logprobs_rec)
    out.update(asyncio.run(run()))
    out["uncached"] = observe(lambda: llm.next_token_logprobs_uncached(ids), logprobs_rec)
    out["is_async_lm"] = observe(lambda: isinstance(llm, AsyncLM))
    out["clear_cache"] = observe(
        lambda: (llm.clear_cache(), llm.next_token_logprobs_sync(ids))[1], logprobs_rec
    )
    other = ctx.llm("tiny-llama")
    out["llama"] = observe(
        lambda: other.next_token_logprobs_sync(other.tokenizer.encode("Hello world")), logprobs_rec
    )
    return out


@case(rows=(12,), names=("AsyncTransformer",))
def transformer_options(ctx: Ctx) -> dict[str, Any]:
    from genlm.backend.llm import AsyncTransformer

    base = ctx.llm("tiny-gpt2")
    llm = AsyncTransformer(base.model, base.tokenizer, batch_size=3, timeout=0.01)
    ids = base.tokenizer.encode("hello there")
    return {
        "batch_size": observe(lambda: llm.batch_size),
        "timeout": observe(lambda: llm.timeout),
        "logprobs": observe(lambda: llm.next_token_logprobs_sync(ids), logprobs_rec),
        "kv": observe(lambda: [llm.cache_kv(ids), llm.clear_kv_cache(), llm.reset_async_queries()]),
    }


@case(rows=(12,), names=("AsyncTransformer", "TokenTrie"))
def walk_cache(ctx: Ctx) -> dict[str, Any]:
    """``cache_kv`` pins a prompt; ``walk_cache`` finds it: (node, tokens matched, past, base)."""
    llm = ctx.llm("tiny-gpt2")
    llm.clear_cache()
    prompt = llm.tokenizer.encode("A tiny walk")
    llm.cache_kv(prompt)

    def walk(ids: list[int]) -> Any:
        node, n, past, base = llm.walk_cache(ids)
        return {"n": n, "past": past is not None, "base": base, "logprobs": logprobs_rec(node.logprobs)}

    return {
        "pinned": observe(lambda: walk(prompt + [5])),
        "exact": observe(lambda: walk(prompt)),
        "unseen": observe(lambda: llm.walk_cache([7, 7, 7])[1]),
    }


@case(rows=(12,), names=("AsyncTransformer",))
def lora_adapters(ctx: Ctx) -> dict[str, Any]:
    """Adapters are named per call (``lora_name=``); ``set_lora``/``clear_lora`` are gone."""
    from genlm.backend.llm import AsyncTransformer

    base = ctx.llm("tiny-gpt2")
    llm = AsyncTransformer.from_name(ctx.paths["tiny-gpt2"], hf_opts={"torch_dtype": torch.float32})
    ids = base.tokenizer.encode("adapters")
    out = {
        "add": observe(lambda: llm.add_new_lora(ctx.paths["lora"], "a")),
        "with": observe(lambda: llm.next_token_logprobs_sync(ids, lora_name="a"), logprobs_rec),
        "without": observe(lambda: llm.next_token_logprobs_sync(ids), logprobs_rec),
    }

    async def mixed() -> Any:
        rows = await asyncio.gather(
            llm.next_token_logprobs(ids + [1], lora_name="a"),
            llm.next_token_logprobs(ids + [1]),
            llm.next_token_logprobs(ids + [2], lora_name="a"),
        )
        return [logprobs_rec(r) for r in rows]

    out["mixed_async"] = observe(lambda: asyncio.run(mixed()))
    out["sample"] = observe(lambda: asyncio.run(llm.sample(ids, 4, [], seed=1, lora_name="a")))
    out["unknown"] = observe(lambda: llm.next_token_logprobs_sync(ids, lora_name="nope"))
    out["set_lora"] = observe(lambda: llm.set_lora(ctx.paths["lora"], "b"))
    out["clear_lora"] = observe(lambda: llm.clear_lora())
    out["replace"] = observe(lambda: llm.add_new_lora(ctx.paths["lora"], "a"))
    out["remove"] = observe(lambda: llm.remove_lora("a"))
    out["after_remove"] = observe(lambda: llm.next_token_logprobs_sync(ids + [3], lora_name="a"))
    out["base_after"] = observe(lambda: llm.next_token_logprobs_sync(ids), logprobs_rec)
    return out


@case(rows=(10,), names=("AsyncLM",))
def sampling(ctx: Ctx) -> dict[str, Any]:
    llm = ctx.llm("tiny-gpt2")
    ids = llm.tokenizer.encode("Once upon")
    eos = [llm.tokenizer.eos_token_id]
    return {
        "seeded": observe(lambda: asyncio.run(llm.sample(ids, 8, eos, seed=3))),
        "temperature": observe(lambda: asyncio.run(llm.sample(ids, 8, eos, temperature=0.5, seed=3))),
        "no_eos": observe(lambda: asyncio.run(llm.sample(ids, 6, [], seed=4))),
        "batch_same_seed": observe(lambda: asyncio.run(llm.batch_sample([ids, ids, ids], 5, [], seed=9))),
        "batch_prompts": observe(lambda: asyncio.run(llm.batch_sample([ids, ids[:1]], 5, eos, seed=2))),
        "zero_tokens": observe(lambda: asyncio.run(llm.sample(ids, 0, eos, seed=1))),
    }


@case(rows=(8, 9, 14), names=("AsyncTransformer",))
def context_window(ctx: Ctx) -> dict[str, Any]:
    """GPT-2 (1,024 positions): a context filling the window is scored; one past it raises
    (IndexError in the reference); sampling past the window raises too."""
    llm = ctx.llm("gpt2-1024")
    full = [464] * 1024
    return {
        "full_window": observe(lambda: llm.next_token_logprobs_sync(full), long_row),
        "full_window_async": observe(
            lambda: asyncio.run(llm.next_token_logprobs(full[:-1] + [11])), long_row
        ),
        "past_window": observe(lambda: llm.next_token_logprobs_sync([464] * 1025)),
        "sample_fits": observe(lambda: asyncio.run(llm.sample([464] * 1021, 3, [], seed=0))),
        "sample_past_window": observe(lambda: asyncio.run(llm.sample([464] * 1022, 4, [], seed=0))),
        "sample_to_the_edge": observe(lambda: asyncio.run(llm.sample([262] * 1021, 4, [], seed=5))),
    }


@case(rows=(14,), names=("AsyncTransformer",))
def bad_token_ids(ctx: Ctx) -> dict[str, Any]:
    """Each bad context is new (no cached prefix answers it)."""
    llm = ctx.llm("tiny-gpt2")
    V = len(llm.byte_vocab)
    bad = {"out_of_range": [11, V], "negative": [12, -1], "float": [13, 7.5], "empty": []}
    out = {f"sync.{k}": observe(lambda c=c: llm.next_token_logprobs_sync(c)) for k, c in bad.items()}
    out.update(
        {f"async.{k}": observe(lambda c=c: asyncio.run(llm.next_token_logprobs(c))) for k, c in bad.items()}
    )
    out["batch"] = observe(lambda: llm.batch_next_token_logprobs_sync([[14, 15], [16, V + 3]]))
    out["healthy"] = observe(lambda: llm.next_token_logprobs_sync([17, 18]), logprobs_rec)
    return out


# --------------------------------------------------------------------------- tries


def backend_trie_structure(trie: Any) -> dict[str, Any]:
    n = len(trie.children)
    return {
        "root": observe(lambda: trie.root),
        "nodes": observe(lambda: n),
        "children": observe(lambda: [list(trie.children[i].items()) for i in range(n)]),
        "node2prefix": observe(lambda: [trie.node2prefix[i] for i in range(n)]),
        "word2leaf": observe(lambda: list(trie.word2leaf.items())),
        "leaf2word": observe(lambda: list(trie.leaf2word.items())),
        "jump": observe(lambda: [[int(c) for c in j] for j in trie.jump]),
        "ordering": observe(lambda: trie.ordering),
    }


@case(rows=(7,), names=("TokenCharacterTrie", "ParallelTokenCharacterTrie"))
def character_trie_structure(ctx: Ctx) -> dict[str, Any]:
    from genlm.backend.trie import ParallelTokenCharacterTrie, TokenCharacterTrie

    out = {}
    for vname, vocab in (("tiny", ctx.llm("tiny-gpt2").byte_vocab), ("small", small_vocab())):
        trie = TokenCharacterTrie(vocab)
        for k, v in backend_trie_structure(trie).items():
            out[f"{vname}.{k}"] = v
        out[f"{vname}.idx_to_leaf"] = observe(lambda t=trie: t.idx_to_leaf)
        par = ParallelTokenCharacterTrie(vocab, device="cpu")
        out[f"{vname}.parallel.children"] = observe(lambda t=par: [list(c.items()) for c in t.children])
        out[f"{vname}.parallel.M"] = observe(lambda t=par: t.M, csr)
        out[f"{vname}.parallel.positions"] = observe(lambda t=par: t.positions)
    return out


@case(rows=(7, 1), names=("TokenByteTrie",))
def byte_trie_structure(ctx: Ctx) -> dict[str, Any]:
    from genlm.bytes import TokenByteTrie

    out = {}
    tries = {
        "tiny": TokenByteTrie(ctx.llm("tiny-gpt2").byte_vocab, device="cpu"),
        "small": TokenByteTrie(
            small_vocab(), device="cpu", atomic_byte_strings=[b"ba"], eos_byte_strings={b"<e>"}
        ),
        "sentinel": TokenByteTrie(small_vocab(), device="cpu", eot_sentinel=b"$"),
    }
    for name, trie in tries.items():
        for k, v in backend_trie_structure(trie).items():
            out[f"{name}.{k}"] = v
        for attr in ("eos_node", "token_id_to_leaf", "eos_token_ids", "eos_byte_strings", "max_batch_size",
                     "device", "eot_sentinel"):  # fmt: skip
            out[f"{name}.{attr}"] = observe(lambda t=trie, a=attr: getattr(t, a))
        out[f"{name}.eos_edge"] = observe(lambda t=trie: t.children[t.root][257])
        out[f"{name}.leaf2token_id"] = observe(
            lambda t=trie: {int(k): int(v) for k, v in t.leaf2token_id.items()}
        )
        out[f"{name}.lookup"] = observe(lambda t=trie: t.lookup)
        for m in ("M", "M_no_eos", "M_with_eos"):
            out[f"{name}.{m}"] = observe(lambda t=trie, m=m: getattr(t, m), csr)
    return out


@case(rows=(1,), names=("TokenByteTrie", "AsyncTokenByteTrie", "VocabularyEntryError"))
def byte_trie_constructor_errors(ctx: Ctx) -> dict[str, Any]:
    from genlm.backend.tokenization import Token
    from genlm.bytes import TokenByteTrie

    V = small_vocab()
    return {
        "empty": observe(lambda: TokenByteTrie([])),
        "strings": observe(lambda: TokenByteTrie(["a", "b"])),
        "plain_bytes": observe(lambda: TokenByteTrie([b"a", b"ab"], device="cpu").word2leaf),
        "atomic_missing": observe(lambda: TokenByteTrie(V, device="cpu", atomic_byte_strings=[b"zz"])),
        "eos_missing": observe(lambda: TokenByteTrie(V, device="cpu", eos_byte_strings={b"zz"})),
        "device": observe(lambda: TokenByteTrie(V, device="tpu")),
        "unknown": observe(lambda: TokenByteTrie(V, device="cpu", bogus=1)),
        "token_kind": observe(lambda: TokenByteTrie([Token(0, b"a"), "b"], device="cpu")),
    }


@case(rows=(4, 1), names=("TokenByteTrie", "TrieMode"))
def byte_trie_masses(ctx: Ctx) -> dict[str, Any]:
    from genlm.bytes import TokenByteTrie
    from genlm.bytes.trie import TrieMode

    llm = ctx.llm("tiny-gpt2")
    V = llm.byte_vocab
    eos = {bytes(V[0]), bytes(V[5])}
    trie = TokenByteTrie(V, device="cpu", eos_byte_strings=eos)
    p, q = weights(len(V), 1), weights(len(V), 2)
    rec = masses32(len(V))
    return {
        "modes": observe(lambda: [m.value for m in TrieMode]),
        "sum_np": observe(lambda: trie.weight_sum(p), rec),
        "sum_torch": observe(lambda: trie.weight_sum(torch.tensor(p)), rec),
        "sum_with_eos": observe(lambda: trie.weight_sum(p, TrieMode.WITH_EOS), rec),
        "max": observe(lambda: trie.weight_max(p), rec),
        "batch_sum": observe(lambda: trie.batch_weight_sum([p, q]), rec),
        "batch_sum_with_eos": observe(lambda: trie.batch_weight_sum([p, q], mode=TrieMode.WITH_EOS), rec),
        "batch_max": observe(lambda: trie.batch_weight_max([p, q]), rec),
        "list_weights": observe(lambda: trie.weight_sum(p.tolist()), rec),
    }


@case(rows=(1, 2), names=("AsyncTokenByteTrie", "AsyncTokenCharacterTrie", "TrieOp"))
def async_tries(ctx: Ctx) -> dict[str, Any]:
    from genlm.backend.trie import AsyncTokenCharacterTrie, ParallelTokenCharacterTrie, TokenCharacterTrie
    from genlm.bytes import AsyncTokenByteTrie
    from genlm.bytes.trie import TrieMode, TrieOp

    llm = ctx.llm("tiny-gpt2")
    V = llm.byte_vocab
    p, q = weights(len(V), 3), weights(len(V), 4)

    async def run() -> dict[str, Any]:
        out = {"ops": observe(lambda: [o.value for o in TrieOp])}
        bt = AsyncTokenByteTrie.from_vocab(V, eos_byte_strings={bytes(V[0])}, device="cpu")
        out["bytes.type"] = observe(lambda: type(bt.trie).__name__)
        out["bytes.sums"] = await aobserve(
            lambda: asyncio.gather(bt.weight_sum(p), bt.weight_sum(q, TrieMode.WITH_EOS), bt.weight_max(p)),
            lambda rs: [masses32(len(V))(r) for r in rs],
        )
        await bt.cleanup()
        out["bytes.after_cleanup"] = await aobserve(lambda: bt.weight_sum(p), masses32(len(V)))
        await bt.cleanup()
        for backend in ("sequential", "parallel"):
            ct = AsyncTokenCharacterTrie.from_vocab(V, backend=backend)
            out[f"{backend}.type"] = observe(lambda ct=ct: type(ct.trie).__name__)
            rec = masses64(len(V)) if backend == "sequential" else masses32(len(V))
            out[f"{backend}.sums"] = await aobserve(
                lambda ct=ct: asyncio.gather(ct.weight_sum(p), ct.weight_sum(q), ct.weight_max(q)),
                lambda rs, rec=rec: [rec(r) for r in rs],
            )
            await ct.cleanup()
        out["bad_backend"] = observe(lambda: AsyncTokenCharacterTrie.from_vocab(V, backend="nope"))
        for name, t in (
            ("wrap_seq", TokenCharacterTrie(V)),
            ("wrap_par", ParallelTokenCharacterTrie(V, device="cpu")),
        ):
            at = AsyncTokenCharacterTrie(t)
            out[name] = await aobserve(lambda at=at: at.weight_sum(p), masses32(len(V)))
            await at.cleanup()
        return out

    return asyncio.run(run())


@case(rows=(5, 6), names=("TokenCharacterTrie", "ParallelTokenCharacterTrie"))
def character_trie_masses(ctx: Ctx) -> dict[str, Any]:
    from genlm.backend.trie import ParallelTokenCharacterTrie, TokenCharacterTrie

    llm = ctx.llm("tiny-gpt2")
    V = llm.byte_vocab
    p, q = weights(len(V), 5), weights(len(V), 6)
    seq, par = TokenCharacterTrie(V), ParallelTokenCharacterTrie(V, device="cpu")
    r64, r32 = masses64(len(V)), masses32(len(V))
    ints = np.arange(len(V)) % 3
    return {
        "seq.np64": observe(lambda: seq.weight_sum(p), r64),
        "seq.torch": observe(lambda: seq.weight_sum(torch.tensor(p, dtype=torch.float32)), r32),
        "seq.np32": observe(lambda: seq.weight_sum(p.astype(np.float32)), r32),
        "seq.int": observe(lambda: seq.weight_sum(ints), r64),
        "seq.max": observe(lambda: seq.weight_max(p), r64),
        "seq.batch_sum": observe(lambda: seq.batch_weight_sum([p, q]), r64),
        "seq.batch_max": observe(lambda: seq.batch_weight_max([p, q]), r64),
        "par.np64": observe(lambda: par.weight_sum(p), r32),
        "par.torch": observe(lambda: par.weight_sum(torch.tensor(p)), r32),
        "par.max": observe(lambda: par.weight_max(p), r32),
        "par.batch_sum": observe(lambda: par.batch_weight_sum([p, q]), r32),
        "par.batch_max": observe(lambda: par.batch_weight_max([p, q]), r32),
        "par.device": observe(lambda: par.device),
        "par.bad_device": observe(lambda: ParallelTokenCharacterTrie(V, device="tpu")),
    }


@case(names=("TokenCharacterTrie",))
def character_trie_max_of_logprobs(ctx: Ctx) -> dict[str, Any]:
    """``weight_max`` of log-probabilities (negative weights)."""
    from genlm.backend.trie import TokenCharacterTrie

    llm = ctx.llm("tiny-gpt2")
    logp = np.log(weights(len(llm.byte_vocab), 7))
    return {"max": observe(lambda: TokenCharacterTrie(llm.byte_vocab).weight_max(logp), masses64(1))}


@case(names=("TokenCharacterTrie",), isolated=True)
def character_trie_bad_weights(ctx: Ctx) -> dict[str, Any]:
    """NaN, inf, too short and too long weight vectors."""
    from genlm.backend.trie import TokenCharacterTrie

    V = small_vocab()
    trie = TokenCharacterTrie(V)
    w = np.full(len(V), 0.1)
    nan, inf = w.copy(), w.copy()
    nan[2], inf[3] = np.nan, np.inf
    return {
        "nan": observe(lambda: trie.weight_sum(nan), masses64(len(V))),
        "inf": observe(lambda: trie.weight_sum(inf), masses64(len(V))),
        "short": observe(lambda: trie.weight_sum(w[:-3]), masses64(len(V))),
        "long": observe(lambda: trie.weight_sum(np.full(1 << 16, 0.1)), masses64(len(V))),
    }


# --------------------------------------------------------------------------- byte beam


@case(rows=(3, 11, 13), names=("ByteBeamState", "BeamParams", "LazyByteProbs", "Chart", "LazyTrieState"))
def byte_beam(ctx: Ctx) -> dict[str, Any]:
    from genlm.bytes import BeamParams, ByteBeamState

    llm = ctx.llm("tiny-gpt2")
    eos = bytes(llm.byte_vocab[llm.tokenizer.eos_token_id])

    def dist_rec(d: Any) -> Any:
        chart = d.materialize()
        return {
            "ps": num(np.asarray(d.ps, dtype=np.float64), atol=LOGPROB_ATOL),
            "getitem": num(np.array([d[32], d[None], d[257]]), atol=LOGPROB_ATOL),
            "chart": type(chart).__name__,
            "entries": len(chart),
            "keys": encode(list(chart.keys())),
            "argmax": chart.argmax(),
        }

    async def run() -> dict[str, Any]:
        out: dict[str, Any] = {}
        params = BeamParams(K=5, prune_threshold=0.0, eos_byte_strings=[eos])
        out["params"] = observe(
            lambda: [
                params.K,
                params.prune_threshold,
                params.verbose,
                params.eos_byte_strings,
                params.heal,
                params.heal_max_backoff,
                params.heal_max_splits,
            ]  # fmt: skip
        )
        beam = await ByteBeamState.initial(llm, params)
        out["initial.logZ"] = {"value": num(beam.logZ, atol=LOGPROB_ATOL)}
        out["initial.dist"] = await aobserve(beam.logp_next, dist_rec)
        beam = await beam.prefill(b"The cat")
        out["prefill.logZ"] = {"value": num(beam.logZ, atol=LOGPROB_ATOL)}
        out["prefill.len"] = {"value": len(beam)}
        out["prefill.states"] = observe(
            lambda: [
                [num(float(s.weight), atol=LOGPROB_ATOL), bytes(s.partial), s.terminated] for s in beam.states
            ]
        )
        out["prefill.dist"] = await aobserve(beam.logp_next, dist_rec)
        nxt = await (beam.prune() << 32)
        out["step.logZ"] = {"value": num(nxt.logZ, atol=LOGPROB_ATOL)}
        out["bad_byte"] = await aobserve(lambda: nxt.prune() << 300, len)
        out["pretty"] = await aobserve(
            nxt.logp_next,
            lambda d: {"type": type(d.pretty()).__name__, "keys": encode(list(d.pretty().keys()))},
        )
        out["greedy"] = await aobserve(lambda: beam.greedy(b"", 4))
        out["opts.max_batch_size"] = await aobserve(
            lambda: ByteBeamState.initial(llm, params, trie_opts={"max_batch_size": 100}), lambda b: len(b)
        )
        with_opts = await ByteBeamState.initial(llm, params, trie_opts={"max_batch_size": 2, "device": "cpu"})
        out["opts.prefill"] = await aobserve(
            lambda: with_opts.prefill(b"The cat"), lambda b: num(b.logZ, atol=LOGPROB_ATOL)
        )
        out["opts.unknown"] = await aobserve(
            lambda: ByteBeamState.initial(llm, params, trie_opts={"bogus": 1})
        )
        await beam.cleanup()
        await nxt.cleanup()
        return out

    return asyncio.run(run())


@case(names=("StatefulTokenizedLM",))
def stateful_lm(ctx: Ctx) -> dict[str, Any]:
    from genlm.bytes import StatefulTokenizedLM

    llm = ctx.llm("tiny-gpt2")
    lm = StatefulTokenizedLM.initial(llm, initial_context=[1, 2, 3], max_context_length=3)
    nxt = lm << 4
    return {
        "context": observe(lambda: list(nxt.context)),
        "logp_next": observe(lambda: asyncio.run(nxt.logp_next()), logprobs_rec),
        "limit_kept": observe(lambda: [nxt.max_context_length, list((nxt << 5 << 6).context)]),
        "default": observe(lambda: list(StatefulTokenizedLM.initial(llm).context)),
    }


@case(names=("BeamParams",))
def beam_params_validation() -> dict[str, Any]:
    from genlm.bytes import BeamParams

    return {
        "positional": observe(lambda: BeamParams(4, 0.01, False, [b"<e>"], False, 2, 1).eos_byte_strings),
        "eos_tokens_alias": observe(lambda: BeamParams(K=3, eos_tokens=[b"x"]).eos_byte_strings),
        "both": observe(lambda: BeamParams(K=3, eos_tokens=[b"x"], eos_byte_strings=[b"y"])),
        "none": observe(lambda: BeamParams(K=3).eos_byte_strings),
        "negative_threshold": observe(lambda: BeamParams(K=3, prune_threshold=-0.5)),
        "zero_width": observe(lambda: BeamParams(K=0).K),
        "threshold_one": observe(lambda: BeamParams(K=2, prune_threshold=1.5).prune_threshold),
        "lone_bytes": observe(lambda: BeamParams(K=5, eos_byte_strings=b"<e>").eos_byte_strings),
    }


# --------------------------------------------------------------------------- the better list


@case(names=("AsyncTransformer",))
def batch_with_one_bad_request(ctx: Ctx) -> dict[str, Any]:
    """Concurrent callers: one asks with an out-of-range id."""
    llm = ctx.llm("tiny-gpt2")
    V = len(llm.byte_vocab)

    async def run() -> list[Any]:
        return await asyncio.gather(
            llm.next_token_logprobs([30, 31]), llm.next_token_logprobs([32, V + 1]), return_exceptions=True
        )

    def rec(rs: list[Any]) -> Any:
        return [r.__class__.__name__ if isinstance(r, BaseException) else logprobs_rec(r) for r in rs]

    return {"callers": observe(lambda: asyncio.run(run()), rec)}


@case(names=("AsyncTransformer",))
def results_belong_to_the_caller(ctx: Ctx) -> dict[str, Any]:
    llm = ctx.llm("tiny-gpt2")
    first = llm.next_token_logprobs_sync([40, 41])
    first[:] = 0.0
    return {"again": observe(lambda: llm.next_token_logprobs_sync([40, 41]), logprobs_rec)}


@case(names=("AsyncTransformer",))
def empty_batch(ctx: Ctx) -> dict[str, Any]:
    llm = ctx.llm("tiny-gpt2")
    return {
        "sync": observe(lambda: llm.batch_next_token_logprobs_sync([])),
        "async": observe(lambda: asyncio.run(llm.batch_next_token_logprobs([]))),
    }


@case(names=("MockAsyncLM",))
def mock_lm(ctx: Ctx) -> dict[str, Any]:
    from genlm.backend.llm import MockAsyncLM

    mock = MockAsyncLM(ctx.tokenizer("tiny-gpt2"))
    V = len(mock.byte_vocab)
    return {
        "vocab": observe(lambda: mock.byte_vocab),
        "shape": observe(lambda: list(mock.next_token_logprobs_sync([1, 2]).shape)),
        "out_of_range": observe(lambda: mock.next_token_logprobs_sync([V + 5]).shape[0]),
        "empty": observe(lambda: mock.next_token_logprobs_sync([]).shape[0]),
        "from_name": observe(lambda: len(MockAsyncLM.from_name(ctx.paths["tiny-gpt2"]).byte_vocab)),
    }


# --------------------------------------------------------------------------- the rest of the surface


@case(rows=(12,), names=("OutputCache",))
def output_cache() -> dict[str, Any]:
    from genlm.backend.cache import OutputCache

    def use() -> Any:
        c = OutputCache(2)
        a, b, d = torch.ones(3), torch.zeros(3), torch.full((3,), 2.0)
        c["a"] = a
        c["b"] = b
        _ = c["a"]  # a is now the most recent
        c["d"] = d
        return [len(c), "a" in c, "b" in c, "d" in c, c["a"], c["d"]]

    def missing() -> Any:
        return OutputCache(2)["zz"]

    def cleared() -> Any:
        c = OutputCache(4, move_to_cpu=True)
        c[(1, 2)] = torch.ones(2)
        c.clear()
        return len(c)

    return {"lru": observe(use), "missing": observe(missing), "clear": observe(cleared)}


@case(rows=(12,), names=("TokenTrie",))
def token_trie() -> dict[str, Any]:
    from genlm.backend.cache import TokenTrie

    def use() -> Any:
        root = TokenTrie()
        logits = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        node = root.extend_cache(0, [5, 6, 7], logits, 0)
        return [root.has_token(5), root.get_token(5).has_token(6), node.logprobs, root.children[5].logprobs,
                repr(root)]  # fmt: skip

    def kv() -> Any:
        root = TokenTrie()
        child = root.add_token(3, torch.zeros(2))
        child.past_key_values = "kv"
        root.clear_kv_cache()
        return child.past_key_values

    # log_softmax of 4 float32 logits: a few float32 ulps
    return {
        "extend": observe(use, lambda v: [encode(v[:2]), num(v[2], atol=1e-6), num(v[3], atol=1e-6), v[4]]),
        "kv": observe(kv),
    }


@case(rows=(12,), names=("logsumexp", "escape", "format_byte", "format_table", "LazyByteProbs", "Chart"))
def byte_utilities() -> dict[str, Any]:
    from genlm.bytes import Chart
    from genlm.bytes.util import LazyByteProbs, escape, format_byte, format_table, logsumexp

    ps = np.log(np.full(258, 1 / 258))
    ps[7] = -np.inf

    def chart_ops() -> Any:
        a = Chart(0.0, {1: 0.5, 2: 0.25})
        b = Chart(0.0, {2: 0.25, 3: 1.0})
        return [
            (a + b).to_dict(), (a * b).to_dict(), a[9], a.argmax(), a.argmin(), a.top(1).to_dict(),
            a.max(), a.min(), a.sum(), a.normalize().to_dict(), a.filter(lambda k: k > 1).to_dict(),
            a.map_values(lambda v: 2 * v).to_dict(), a.map_keys(str).to_dict(),
            a.project(lambda k: k % 2).to_dict(), a.copy().to_dict(), Chart(0.0, {1: 0.0, 2: 1.0}).trim().to_dict(),
            a.metric(b), a.sort_descending().to_dict(), repr(a), str(a), a.spawn().zero,
        ]  # fmt: skip

    return {
        "logsumexp": observe(
            lambda: [logsumexp([0.0, 1.0, -np.inf]), logsumexp([]), logsumexp([-np.inf])],
            lambda xs: [num(x, atol=1e-15) for x in xs],
        ),
        "escape": observe(lambda: [escape(65), escape(b"a b\n"), escape("x y")]),
        "format_byte": observe(lambda: [format_byte(65), format_byte(256), format_byte(257)]),
        "lazy": observe(
            lambda: [LazyByteProbs(ps)[None], LazyByteProbs(ps)[257], LazyByteProbs(ps)[7]],
            lambda xs: [num(x) for x in xs],
        ),
        "lazy_bad": observe(lambda: LazyByteProbs(ps)[300]),
        "lazy_short": observe(lambda: LazyByteProbs(ps[:10])),
        "materialize": observe(lambda: len(LazyByteProbs(ps).materialize())),
        "chart": observe(chart_ops),
        "assert_equal": observe(lambda: Chart(0.0, {1: 1.0}).assert_equal({1: 1.5})),
        "format_table": observe(
            lambda: format_table([[1, "a<b"], [Chart(0, {2: 3}), 4.5]], ["key", "value"])
        ),
        "html": observe(lambda: Chart(0.0, {1: 0.5, 2: 0.0})._repr_html_()),
    }


@case(rows=(12,), names=("get_byte_vocab", "ByteVocabError", "ByteDecoderError"))
def byte_vocab_functions(ctx: Ctx) -> dict[str, Any]:
    from genlm.backend.tokenization.bytes import ByteDecoderError, ByteVocabError, get_byte_vocab

    return {
        "gpt2": observe(lambda: get_byte_vocab(ctx.tokenizer("tiny-gpt2"))),
        "llama": observe(lambda: get_byte_vocab(ctx.tokenizer("tiny-llama"))),
        "errors": observe(
            lambda: [issubclass(ByteVocabError, Exception), issubclass(ByteDecoderError, Exception)]
        ),
    }


@case(names=("TokenHealer",))
def token_healing(ctx: Ctx) -> dict[str, Any]:
    """A byte no candidate can read makes the beam heal (back off within the token)."""
    from genlm.bytes import BeamParams, ByteBeamState
    from genlm.bytes.byte_lm.heal import TokenHealer

    llm = ctx.llm("tiny-gpt2")

    async def run() -> dict[str, Any]:
        healer = TokenHealer(max_backoff=2, max_splits=1)
        out = {"fields": {"value": [healer.max_backoff, healer.max_splits, healer.verbose]}}
        for heal in (True, False):
            beam = await ByteBeamState.initial(llm, BeamParams(K=1, heal=heal))
            beam = await beam.prefill(b"The cat s")
            out[f"heal={heal}"] = await aobserve(
                lambda beam=beam: beam.prune() << ord("a"), lambda b: [len(b), num(b.logZ, atol=LOGPROB_ATOL)]
            )
        return out

    return asyncio.run(run())


@case(names=("AsyncVirtualLM", "AsyncMlxLM", "AsyncSGLTransformer"), isolated=True)
def engines_not_installed(ctx: Ctx) -> dict[str, Any]:
    """Engines whose packages are not installed (hidden here where they are): using them
    raises ImportError."""
    for module in ("vllm", "mlx", "mlx_lm", "sglang", "genlm_vllm", "genlm_mlx"):
        sys.modules[module] = None  # type: ignore[assignment]  # import fails as if absent
    from genlm.backend.llm import AsyncMlxLM, AsyncSGLTransformer, AsyncVirtualLM, load_model_by_name

    path = ctx.paths["tiny-gpt2"]
    out = {}
    for name, cls in (("vllm", AsyncVirtualLM), ("mlx", AsyncMlxLM), ("sgl", AsyncSGLTransformer)):
        out[f"{name}.from_name"] = observe(lambda cls=cls: cls.from_name(path))
        out[f"{name}.load"] = observe(lambda name=name: load_model_by_name(path, backend=name))
    out["invalid"] = observe(lambda: load_model_by_name(path, backend="nope"))
    return out


@case(names=("BatchAbandoned", "batch_abandoned", "fail_futures"))
def batch_helpers() -> dict[str, Any]:
    from genlm.backend.llm.base import BatchAbandoned, batch_abandoned, fail_futures

    async def run() -> Any:
        loop = asyncio.get_running_loop()
        futs = [loop.create_future() for _ in range(2)]
        futs[1].set_result(1)
        cause = KeyError("x")
        err = batch_abandoned(cause)
        fail_futures([("a", futs[0]), ("b", futs[1])], err)
        return [type(err).__name__, err.__cause__ is cause, issubclass(BatchAbandoned, RuntimeError),
                type(futs[0].exception()).__name__, futs[1].result()]  # fmt: skip

    return {"helpers": observe(lambda: asyncio.run(run()))}


@case(names=("Query", "check_byte_decoder", "get_byte_tokens_from_byte_decoder", "get_byte_tokens_from_sp",
             "StatefulByteLM", "LazyTrieState"))  # fmt: skip
def unported_names(ctx: Ctx) -> dict[str, Any]:
    """Internals of the reference that genlm-compat does not carry (allowed differences)."""
    from genlm.backend.llm.hf import Query
    from genlm.backend.tokenization.bytes import (
        check_byte_decoder,
        get_byte_tokens_from_byte_decoder,
        get_byte_tokens_from_sp,
    )
    from genlm.bytes import AsyncTokenByteTrie, ByteBeamState, LazyTrieState
    from genlm.bytes.byte_lm.lm_state import StatefulByteLM

    tok = ctx.tokenizer("tiny-gpt2")
    llm = ctx.llm("tiny-gpt2")
    decoder = {c: b for b, c in gpt2_bytes_to_unicode().items()}

    async def candidate() -> Any:
        trie = AsyncTokenByteTrie.from_vocab(llm.byte_vocab, device="cpu")
        try:
            state = await LazyTrieState.initial(llm, trie).materialize()
            return [float(state.weight), list(state.partial)]
        finally:
            await trie.cleanup()

    return {
        "Query": observe(lambda: Query([1, 2], None).prompt_padded(0, 4)),
        "check_byte_decoder": observe(lambda: check_byte_decoder(tok, decoder)),
        "get_byte_tokens_from_byte_decoder": observe(
            lambda: get_byte_tokens_from_byte_decoder(tok, decoder), digest
        ),
        "get_byte_tokens_from_sp": observe(lambda: get_byte_tokens_from_sp(tok), digest),
        "StatefulByteLM": observe(lambda: issubclass(ByteBeamState, StatefulByteLM)),
        "LazyTrieState.initial": observe(lambda: asyncio.run(candidate())),
    }


def gpt2_bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in character of every byte."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    extra = [b for b in range(256) if b not in bs]
    return dict(zip(bs + extra, map(chr, cs + [256 + i for i in range(len(extra))])))


@case(names=("EOS", "EOT", "AsyncRemoteLM"))
def added_names() -> dict[str, Any]:
    """Names genlm-compat adds to the reference's modules (allowed differences)."""
    import genlm.backend.llm
    import genlm.bytes
    import genlm.bytes.trie

    return {
        "genlm.bytes.EOS": observe(lambda: getattr(genlm.bytes, "EOS", "absent")),
        "genlm.bytes.EOT": observe(lambda: hasattr(genlm.bytes, "EOT")),
        "AsyncRemoteLM": observe(lambda: hasattr(genlm.backend.llm, "AsyncRemoteLM")),
        "trie.EOS": observe(lambda: genlm.bytes.trie.EOS),
    }


# --------------------------------------------------------------------------- runner


def run_case(c: Case, ctx: Ctx) -> dict[str, Any]:
    import inspect
    import traceback

    try:
        args = [ctx] if inspect.signature(c.fn).parameters else []
        return c.fn(*args)
    except Exception:  # noqa: BLE001 - a case that fails outside an observation
        return {"case error": {"error": traceback.format_exc()[-2000:]}}


def main(argv: list[str]) -> None:
    if argv[:1] == ["--list"]:
        print(
            json.dumps(
                {n: {"rows": c.rows, "names": c.names, "isolated": c.isolated} for n, c in CASES.items()}
            )
        )
        return
    ctx = Ctx(json.loads(Path(argv[0]).read_text()))
    names = argv[1:] or list(CASES)
    out = {n: run_case(CASES[n], ctx) for n in names}
    print("RECORDS " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
