"""Hook implementations of genlm-mock. Imports nothing heavy."""

from genlm_core import hookimpl


@hookimpl
def genlm_register_backends(register):
    register(
        "mock",
        "genlm_mock.engine:MockEngine",
        config="genlm_mock.config:MockConfig",
        devices=["cpu"],
        auto=False,  # never picked by load("auto"): it is not a language model
        requires=["torch", "numpy"],
        install="pip install genlm-mock",
        description="deterministic pseudo-random logprobs seeded by the context",
        model_formats=[],  # loads no model (a folder given lends it only a tokenizer)
    )
