"""genlm-mock: a deterministic mock LogprobBackend (import-light: no torch here)."""
