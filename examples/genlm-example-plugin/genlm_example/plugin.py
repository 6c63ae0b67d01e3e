from genlm_core import hookimpl


@hookimpl
def genlm_register_backends(register):
    register(
        "example-bigram",
        "genlm_example.engine:BigramEngine",
        config="genlm_example.engine:BigramConfig",
        devices=["cpu"],
        priority={"cpu": 1},  # below genlm-hf's 50: only picked by "auto" when alone
        aliases=["bigram"],
        requires=["torch"],
        install="pip install genlm-example",
        description="add-one smoothed byte bigram model trained on a text",
        model_formats=[],  # trained on a text, not loaded from a checkpoint
    )


@hookimpl
def genlm_register_caches(register):
    register(
        "example-fifo",
        "genlm_example.cache:FifoCache",
        config="genlm_core.engine.caches:OutputCacheConfig",
        description="output cache that evicts the oldest entry first (output_cache_impl='example-fifo')",
    )


@hookimpl
def genlm_register_byte_models(register):
    register(
        "example-bytes",
        "genlm_example.bytes:ByteTokenState",
        config="genlm_example.bytes:ByteTokenParams",
        requires=["torch"],
        description="next byte = next token, for backends whose tokens are single bytes",
    )
