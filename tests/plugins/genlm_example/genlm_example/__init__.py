"""Example third-party plugin for genlm-core (kept in the test tree, installed for real in CI)."""
