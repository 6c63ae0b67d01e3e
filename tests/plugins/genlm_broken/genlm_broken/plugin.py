"""Fails on import, as a plugin whose engine is missing or whose code is broken would."""

import genlm_broken_missing_engine  # noqa: F401  (does not exist)
