"""Runs inside a venv with genlm-backend 0.3.1 and genlm-bytes 0.2.0 (not genlm-core):
prints, as JSON, the quantities tests/test_anchor_oracle.py compares with genlm-core.

Usage: python anchor_worker.py MODEL_FOLDER
"""

import asyncio
import json
import sys

import numpy as np
import torch
from genlm.backend.llm import AsyncTransformer
from genlm.backend.trie import TokenCharacterTrie
from genlm.bytes import BeamParams, ByteBeamState

PROMPT = "The capital of France is"
TEXT = b"The capital of"
GREEDY_STEPS = 4


def main(path):
    llm = AsyncTransformer.from_name(path, hf_opts={"torch_dtype": torch.float32, "device_map": None})
    ids = llm.tokenizer.encode(PROMPT)
    contexts = [ids, ids[:-1], ids[:2]]
    logprobs = [llm.next_token_logprobs_sync(c).float().cpu().numpy().tolist() for c in contexts]
    vocab = [bytes(getattr(t, "byte_string", t)) for t in llm.byte_vocab]
    trie = TokenCharacterTrie(decode=llm.byte_vocab)
    masses = trie.weight_sum(np.exp(np.asarray(logprobs[0], dtype=np.float64)))
    by_prefix = {}
    top = np.argsort(logprobs[0])[::-1][:5]  # every byte prefix of the 5 likeliest tokens
    for pre in sorted({vocab[i][:k] for i in top for k in range(1, len(vocab[i]) + 1)}):
        node = trie.root
        for b in pre:
            node = trie.children[node][b]
        by_prefix[pre.hex()] = float(masses[node])

    async def beam():
        state = await ByteBeamState.initial(llm, BeamParams(K=5))
        state = await state.prefill(TEXT)
        dist = await state.logp_next()
        out = (float(state.logZ), np.asarray(dist.ps, dtype=np.float64)[:256].tolist())
        await state.cleanup()
        return out

    async def greedy():
        state = await ByteBeamState.initial(llm, BeamParams(K=5))
        out = await state.greedy(TEXT, GREEDY_STEPS)
        margins = []  # each step's top two log-probabilities apart (how robust its argmax is)
        beam = await state.prefill(TEXT)
        for b in out[len(TEXT) :]:
            top = np.sort(np.asarray((await beam.logp_next()).ps, dtype=np.float64))[::-1]
            margins.append(float(top[0] - top[1]))
            beam = await (beam.prune() << b)
        await state.cleanup()
        return out.hex(), margins

    logZ, next_bytes = asyncio.run(beam())
    greedy_hex, margins = asyncio.run(greedy())
    print(json.dumps({"contexts": contexts, "logprobs": logprobs, "masses": by_prefix,
                      "logZ": logZ, "next_bytes": next_bytes, "greedy": greedy_hex,
                      "greedy_margins": margins}))  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1])
