"""Servers for the remote backend's tests: `genlm serve` subprocesses on free loopback
ports (genlm_core.serve.testing.ServerProcess), one per module and backend.

The suite needs nothing from this repository but what genlm-core installs: the test
models come from the kit (``genlm_core.testing.models``, also under the name
``model_paths`` that the core suites use for it), so the folder runs wherever it is
copied, as the other plugin suites do.
"""

from __future__ import annotations

import importlib
import os
import sys

sys.modules.setdefault("model_paths", importlib.import_module("genlm_core.testing.models"))

# the servers are subprocesses: they import the same code as this session
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
