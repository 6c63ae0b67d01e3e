"""Example third-party plugin for genlm-core: a byte bigram LogprobBackend."""
