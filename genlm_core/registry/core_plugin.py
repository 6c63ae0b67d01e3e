"""The core's own implementations, registered through the same hooks as plugins."""

from __future__ import annotations

from genlm_core.registry.hookspecs import hookimpl


@hookimpl
def genlm_register_caches(register):
    register(
        "output",
        "genlm_core.engine.caches:OutputCache",
        config="genlm_core.engine.caches:OutputCacheConfig",
        description="LRU of next-token results keyed by the whole context, bounded by entries and bytes",
    )
    register(
        "prefix",
        "genlm_core.engine.prefix_cache:PrefixCache",
        description="token trie of opaque engine KV per prefix, LRU under a byte budget",
    )


@hookimpl
def genlm_register_tries(register):
    register(
        "numpy",
        "genlm_core.trie.cpu:TokenByteTrie",
        devices=["cpu"],
        priority={"cpu": 100},
        requires=["numpy"],
        description="flat arrays on the CPU (sorted-vocabulary ranges)",
    )
    register(
        "torch",
        "genlm_core.trie.torch_impl:TorchTokenByteTrie",
        # not "mps": the prefix sums are float64, which MPS lacks
        devices=["cuda", "cpu"],
        priority={"cuda": 100, "cpu": 10},
        requires=["torch"],
        description="torch tensors; results stay on the device",
    )


@hookimpl
def genlm_register_byte_models(register):
    register(
        "beam",
        "genlm_core.bytes.beam:ByteBeamState",
        config="genlm_core.bytes.params:BeamParams",
        requires=["torch", "numpy"],
        devices=["cuda", "mps", "cpu"],
        description="byte-level LM: beam over tokenizations with token healing",
    )
