"""Options the model commands share (``genlm`` and ``python -m genlm_core.tools.demo``).

Kept apart from :mod:`genlm_core.tools.cli` so the demo and the CLI both import it and
not each other.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

__all__ = ["POSITIVE", "SEED", "add_model_arguments", "int_option", "parse_opts"]


def int_option(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type`` for an integer in ``[low, high]``: a bad value is a parse
    error naming the option (argparse adds it), the value and the accepted range."""
    accepted = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {accepted}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {accepted}, got {value}")
        return value

    parse.__name__ = accepted  # argparse names the type in some messages
    return parse


POSITIVE = int_option(1)
SEED = int_option(0, 2**63 - 1)


def parse_opts(pairs: list[str] | None) -> dict[str, Any]:
    """``--opt key=value`` pairs as load() options (values parsed as JSON when they are)."""
    opts: dict[str, Any] = {}
    for kv in pairs or []:
        key, sep, value = kv.partition("=")
        if not sep or not key:
            # a ValueError: main() reports it in one line with exit status 2, like every bad argument
            raise ValueError(f"--opt takes KEY=VALUE, got {kv!r} (e.g. --opt batch_size=16)")
        try:
            opts[key] = json.loads(value)
        except json.JSONDecodeError:
            opts[key] = value
    return opts


def add_model_arguments(sp: argparse.ArgumentParser) -> None:
    """``--backend``, ``--model`` and ``--opt``: what every model command takes."""
    sp.add_argument("--backend", default="auto", help="backend name (default: best for this machine)")
    sp.add_argument("--model", default=None, help="hub id or local folder (default: embedded SmolLM2-135M)")
    sp.add_argument("--opt", action="append", metavar="KEY=VALUE", help="backend option (repeatable)")
