from genlm_core import hookimpl


@hookimpl
def genlm_register_backends(register):
    register(
        "example-bigram",
        "genlm_example.backend:BigramBackend",
        config="genlm_example.backend:BigramConfig",
        devices=["cpu"],
        priority={"cpu": 1},  # below genlm-hf's 50: only picked by "auto" when alone
        aliases=["bigram"],
        requires=["torch"],
        install="pip install genlm-example",
        description="add-one smoothed byte bigram model trained on a text",
        model_formats=[],  # trained on a text, not loaded from a checkpoint
    )
