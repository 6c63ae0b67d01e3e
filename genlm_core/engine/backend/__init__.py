"""`BaseLogprobBackend`: the LogprobBackend surface, written once, holding an engine.

A backend holds an :class:`~genlm_core.engine.contract.Engine` (the part a plugin
writes: ``forward`` over distinct contexts, an optional sampler, its own limits,
stats and ``close``) and decides everything else once, for every engine. It is composed
of parts, one job each, each an object built with the collaborators it works with
(passed in, never read off the backend):

==================  ======================================================================
``base``            the class (:class:`BaseLogprobBackend`): holding the engine
                    (construction, the vocabulary, EOS ids, context limit), making the
                    shared objects (the one engine lock, the batchers, the output cache,
                    the core's KV calls) and the parts, its state, counters and shutdown;
                    every other public call one line handing over to its part;
                    :func:`backend_class`
``lifecycle``       :class:`~.lifecycle.Lifecycle`: whether the backend is closed, one
                    flag every part reads
``rows``            :class:`~.rows.Rows` (``llm.rows``): an engine's scores as normalised
                    float32 rows, each its caller's own; rows no caller may read refused
                    (:mod:`~genlm_core.engine.row_checks`)
``logprob_calls``   :class:`~.logprob_calls.LogprobCalls` (``llm.logprob_calls``):
                    validation, the output cache and the batcher around the rows, the
                    ``next_token_logprobs`` entry points (sync, async, batch, uncached);
                    :class:`~.logprob_calls.CachingBatch`, the batcher's batch function
``sample_calls``    :class:`~.sample_calls.SampleCalls` (``llm.sample_calls``): sampling:
                    the checks and the clamp to the context limit, then the engine's
                    sampler (capability ``"sample"``, batched) or draws from the rows
``burst_calls``     :class:`~.burst_calls.Bursts` (``llm.bursts``): bursts (capability
                    ``"burst"``: the core's decode step; ``"decode"``: the engine's own):
                    an SMC decode loop run here (:mod:`genlm_core.engine.burst`)
``cache_controls``  :class:`~.cache_controls.CacheControls` (``llm.cache_controls``):
                    clearing caches, KV reuse controls (``cache_kv``, ``prefix_cache``)
``lora_controls``   :class:`~.lora_controls.LoraControls` (``llm.lora_controls``): LoRA
                    adapters (capability ``"lora"``): names, switches, stale caches
==================  ======================================================================

The parts share the backend's engine, engine lock, batcher and output cache, handed to
each when it is made, and the ownership rules (every returned row is its caller's) hold
across them. ``genlm_core.load`` builds one with
:meth:`BaseLogprobBackend.from_checkpoint`; ``from_config`` and ``from_name`` read the
checkpoint and do the same.
"""

from genlm_core.engine.backend.base import BaseLogprobBackend, backend_class, registered_name

__all__ = ["BaseLogprobBackend", "backend_class", "registered_name"]
