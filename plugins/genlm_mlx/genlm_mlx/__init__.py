"""genlm-mlx: a genlm-core LogprobBackend on MLX (mlx-lm).

Import-light: importing this package (or its plugin module) does not import mlx;
``genlm_mlx.backend.MLXBackend`` imports it when a backend is created.
"""

__version__ = "0.1.0"
