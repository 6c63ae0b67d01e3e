"""genlm-llamacpp: genlm-core's LogprobBackend on llama.cpp (GGUF models).

Importing this package imports nothing heavy; ``genlm_core.load("llamacpp", ...)``
imports llama-cpp-python.
"""
