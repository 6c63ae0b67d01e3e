"""Graphviz rendering of a token-byte trie (optional dependency ``graphviz``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from genlm_core.trie.structure import EOS, EOT

__all__ = ["visualize"]


def _label(key: Any) -> str:
    if key is EOT:
        return "EOT"
    if isinstance(key, tuple):
        return f"EOT {key[1]}"
    if key == EOS and isinstance(key, int):
        return "EOS"
    if isinstance(key, int):
        return repr(bytes([key]))[2:-1]
    return repr(bytes(key))


def visualize(trie: Any, ws: Any = None) -> Any:
    """A ``graphviz.Digraph`` of ``trie``; ``ws`` (length ``num_nodes``) labels and
    shades the nodes. Raises ``ImportError`` naming the extra when graphviz is absent."""
    try:
        import graphviz
    except ImportError:
        raise ImportError(
            "trie.visualize() needs the graphviz package: pip install genlm-core[viz]"
        ) from None
    if ws is not None:
        if type(ws).__module__.startswith("torch"):
            ws = ws.detach().cpu().numpy()
        ws = np.asarray(ws, dtype=np.float64)
        if ws.shape != (trie.num_nodes,):
            raise ValueError(
                f"weight vector length ({ws.shape}) must match number of nodes ({trie.num_nodes})"
            )
    dot = graphviz.Digraph(comment="Token byte trie")
    dot.attr(rankdir="LR")
    top = float(np.max(ws[np.isfinite(ws)])) if ws is not None and np.isfinite(ws).any() else 0.0
    nodes = [n for n in range(trie.num_nodes) if n == trie.root or trie.structure.parent[n] >= 0]
    for node in nodes:  # the EOS slot is no node without EOS tokens
        prefix = trie.node2prefix[node]
        label = f"{node}\\n{prefix!r}"
        color = "#ffffff"
        if ws is not None:
            label += f"\\n{ws[node]:.4g}"
            if top > 0 and np.isfinite(ws[node]) and ws[node] >= 0:
                g = int(255 * (1 - ws[node] / top))
                color = f"#{g:02x}ff{g:02x}"
        leaf = node in trie.leaf2word
        dot.node(
            str(node),
            label,
            shape="doublecircle" if leaf else "circle",
            style="filled",
            fillcolor=color,
        )
    for node in nodes:
        for key, child in trie.children[node].items():
            dot.edge(str(node), str(child), label=_label(key))
    return dot
