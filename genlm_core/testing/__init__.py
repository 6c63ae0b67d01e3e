"""Testing helpers for plugin authors: the LogprobBackend conformance kit."""

from genlm_core.testing.conformance import LogprobBackendConformance

__all__ = ["LogprobBackendConformance"]
