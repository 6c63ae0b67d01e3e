"""The test kit for plugin authors, inside and outside this repository.

* :class:`LogprobBackendConformance` - the conformance suite a plugin's tests subclass
  (``conformance``); ``checkpoints`` - where a backend's checkpoint is, for the kit's
  checkpoint policy and the model's shape;
* ``tolerance`` - how far two computations of one row may differ: bounds derived from
  the model's shape, the dtype and the row's magnitude, and the comparisons made at them;
* ``programs`` - random programs (forks, jumps, back-ups, re-asked contexts, new prompts)
  run against a backend's state;
* ``smc_program`` and ``burst`` - one SMC program driven by per-step calls and by a
  burst, and the checks of bursts and decode steps against steps and the uncached model;
* ``defects`` and ``gates`` - a catalogue of deliberate engine defects and the gates
  (the kit's checks that compare rows) that must fail on each;
* ``models`` - the offline test models (tiny Llama / GPT-2, SmolLM2);
* ``oracle`` - the float32 transformers oracle;
* ``plugin`` - the pytest plugin (``pytest11`` entry point): the models' and the
  oracle's fixtures (``tiny_llama_path``, ``tiny_gpt2_path``, ``smollm2_path``,
  ``oracle_factory``), the markers the test command selects by, and the run's summary
  (checkpoints read, the comparisons and the defect catches nearest their bounds).

``pip install "genlm-core[test]"`` brings pytest; the oracle needs torch and transformers.
"""

from genlm_core.testing.conformance import LogprobBackendConformance

__all__ = ["LogprobBackendConformance"]
