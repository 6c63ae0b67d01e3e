"""What users run: the ``genlm`` command and the programs behind it.

* :mod:`~genlm_core.tools.cli` - ``genlm`` (backends, doctor, models, logprobs, sample,
  bytes, compare, bench, serve, demo); :mod:`~genlm_core.tools.cli_options` holds the
  options the model commands and the demo share.
* :mod:`~genlm_core.tools.doctor` - ``genlm doctor``.
* :mod:`~genlm_core.tools.demo` - the main job (``genlm demo``).
* :mod:`~genlm_core.tools.compare` - ``genlm compare``: do engines give the same numbers?
* :mod:`~genlm_core.tools.sis` - autobatched sequential importance sampling, the
  example program the demo, ``genlm sample`` and the SIS benchmark run.

Nothing here is imported by the rest of the core.
"""
