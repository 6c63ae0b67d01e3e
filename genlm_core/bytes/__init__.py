"""Byte-level language models over token-level LogprobBackends ("beam" ByteModel).

from genlm_core.bytes import ByteBeamState, BeamParams
beam = await ByteBeamState.initial(llm, BeamParams(K=5))
beam = await beam.prefill(b"An apple a day")
dist = await beam.logp_next()          # 256 bytes + EOT + EOS
print(dist.pretty())
"""

from genlm_core.bytes.beam import (
    BeamError,
    ByteBeamState,
    EmptyBeamError,
    TerminatedBeamError,
    materialize_all,
)
from genlm_core.bytes.dist import EOS, EOT, ByteDistribution
from genlm_core.bytes.heal import TokenHealer
from genlm_core.bytes.lm import StatefulTokenizedLM
from genlm_core.bytes.masses import EOSMode, MassTrie
from genlm_core.bytes.params import BeamParams
from genlm_core.bytes.state import LazyTrieState, TrieMode

__all__ = [
    "EOS",
    "EOT",
    "BeamError",
    "BeamParams",
    "ByteBeamState",
    "ByteDistribution",
    "EOSMode",
    "EmptyBeamError",
    "LazyTrieState",
    "MassTrie",
    "StatefulTokenizedLM",
    "TerminatedBeamError",
    "TokenHealer",
    "TrieMode",
    "materialize_all",
]
