"""Fixtures of the genlm-mlx tests: real mlx (CPU) on the offline test models.

The model fixtures (``tiny_llama_path``, ``tiny_gpt2_path``, ``smollm2_path``,
``oracle_factory``) come from genlm-core's pytest plugin (``genlm_core.testing``).
"""
