"""Servers for the remote backend's tests: `genlm serve` subprocesses on free loopback
ports (genlm_core.serve.testing.ServerProcess), one per module and backend."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))  # model_paths

# the servers are subprocesses: they import the same code as this session
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
