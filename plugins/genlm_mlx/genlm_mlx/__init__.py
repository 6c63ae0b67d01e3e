"""genlm-mlx: a genlm-core LogprobBackend on MLX (mlx-lm).

Import-light: importing this package (or its plugin module) does not import mlx;
``genlm_core.load("mlx", ...)`` imports it when it loads the engine (``genlm_mlx.engine``).
"""

__version__ = "0.1.0"
