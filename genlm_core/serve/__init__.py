"""``genlm serve``: one engine, many programs.

One process loads a backend and answers next-token logprobs, batch logprobs and
sampling for many client processes; every request goes through the backend's own
async path (its one AutoBatcher, output cache and KV reuse), so rows from different
clients share forward passes. The client is the ``remote`` backend (plugin
genlm-remote): ``genlm_core.load("remote", url="http://127.0.0.1:8765")``.

Modules: :mod:`~genlm_core.serve.frame` (the versioned binary wire frame),
:mod:`~genlm_core.serve.limits` (limits, token, bind checks),
:mod:`~genlm_core.serve.security` (Host, Origin, media type and token checks),
:mod:`~genlm_core.serve.inputs` (reading bodies, checking JSON requests),
:mod:`~genlm_core.serve.shm` (segments the server hands same-host clients),
:mod:`~genlm_core.serve.gather` (several clients' requests in one batch),
:mod:`~genlm_core.serve.departure` (dropping the work of clients that left),
:mod:`~genlm_core.serve.phases` (where a request's time goes),
:mod:`~genlm_core.serve.metrics` (/v1/stats and /metrics),
:mod:`~genlm_core.serve.app` (the Starlette application),
:mod:`~genlm_core.serve.run` (uvicorn, readiness line, graceful shutdown).
Importing this package imports no engine and no server stack.
"""
