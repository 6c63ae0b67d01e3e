"""The figure of a benchmark run (``run_all.py --plot``): SIS throughput against particles,
vLLM logprobs per request, trie mass sums, byte-level beam speed. Needs matplotlib."""

from __future__ import annotations

import json
from pathlib import Path

from common import OUT_DIR, machine
from verdicts import load


def plot(path: Path, out_dir: Path = OUT_DIR) -> None:
    """Draw the figures of the JSON files in ``out_dir`` into the PNG ``path``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install 'genlm-core[plot]'") from None
    fig, axes = plt.subplots(2, 2, figsize=(13, 9.5))
    m = machine()
    dates = sorted(
        d["machine"]["date"]
        for f in Path(out_dir).glob("*.json")
        if f.name != "summary.json"
        for d in [json.loads(f.read_text())]
        if isinstance(d, dict) and isinstance(d.get("machine"), dict) and "date" in d["machine"]
    )
    when = f"{dates[0]} to {dates[-1][-9:]}" if dates else m["date"]
    fig.suptitle(
        f"genlm-core benchmarks - SmolLM2-135M float32, {m.get('cpu', '?')} x{m.get('cpus')} CPU, "
        f"{when}\n(anchors: genlm-backend 0.3.1, genlm-bytes 0.2.0, same run)",
        fontsize=11,
    )

    ax = axes[0][0]
    sis = load("sis", out_dir) or {}
    for be, rec in sis.items():
        a = rec["figures"]["a"]
        pts = {rec["workload"]["particles"]: a["calls_per_s"]}
        for s in a.get("sweep", []):
            pts[s["particles"]] = s["calls_per_s"]
        xs = sorted(pts)
        note = " (mlx[cpu] wheel: reference BLAS)" if be == "mlx" else ""
        ax.plot(xs, [pts[x] for x in xs], "o-", label=f"genlm-core {be}{note}")
        if "b" in rec["figures"]:
            ax.plot(
                [rec["workload"]["particles"]],
                [rec["figures"]["b"]["calls_per_s"]],
                "s",
                color="gray",
                ms=9,
                label="genlm-backend AsyncTransformer (hf)",
            )
        if "c" in rec["figures"]:
            ax.axhline(rec["figures"]["c"]["calls_per_s"], ls="--", color="gray", label="uncached HF loop")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="particles (concurrent next-token requests)",
        ylabel="next-token distributions per second",
        title="SIS throughput vs particle count (higher is better)",
    )
    if sis:
        ax.legend(fontsize=7, loc="upper left")
    else:
        ax.text(0.5, 0.5, "SIS section not run", ha="center", va="center", transform=ax.transAxes)
    ax.grid(alpha=0.3, which="both")

    ax = axes[0][1]
    v = load("vllm", out_dir)
    if v:
        length = max(r["context_len"] for r in v["rows"])
        rows = sorted((r for r in v["rows"] if r["context_len"] == length), key=lambda r: r["batch"])
        xs = [r["batch"] for r in rows]
        ax.plot(xs, [r["genlm_vllm_ms_per_req"] for r in rows], "o-", label="genlm-vllm (logits capture)")
        ax.plot(xs, [r["raw_generate_ms_per_req"] for r in rows], "s--", label="raw vLLM generate, 1 token")
        ax.plot(xs, [r["logprobs_dict_ms_per_req"] for r in rows], "^:", label="vLLM logprobs=vocab dict")
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="batch size (requests per engine step)",
            ylabel="ms per request",
            title=f"vLLM full-vocab logprobs, {length}-token contexts\n(lower is better)",
        )
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, which="both")
    else:
        ax.set_axis_off()

    ax = axes[1][0]
    t = load("trie", out_dir)
    if t:
        labels, single, batch = [], [], []
        for vocab, d in t["vocabs"].items():
            for name, r in {**d["ours"], **d.get("anchors", {})}.items():
                if "precise=False" in name or name == "genlm-core numpy":
                    continue
                labels.append(f"{vocab} | {name}")
                single.append(r["single_ms"])
                batch.append(r.get("batch32_per_ms") or float("nan"))
        ys = range(len(labels))
        ax.barh([y - 0.2 for y in ys], single, height=0.4, label="one distribution")
        ax.barh([y + 0.2 for y in ys], batch, height=0.4, label="per distribution, batch of 32")
        ax.set_yticks(list(ys), labels, fontsize=7)
        ax.invert_yaxis()
        ax.set(
            xscale="log",
            xlabel="ms (log scale; lower is better)",
            title="Trie mass sums (weight_sum), 1 core: GPT-2 50k, Qwen 151k",
        )
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, axis="x", which="both")
    else:
        ax.set_axis_off()

    ax = axes[1][1]
    b = load("bytes", out_dir)
    if b:
        rows = b["rows"]
        xs = range(len(rows))
        ax.bar(
            [x - 0.2 for x in xs], [r["(a) bytes/s"] for r in rows], width=0.4, label="genlm-core byte beam"
        )
        if any(r.get("(b) bytes/s") for r in rows):
            ax.bar(
                [x + 0.2 for x in xs],
                [r.get("(b) bytes/s") or 0 for r in rows],
                width=0.4,
                label="genlm-bytes over genlm-backend",
            )
        ax.set_xticks(list(xs), [f"beam K={r['K']}" for r in rows])
        ax.set(
            yscale="log",
            ylabel="bytes per second",
            title=f"Byte-level LM on a {b.get('paragraph_bytes', '?')}-byte paragraph (higher is better)",
        )
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3, axis="y", which="both")
    else:
        ax.set_axis_off()

    from matplotlib.ticker import FuncFormatter

    for ax in axes.flat:
        for axis, scale in ((ax.xaxis, ax.get_xscale()), (ax.yaxis, ax.get_yscale())):
            if scale == "log":
                axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                # label the 2s and 5s between decades, so short log ranges still read
                axis.set_minor_formatter(
                    FuncFormatter(lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "25" else "")
                )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
