"""SmolLM2-135M (a real pretrained model, 49k vocabulary), float32, the session's
in-process engine (``smol_backend``, also the reference of the distributed suite)."""

from __future__ import annotations

from oracles import assert_smol_close, genlm_hf_oracle, hf_oracle, vllm_dict_oracle


def test_smollm2_matches_oracles(smol_backend, smol_path) -> None:
    path, llm = smol_path, smol_backend
    assert len(llm.byte_vocab) == 49152
    tok = llm.tokenizer
    texts = [
        "The capital of France is",
        "The capital of France is Paris. The capital of",
        "Hello",
        "def f(x):",
    ]
    batch = [tok.encode(t) for t in texts]
    batch.append(batch[0])  # repeated
    got = llm.batch_next_token_logprobs_sync(batch)
    paris = tok.encode(" Paris")[0]
    assert int(got[0].argmax()) == paris and -0.5 < float(got[0][paris]) < -0.1
    oracle = vllm_dict_oracle(llm, batch)
    hf = hf_oracle(path, batch, len(llm.byte_vocab))
    ghf = genlm_hf_oracle(path, batch)
    for i in range(len(batch)):
        assert_smol_close(got[i], oracle[i], str(i))
        assert_smol_close(got[i], hf[i], str(i))
        assert_smol_close(got[i], ghf[i], str(i))
