"""The test kit for plugin authors, inside and outside this repository.

* :class:`LogprobBackendConformance` - the conformance suite (``conformance``);
* ``genlm_core.testing.models`` - the offline test models (tiny Llama / GPT-2, SmolLM2);
* ``genlm_core.testing.oracle`` - the float32 transformers oracle;
* ``genlm_core.testing.plugin`` - the pytest plugin (``pytest11`` entry point) with
  their fixtures (``tiny_llama_path``, ``tiny_gpt2_path``, ``smollm2_path``,
  ``oracle_factory``) and the markers the test command selects by.

``pip install "genlm-core[test]"`` brings pytest; the oracle needs torch and transformers.
"""

from genlm_core.testing.conformance import LogprobBackendConformance

__all__ = ["LogprobBackendConformance"]
