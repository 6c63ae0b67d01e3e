"""genlm-vllm: the vLLM V1 engine as a genlm-core LogprobBackend (import-light)."""
