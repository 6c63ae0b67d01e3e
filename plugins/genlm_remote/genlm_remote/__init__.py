"""genlm-remote: a LogprobBackend whose rows come from a ``genlm serve`` server
(import-light: nothing heavy here)."""
