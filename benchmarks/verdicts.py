"""The headline rows every benchmark's verdict returns, and loading a benchmark's JSON.

Each ``bench_*.py`` that ``run_all.py`` runs has a ``headline(result) -> list[dict]``
that judges the JSON it wrote (``result``) against its own targets, with :func:`row`.
``run_all.py`` only collects them into ``summary.json`` / ``summary.md``. Standard
library only: importing a benchmark for its verdict must not import an engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# the columns of a headline row, in summary.md's order
COLUMNS = ["metric", "genlm-core", "anchor", "ratio", "target", "met"]


def row(
    metric: str, ours: Any, anchor: Any = None, ratio: Any = None, target: str = "", met: Any = None
) -> dict[str, Any]:
    """One headline row: our figure, the anchor's and their ratio where there is one,
    and the target with ``met`` ``"yes"`` / ``"NO"`` (``""`` where nothing is judged)."""
    return {
        "metric": metric,
        "genlm-core": ours,
        "anchor": anchor if anchor is not None else "",
        "ratio": ratio if ratio is not None else "",
        "target": target,
        "met": "" if met is None else ("yes" if met else "NO"),
    }


def load(name: str, out_dir: Path) -> Any:
    """``out_dir/<name>.json`` parsed, or None if that benchmark wrote none."""
    p = Path(out_dir) / f"{name}.json"
    return json.loads(p.read_text()) if p.exists() else None
