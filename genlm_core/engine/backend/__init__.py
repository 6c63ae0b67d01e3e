"""`BaseLogprobBackend`: the LogprobBackend surface, written once, holding an engine.

A backend holds an :class:`~genlm_core.engine.contract.Engine` (the part a plugin
writes: ``forward`` over distinct contexts, an optional sampler, its own limits,
stats and ``close``) and decides everything else once, for every engine. Its parts,
one job each, make up one class (:class:`BaseLogprobBackend`):

==================  ======================================================================
``base``            the class: holding the engine (construction, the vocabulary, EOS ids,
                    context limit, the one engine lock, batchers, output cache), its state,
                    counters and shutdown; :func:`backend_class`
``rows``            an engine's scores as normalised float32 rows, each its caller's own;
                    rows no caller may read refused (:mod:`~genlm_core.engine.row_checks`)
``logprob_calls``   validation, the output cache and the batcher around the rows, the
                    ``next_token_logprobs`` entry points (sync, async, batch, uncached)
``sample_calls``    sampling: the checks and the clamp to the context limit, then the
                    engine's sampler (capability ``"sample"``, batched) or draws from the rows
``burst_calls``     bursts (capability ``"burst"``: the core's decode step; ``"decode"``: the
                    engine's own): an SMC decode loop run here (:mod:`genlm_core.engine.burst`)
``cache_controls``  clearing caches, KV reuse controls (``cache_kv``, ``prefix_cache``)
``lora_controls``   LoRA adapters (capability ``"lora"``): names, switches, stale caches
==================  ======================================================================

The parts are mixins of one class: every method acts on the same engine, engine lock,
batchers and output cache, and the ownership rules (every returned row is its caller's)
hold across them. ``genlm_core.load`` builds one with
:meth:`BaseLogprobBackend.from_checkpoint`; ``from_config`` and ``from_name`` read the
checkpoint and do the same.
"""

from genlm_core.engine.backend.base import BaseLogprobBackend, backend_class, registered_name

__all__ = ["BaseLogprobBackend", "backend_class", "registered_name"]
