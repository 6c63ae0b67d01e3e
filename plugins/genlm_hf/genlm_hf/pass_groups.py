"""Which rows of a call share an eager pass.

A pass right-pads every row's new tokens to the longest: ``n`` rows whose longest suffix
is ``S`` tokens cost ``n x S`` token positions, however few of them are real. Most calls
are even (a step's particles each run one token), but a call that mixes a few long
suffixes with many one-token rows (a prompt joining running particles) pads every row to
the long ones. :func:`pass_groups` splits such a call into passes of rows of similar
suffix length, the split that minimises the padded positions plus :data:`PASS_COST`
positions for each pass (a pass's fixed cost: every weight read, every kernel launched).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["PASS_COST", "pass_groups"]

#: the fixed cost of one more pass, in token positions: a split must save more padding
#: than this. On the CPU a pass of SmolLM2-135M costs about 20 rows' worth of compute
#: (16 and 64 one-token rows: 77 and 182 ms) and on a GPU an eager pass's launches cost
#: far more than a position; 512 splits only where padding clearly dominates
PASS_COST = 512


def pass_groups(suffixes: Sequence[int], pass_cost: int = PASS_COST) -> list[list[int]]:
    """The rows (indices into ``suffixes``, each row's number of new tokens) of each pass:
    ``[list(range(n))]`` (one pass, the call's order; none without rows) unless splitting saves more padded
    positions than ``pass_cost`` a pass. Groups are contiguous in suffix order (an optimal
    split always is: the rows of one pass cost its longest suffix each), longest last."""
    n = len(suffixes)
    if n == 0:
        return []  # no rows, no pass
    if n < 2 or n * max(suffixes) - sum(suffixes) <= pass_cost:
        return [list(range(n))]
    order = sorted(range(n), key=lambda i: suffixes[i])
    s = [suffixes[i] for i in order]
    # best[k]: the least cost of the k shortest rows; cut[k]: where its last pass starts
    best = [0] * (n + 1)
    cut = [0] * (n + 1)
    for k in range(1, n + 1):
        best[k], cut[k] = min((best[j] + pass_cost + (k - j) * s[k - 1], j) for j in range(k))
    groups = []
    k = n
    while k:
        groups.append(order[cut[k] : k])
        k = cut[k]
    groups.reverse()
    return groups if len(groups) > 1 else [list(range(n))]
