"""Hook implementations of genlm-remote. Imports nothing heavy."""

from genlm_core import hookimpl


@hookimpl
def genlm_register_backends(register):
    register(
        "remote",
        "genlm_remote.engine:RemoteEngine",
        config="genlm_remote.config:RemoteConfig",
        devices=["cpu"],
        auto=False,  # needs a url: never picked by load("auto")
        requires=["torch", "numpy"],
        install="pip install genlm-remote",
        description="a backend served by `genlm serve` (load('remote', url='http://127.0.0.1:8765'))",
    )
