"""vLLM and the numba trie kernels in one process (the byte-level models need both).

vLLM 0.32's platform start scans every loaded module and crashes (``'_lib_fn_wrapper'
object has no attribute 'get'``) once llvmlite (numba) is loaded, unless llvmlite's
library wrapper answers that scan (:func:`genlm_vllm.launch.tolerate_llvmlite`). Run in a
fresh interpreter so the numba kernels are loaded before the engine starts, as in a
user's program.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    from genlm_core.trie.cpu import TokenByteTrie

    path = sys.argv[1]
    # numba kernels first: llvmlite is loaded before vLLM starts
    probe = TokenByteTrie([b"a", b"ab", b"b"], accel="numba")
    assert probe.accel == "numba"
    probe.weight_sum(np.ones(3, dtype=np.float32))
    assert "llvmlite.binding.ffi" in sys.modules

    import genlm_core

    llm = genlm_core.load("vllm", model=path, dtype="float32", enforce_eager=True, max_model_len=128)
    try:
        lp = llm.next_token_logprobs_sync([1, 2, 3]).float().cpu().numpy().astype(np.float64)
        p = np.exp(lp)
        trie = TokenByteTrie(llm.byte_vocab, accel="numba")
        mass = trie.weight_sum(p)
        assert abs(mass[trie.root] - p.sum()) < 1e-9, (mass[trie.root], p.sum())
        # brute force over the vocabulary for every one-byte prefix present
        checked = 0
        for byte, node in trie.children[trie.root].items():
            if not isinstance(byte, int) or not 0 <= byte < 256:  # end-of-token and EOS edges
                continue
            want = sum(p[i] for i, t in enumerate(llm.byte_vocab) if bytes(t)[:1] == bytes([byte]))
            assert abs(mass[node] - want) <= 1e-9 + 1e-9 * want, (byte, mass[node], want)
            checked += 1
        assert checked > 0
        print("OK", checked)
    finally:
        llm.close()
    """
)


def test_vllm_starts_after_numba_trie_kernels(tiny_path: str) -> None:
    env = dict(os.environ)
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    res = subprocess.run(
        [sys.executable, "-c", SCRIPT, tiny_path], capture_output=True, text=True, timeout=540, env=env
    )
    assert res.returncode == 0 and "OK" in res.stdout, res.stdout[-3000:] + res.stderr[-6000:]
