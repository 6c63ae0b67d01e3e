"""``benchmarks/graph_account.py``'s kernels by name (``step_kernels_top``): on a GPU it
groups the CUDA kernels of a step's profile. Here the same grouping runs over a real
profile of a CPU function whose operators are known (the oracle: the counts the function
makes), and over made-up events for the names' cut and the order."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import graph_account as ga  # noqa: E402


def test_a_real_profile_is_counted_by_name_per_run() -> None:
    from torch.profiler import ProfilerActivity, profile

    a, b = torch.randn(8, 8), torch.randn(8, 8)

    def step() -> None:  # per run: 3 matrix products, 2 additions, 1 exp
        x = torch.mm(a, b)
        x = torch.mm(x, b)
        x = torch.mm(x, b)
        torch.add(torch.add(x, a), b).exp()

    runs = 4
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(runs):
            step()
    events = [e for e in prof.events() if e.name in ("aten::mm", "aten::add", "aten::exp")]
    top = ga.kernels_by_name(events, runs, time_of=lambda e: e.cpu_time_total)
    assert [row[:2] for row in top] == [["aten::mm", 3.0], ["aten::add", 2.0], ["aten::exp", 1.0]]
    assert all(row[2] >= 0 for row in top)
    spent = sum(e.cpu_time_total for e in events if e.name == "aten::mm") / 1e3 / runs
    assert abs(top[0][2] - spent) <= 1e-4 + 1e-9 * spent  # rounded to 4 places


def test_names_are_cut_and_the_most_frequent_listed_first() -> None:
    long = "void at::native::elementwise_kernel<" + "x" * 500
    events = [SimpleNamespace(name=long + str(i), device_time=2.0) for i in range(5)]  # one name once cut
    events += [SimpleNamespace(name=f"k{i}", device_time=1.0) for i in range(ga.TOP_KERNELS + 3)]
    top = ga.kernels_by_name(events, runs=1)
    assert len(top) == ga.TOP_KERNELS
    assert top[0] == [long[: ga.NAME_CHARS], 5.0, 0.01]
    assert all(len(name) <= ga.NAME_CHARS for name, _, _ in top)
    assert [n for _, n, _ in top] == sorted((n for _, n, _ in top), reverse=True)
