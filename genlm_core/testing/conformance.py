"""Conformance kit: the pytest suite every LogprobBackend plugin runs against itself.

Usage in a plugin's tests::

    import pytest
    from genlm_core.testing import LogprobBackendConformance

    class TestMyBackend(LogprobBackendConformance):
        # atol = None (default): two computations of a row are compared at the bound
        # derived from the arithmetic (genlm_core.testing.tolerance): the model's width and
        # depth (read from its checkpoint), the backend's dtype and the row's magnitude

        @pytest.fixture(scope="class")
        def backend(self):
            llm = genlm_core.load("mine", model=...)
            yield llm
            llm.close()

Every test compares the backend with itself along an independent path (single
vs batched, sync vs async, cached vs uncached, sampling with and without EOS), so
it can fail without any hard-coded expected value.

Kept in one module: it is one class, the suite a plugin subclasses; the checks that need
machinery of their own live beside it (``burst``, ``programs``, ``tolerance``).
"""

from __future__ import annotations

import asyncio
import gc
import math
import random
import time
import weakref
from typing import Any

import pytest

from genlm_core.testing.checkpoints import CheckpointSource, find_checkpoint

__all__ = ["CheckpointSource", "LogprobBackendConformance", "find_checkpoint"]

#: (test id, checkpoint source) of every checkpoint-policy check run, for the run's summary
CHECKED_CHECKPOINTS: pytest.StashKey[list[tuple[str, CheckpointSource]]] = pytest.StashKey()


class LogprobBackendConformance:
    """Subclass and provide a ``backend`` fixture (class scope recommended)."""

    #: absolute tolerance between two computations of the same distribution. None (the
    #: default): derived from the arithmetic, :func:`genlm_core.testing.tolerance.row_atol`
    #: for the model's shape (:meth:`model_shape`), the backend's dtype and each row's
    #: magnitude - the same bound on AVX2, AVX-512, AMX and CUDA, since two paths differ by
    #: the order of their sums only. A number overrides it: ``0.0`` for a backend whose
    #: paths return the same bytes (an exact table, a server copying its rows).
    atol: float | None = None
    #: tolerance on sum(exp(logprobs)) - 1 (a float32 row: ~(log2 V + 4) eps32, plus margin)
    norm_tol: float = 1e-4
    #: number of random contexts used by the comparisons
    n_contexts: int = 6
    #: shortest and longest random context
    min_len: int = 1
    max_len: int = 8
    #: event loops (one ``asyncio.run`` each) in the no-leak check
    loop_steps: int = 8
    #: the seeds of :meth:`test_random_programs`' programs, and their rounds
    program_seeds: tuple[int, ...] = (0, 1)
    program_steps: int = 8
    #: the lengths of the programs' first contexts (random, between the two)
    program_prompt_lengths: tuple[int, int] = (1, 8)
    #: the longest context :meth:`test_context_past_the_limit` computes (the context of
    #: exactly the limit, where the limit is at most this; the refusals at any limit)
    limit_context_max: int = 512

    @pytest.fixture
    def backend(self) -> Any:  # pragma: no cover - plugins override
        raise NotImplementedError("define a `backend` fixture returning the LogprobBackend under test")

    # ------------------------------------------------------------------ helpers
    def token_ids(self, backend: Any) -> list[int]:
        """Ordinary token ids (not special, with bytes) among the first 5,000."""
        special = set(getattr(backend, "eos_token_ids", []) or [])
        special |= set(getattr(backend.tokenizer, "all_special_ids", []) or [])
        return [
            i
            for i in range(min(len(backend.byte_vocab), 5000))
            if i not in special and len(backend.byte_vocab[i]) > 0
        ]

    def contexts(self, backend: Any, seed: int = 0) -> list[list[int]]:
        """Random contexts of ordinary (non-special) tokens, some sharing prefixes."""
        rng = random.Random(seed)
        ids = self.token_ids(backend)
        out: list[list[int]] = []
        for k in range(self.n_contexts):
            if k % 3 == 2 and out:
                out.append(out[-1] + [rng.choice(ids)])  # shares a prefix with the previous
            else:
                out.append([rng.choice(ids) for _ in range(rng.randint(self.min_len, self.max_len))])
        return out

    def model_shape(self, backend: Any) -> Any:
        """The model's width and depth for the derived bound
        (:func:`genlm_core.testing.tolerance.model_shape` of its checkpoint; override for a
        backend whose checkpoint the kit cannot find)."""
        from genlm_core.testing.tolerance import model_shape

        return model_shape(backend)

    def assert_close(self, backend: Any, got: Any, want: Any, what: str = "rows") -> None:
        """``got`` and ``want`` are two computations of the same row(s): within ``atol``
        when the class sets one, else within the derived bounds (each entry, and the rows'
        common logit scale: :func:`~genlm_core.testing.tolerance.assert_rows_close`). The
        tests compare each row as it comes, then all of a test's rows together (the scale
        of many independent rows is resolved far finer than one row's)."""
        from genlm_core.testing.tolerance import assert_rows_close, assert_within, row_diff

        what = f"{type(self).__name__}: {what}"
        if self.atol is not None:
            assert_within(row_diff(got, want, what), self.atol, what)
        else:
            assert_rows_close(got, want, self.model_shape(backend), dtype=backend.dtype, what=what)

    # ------------------------------------------------------------------ contract
    def test_surface(self, backend: Any) -> None:
        from genlm_core.protocols import LogprobBackend
        from genlm_core.token import Token

        assert isinstance(backend, LogprobBackend)
        assert len(backend.byte_vocab) == len(backend.str_vocab)
        for i in (0, len(backend.byte_vocab) // 2, len(backend.byte_vocab) - 1):
            tok = backend.byte_vocab[i]
            assert isinstance(tok, Token) and tok.token_id == i

    def test_shape_dtype_normalised(self, backend: Any) -> None:
        import torch

        for ctx in self.contexts(backend):
            lp = backend.next_token_logprobs_sync(ctx)
            assert lp.dtype == torch.float32
            assert lp.shape == (len(backend.byte_vocab),)
            assert torch.isfinite(lp).all() or (lp[torch.isfinite(lp)].numel() > 0)
            assert math.isclose(float(torch.logsumexp(lp.double(), 0).exp()), 1.0, abs_tol=self.norm_tol)

    def test_deterministic(self, backend: Any) -> None:
        ctx = self.contexts(backend, seed=1)[0]
        a = backend.next_token_logprobs_sync(ctx)
        backend.clear_cache()
        b = backend.next_token_logprobs_sync(ctx)
        self.assert_close(backend, a, b, "the same context after clear_cache")

    def alone(self, backend: Any, ctx: list[int]) -> Any:
        """The row of ``ctx`` computed alone without any cache (the kit's oracle)."""
        if hasattr(backend, "next_token_logprobs_uncached"):
            return backend.next_token_logprobs_uncached(ctx)
        backend.clear_cache()
        return backend.next_token_logprobs_sync(ctx)

    def test_batch_equals_single(self, backend: Any) -> None:
        """A batch's rows equal each context computed alone, for a fresh batch and for a
        batch whose contexts extend the first one's (resumed from what it cached)."""
        from genlm_core.testing.tolerance import RowComparisons

        ctxs = self.contexts(backend, seed=2)
        ctxs = ctxs + [ctxs[0]]  # a repeated context in the batch
        rng = random.Random(2)
        longer = [c + [rng.choice(self.token_ids(backend))] for c in ctxs[:-1]]
        rows = RowComparisons(
            lambda got, want, what: self.assert_close(backend, got, want, what),
            "the batches' rows against the contexts alone",
        )
        backend.clear_cache()
        batch = backend.batch_next_token_logprobs_sync(ctxs)
        assert batch.shape == (len(ctxs), len(backend.byte_vocab))
        resumed = backend.batch_next_token_logprobs_sync(longer)
        for what, got, asked in (("a batch row", batch, ctxs), ("a resumed batch's row", resumed, longer)):
            for row, ctx in zip(got, asked):
                rows.add(row, self.alone(backend, ctx), f"{what} against the context alone")
        rows.finish()

    @pytest.mark.asyncio
    async def test_async_equals_sync(self, backend: Any) -> None:
        import torch

        ctxs = self.contexts(backend, seed=3)
        sync = [backend.next_token_logprobs_sync(c) for c in ctxs]
        backend.clear_cache()
        rows = await asyncio.gather(*(backend.next_token_logprobs(c) for c in ctxs))
        batch = await backend.batch_next_token_logprobs(ctxs)
        alone = [self.alone(backend, c) for c in ctxs]
        for s, a, b, ref in zip(sync, rows, batch, alone):
            self.assert_close(backend, s, ref, "sync against the context alone")
            self.assert_close(backend, a, s, "async against sync")
            self.assert_close(backend, b, s, "async batch against sync")
        ref = torch.stack(alone)
        self.assert_close(backend, torch.stack(sync), ref, "the sync rows against the contexts alone")
        self.assert_close(backend, torch.stack(list(rows)), ref, "the async rows against the contexts alone")

    @pytest.mark.asyncio
    async def test_seeded_sampling_reproducible(self, backend: Any) -> None:
        prompt = self.contexts(backend, seed=4)[0]
        a = await backend.sample(prompt, max_tokens=5, eos_token_ids=[], seed=1234)
        b = await backend.sample(prompt, max_tokens=5, eos_token_ids=[], seed=1234)
        assert a == b and len(a) == 5
        batch = await backend.batch_sample([prompt, prompt], max_tokens=3, eos_token_ids=[], seed=7)
        assert len(batch) == 2 and all(len(x) == 3 for x in batch)
        assert batch == await backend.batch_sample([prompt, prompt], max_tokens=3, eos_token_ids=[], seed=7)

    @pytest.mark.asyncio
    async def test_eos_stops_sampling(self, backend: Any) -> None:
        prompt = self.contexts(backend, seed=5)[0]
        free = await backend.sample(prompt, max_tokens=6, eos_token_ids=[], seed=99)
        assert len(free) == 6
        k = 2
        stopped = await backend.sample(prompt, max_tokens=6, eos_token_ids=[free[k]], seed=99)
        assert stopped == free[: free.index(free[k])]
        everything = list(range(len(backend.byte_vocab)))
        assert await backend.sample(prompt, max_tokens=6, eos_token_ids=everything, seed=1) == []

    def test_empty_batch(self, backend: Any) -> None:
        import torch

        out = backend.batch_next_token_logprobs_sync([])
        assert out.shape == (0, len(backend.byte_vocab)) and out.dtype == torch.float32

    @pytest.mark.asyncio
    async def test_empty_batch_async(self, backend: Any) -> None:
        import torch

        out = await backend.batch_next_token_logprobs([])
        assert out.shape == (0, len(backend.byte_vocab)) and out.dtype == torch.float32

    @pytest.mark.asyncio
    async def test_returned_rows_belong_to_the_caller(self, backend: Any) -> None:
        """Editing a returned row in place (SMC masks rows) changes no later result,
        on every path: sync, async, batch, cache hit, callers merged on one context."""
        ctx = self.contexts(backend, seed=7)[0]
        other = self.contexts(backend, seed=7)[1]
        backend.clear_cache()
        truth = backend.next_token_logprobs_sync(ctx).clone()  # taken before anybody edits
        backend.clear_cache()
        rows = [backend.next_token_logprobs_sync(ctx)]  # miss
        rows.append(backend.next_token_logprobs_sync(ctx))  # hit
        rows.append(await backend.next_token_logprobs(ctx))  # hit
        backend.clear_cache()
        merged = await asyncio.gather(*(backend.next_token_logprobs(ctx) for _ in range(3)))
        assert len({r.data_ptr() for r in merged}) == 3
        rows += merged
        batch = backend.batch_next_token_logprobs_sync([ctx, other, ctx])
        rows += [batch[0], batch[2]]
        rows.append((await backend.batch_next_token_logprobs([other, ctx]))[1])
        for r in rows:
            self.assert_close(backend, r, truth, "a returned row")
            r.fill_(float("nan"))
        self.assert_close(backend, backend.next_token_logprobs_sync(ctx), truth, "a row after edits")
        self.assert_close(backend, await backend.next_token_logprobs(ctx), truth, "a row after edits")
        self.assert_close(
            backend, backend.batch_next_token_logprobs_sync([ctx])[0], truth, "a row after edits"
        )

    @pytest.mark.asyncio
    async def test_cached_rows_come_back_where_computed_rows_do(self, backend: Any) -> None:
        """A cache hit comes back on the device of a computed row, on every path, and a
        batch mixing hits and computed rows is one tensor there (a cache holding rows in
        host memory, ``cache_to_cpu``, hands them back to the device)."""
        ctx, other, third = self.contexts(backend, seed=8)[:3]
        backend.clear_cache()
        computed = backend.next_token_logprobs_sync(ctx)  # a miss: where rows come back
        hits = {
            "a sync hit": backend.next_token_logprobs_sync(ctx),
            "an async hit": await backend.next_token_logprobs(ctx),
            "a sync batch's hit": backend.batch_next_token_logprobs_sync([other, ctx])[1],
            "an async batch's hit": (await backend.batch_next_token_logprobs([ctx, third]))[0],
        }
        for what, row in hits.items():
            assert row.device == computed.device, f"{what} on {row.device}, computed on {computed.device}"
            self.assert_close(backend, row, computed, what)

    def bad_inputs(self, backend: Any) -> list[Any]:
        V = len(backend.byte_vocab)
        bad: list[Any] = [[], [-1], [V], [V + 1000], [1.5], ["a"], "text", [True], None]
        limit = getattr(backend, "max_context_length", None)
        if limit is not None and limit < 100_000:
            bad.append([0] * (limit + 1))
        return bad

    @pytest.mark.asyncio
    async def test_bad_inputs_raise_and_backend_stays_healthy(self, backend: Any) -> None:
        good = self.contexts(backend, seed=6)
        expected = [backend.next_token_logprobs_sync(c) for c in good]
        for bad in self.bad_inputs(backend):
            with pytest.raises(ValueError):
                backend.next_token_logprobs_sync(bad)
            with pytest.raises(ValueError):
                await backend.next_token_logprobs(bad)
        backend.clear_cache()
        # one bad request among concurrent good ones fails alone
        tasks = [backend.next_token_logprobs(c) for c in good] + [backend.next_token_logprobs([-5])]
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(results[-1], ValueError)
        for exp, got in zip(expected, results[:-1]):
            assert not isinstance(got, BaseException), got
            self.assert_close(backend, got, exp, "a good row beside a bad input")
        with pytest.raises(ValueError):
            await backend.batch_next_token_logprobs([good[0], [-1]])
        self.assert_close(
            backend, backend.next_token_logprobs_sync(good[0]), expected[0], "a row after bad inputs"
        )

    def test_context_past_the_limit(self, backend: Any) -> None:
        """A context one token past ``max_context_length`` is refused on every path with a
        ``ValueError`` naming its length, the limit, what sets it (the model's window, or
        the load() option below it: a KV budget, ``n_ctx``, ``max_model_len``) and the fix;
        the calls beside it get their rows, and its prefixes are computed as from a cleared
        cache (:mod:`genlm_core.testing.limits`)."""
        from genlm_core.testing.limits import check_context_limit, checkpoint_window

        window = checkpoint_window(self.checkpoint_source(backend))
        check_context_limit(
            backend, self.token_ids(backend), window, self.assert_close, self.limit_context_max
        )

    def test_no_state_kept_across_event_loops(self, backend: Any) -> None:
        """One ``asyncio.run`` per step (sync wrappers, CLIs, notebooks): once a step's
        loop is closed, neither the loop nor a row it computed stays alive."""
        base = self.contexts(backend, seed=8)
        ids = [c[0] for c in self.contexts(backend, seed=9)]
        loops: list[weakref.ref] = []
        rows: list[weakref.ref] = []

        async def step(i: int) -> None:
            loops.append(weakref.ref(asyncio.get_running_loop()))
            out = await asyncio.gather(
                *(backend.next_token_logprobs(c + [ids[i % len(ids)]] * (i + 1)) for c in base)
            )
            rows.extend(weakref.ref(r) for r in out)

        backend.clear_cache()
        for i in range(self.loop_steps):
            asyncio.run(step(i))
        backend.clear_cache()
        # a worker thread that has just delivered the last batch may still hold its task for a
        # moment (its frame has not returned yet): wait for that, not for a leak, which stays
        deadline = time.monotonic() + 10.0
        while True:
            gc.collect()
            live_loops = sum(r() is not None for r in loops)
            live_rows = sum(r() is not None for r in rows)
            if not (live_loops or live_rows) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert live_loops == 0, "a closed event loop is still referenced"
        assert live_rows == 0, "a row of a finished event loop is still referenced"

    @pytest.mark.asyncio
    async def test_engine_gets_distinct_contexts(self, backend: Any, monkeypatch: Any) -> None:
        """Every engine call receives distinct contexts, whatever the callers repeat (the
        batcher and the sync batch path merge them): engines need no de-duplication."""
        seen: list[list[tuple[int, ...]]] = []
        engine = backend.engine
        if "resume" in engine.supports:  # the core hands rows to resume: their contexts
            original_rows = engine.forward_rows

            def spy_rows(rows: list[Any]) -> Any:
                seen.append([r.context for r in rows])
                return original_rows(rows)

            monkeypatch.setattr(engine, "forward_rows", spy_rows)
        else:
            original = engine.forward

            def spy(contexts: list[tuple[int, ...]]) -> Any:
                seen.append(list(contexts))
                return original(contexts)

            monkeypatch.setattr(engine, "forward", spy)
        a, b = self.contexts(backend, seed=8)[:2]
        backend.clear_cache()
        backend.batch_next_token_logprobs_sync([a, b, a, a])
        backend.clear_cache()
        await asyncio.gather(*(backend.next_token_logprobs(c) for c in (a, b, a, b, a)))
        backend.clear_cache()
        await backend.batch_next_token_logprobs([b, a, b])
        assert seen, "no engine call was made"
        for call in seen:
            assert len(call) == len(set(call)), call

    # ------------------------------------------------------------------ contract surface
    def test_contract_surface(self, backend: Any) -> None:
        """What callers rely on beyond the rows (:class:`~genlm_core.protocols.LogprobBackend`)."""
        assert backend.vocab_size == len(backend.byte_vocab)
        assert backend.dtype in ("float32", "float16", "bfloat16")
        assert str(backend.device)
        stats = backend.stats()
        assert isinstance(stats, dict) and "batcher" in stats
        info = backend.info()
        assert info["vocab_size"] == backend.vocab_size and info["device"] == str(backend.device)
        assert callable(backend.close)

    # ------------------------------------------------------------------ LoRA
    def lora_adapters(self, backend: Any) -> list[str] | None:
        """Two LoRA adapter folders for the backend's model, for a class whose engine
        declares the capability ``"lora"`` (None: this class does not check LoRA; another
        class of the plugin's, with a backend that loads adapters, does)."""
        return None

    def test_lora(self, backend: Any) -> None:
        """LoRA adapters (capability ``"lora"``, bookkept by the core): loading one changes
        no row; activating it changes the rows, which then equal the adapter's uncached
        rows; switching back and forth never serves a row cached under another adapter;
        ``clear_lora`` brings back the base rows; bad names and folders are clear errors.
        A backend whose engine does not declare it refuses ``load_lora``."""
        if not backend.supports_lora:
            with pytest.raises(NotImplementedError, match="LoRA"):
                backend.load_lora("/nonexistent", "x")
            return
        folders = self.lora_adapters(backend)
        if folders is None:
            return
        assert len(folders) >= 2, "lora_adapters returns two adapter folders"
        ctxs = self.contexts(backend, seed=11)[:3]
        names = [f"kit-{i}-{id(self)}" for i in range(2)]

        def rows() -> Any:
            return backend.batch_next_token_logprobs_sync(ctxs)

        def uncached() -> Any:
            import torch

            return torch.stack([backend.next_token_logprobs_uncached(c) for c in ctxs])

        backend.clear_lora()
        base = rows()
        backend.load_lora(folders[0], names[0])
        self.assert_close(backend, rows(), base, "rows after loading an adapter (not active)")
        assert backend.active_lora is None and names[0] in backend.loras
        with pytest.raises(ValueError, match="already loaded"):
            backend.load_lora(folders[0], names[0])
        with pytest.raises(ValueError, match="not found"):
            backend.load_lora(folders[0] + "-missing", "other")
        with pytest.raises(ValueError, match="no LoRA adapter named"):
            backend.set_lora("never-loaded")
        backend.load_lora(folders[1], names[1])
        try:
            backend.set_lora(names[0])
            assert backend.active_lora == names[0] and backend.stats()["engine"]["active_lora"] == names[0]
            first = rows()
            self.assert_close(backend, first, uncached(), f"rows under adapter {names[0]} against uncached")
            assert (first - base).abs().max() > 100 * backend_bound(self, backend, base), (
                "activating the adapter changed no row: the adapter is not applied"
            )
            backend.set_lora(names[1])
            second = rows()
            self.assert_close(backend, second, uncached(), f"rows under adapter {names[1]} against uncached")
            assert (second - first).abs().max() > 100 * backend_bound(self, backend, base)
            backend.set_lora(names[0])
            self.assert_close(backend, rows(), first, f"rows under {names[0]} again (no row of {names[1]})")
        finally:
            backend.clear_lora()
        assert backend.active_lora is None
        self.assert_close(backend, rows(), base, "base rows after clear_lora")

    # ------------------------------------------------------------------ programs
    def test_random_programs(self, backend: Any) -> None:
        """Random programs (:mod:`genlm_core.testing.programs`: contexts taking a token,
        forking, jumping several tokens, backing up, asked again, dying, new prompts) run
        through batch calls, concurrent calls and cache clears; every row of every step
        equals the context computed alone without any cache."""
        from genlm_core.testing.programs import alone, program_steps, random_program
        from genlm_core.testing.tolerance import RowComparisons

        tokens = self.token_ids(backend)
        longest = min(48, (getattr(backend, "max_context_length", None) or 49) - 1)
        oracle = alone(backend)
        rows = RowComparisons(
            lambda got, want, what: self.assert_close(backend, got, want, what),
            f"the rows of programs {list(self.program_seeds)}",
        )
        for seed in self.program_seeds:
            backend.clear_cache()
            program = random_program(
                tokens,
                seed,
                steps=self.program_steps,
                max_len=longest,
                prompt_lengths=self.program_prompt_lengths,
            )
            for step, (contexts, got) in enumerate(zip(program, program_steps(backend, program, seed))):
                for c, row in zip(contexts, got):
                    rows.add(row, oracle(c), f"program {seed}, step {step}, a {len(c)}-token context")
        rows.finish()

    # ------------------------------------------------------------------ bursts
    def test_burst_matches_steps(self, backend: Any) -> None:
        """An SMC program (:mod:`genlm_core.testing.burst`: proposals at temperature 1.3,
        weights, resampling every 3 steps through aborts and re-adds) run as a burst draws
        the same tokens and weights as the same program through per-step calls, where both
        ran the same tokens through the model; where they did not (a step loop whose prefix
        cache evicted what a burst's decode batch kept), the mean differences of the
        log-marginal-likelihood and length over 20 seeds are within sampling noise and
        float32 rounding of 0 (:func:`~genlm_core.testing.burst.check_parity`). A backend
        without bursts says so: ``supports_burst`` False, ``run_burst`` refused."""
        from genlm_core.testing.burst import ProgramControl, SMCProgram, check_parity

        if not getattr(backend, "supports_burst", False):
            if hasattr(backend, "run_burst"):
                with pytest.raises(NotImplementedError, match="supports_burst"):
                    backend.run_burst(ProgramControl(SMCProgram([0], [])), max_steps=1)
            return
        prompt = self.contexts(backend, seed=5)[0]
        check_parity(backend, prompt, atol=self.atol, seeds=(0, 1))

    def test_decode_batches(self, backend: Any) -> None:
        """An engine with its own decode step (capability ``"decode"``: ``decode_step`` and
        ``end_burst`` keeping batches between a burst's steps, with KV reuse on) resumes its kept batches, runs each token once,
        hands every row's KV to the prefix cache when the burst ends, and every row it
        returns is the uncached model's - with another caller's calls between its steps, a
        cache clear in the middle, and a control that fails
        (:func:`~genlm_core.testing.burst.check_decode_batches`)."""
        from genlm_core.testing.burst import check_decode_batches

        engine = getattr(backend, "engine", None)
        if (
            not getattr(backend, "supports_burst", False)
            or "decode" not in getattr(engine, "supports", ())
            or not getattr(backend, "kv_reuse", False)
        ):
            return  # the core's decode step: its forward, which the other tests check
        check_decode_batches(backend, self.contexts(backend, seed=6)[0], atol=self.atol)

    # ------------------------------------------------------------------ checkpoint policy
    def checkpoint_source(self, backend: Any) -> CheckpointSource:
        """Where the backend's checkpoint is: :func:`find_checkpoint` (override for a
        backend whose checkpoint it cannot find)."""
        return find_checkpoint(backend)

    def test_checkpoint_policy(self, backend: Any, request: Any) -> None:
        """Default EOS ids, context limit and dtype follow :mod:`genlm_core.engine.checkpoint`,
        read from the checkpoint's own files: a model folder's ``config.json`` and
        ``generation_config.json``, a GGUF file's metadata (read by the core,
        :mod:`genlm_core.engine.gguf_metadata`, not by the engine). A backend that declares it
        loads no model (``model_formats=[]``: a table, a mock) has no positions and no
        weights, and the policy's answer for that case is checked: the EOS ids of the
        tokenizer (or of the folder lending it one), no limit from a checkpoint, float32.
        Which checkpoint each class was checked against is listed at the end of the run
        (section "checkpoint policy" of the kit's pytest plugin)."""
        from genlm_core.engine import checkpoint

        eos = backend.eos_token_ids
        assert eos == sorted(set(eos)) and all(0 <= e < backend.vocab_size for e in eos)
        limit = backend.max_context_length
        assert limit is None or (isinstance(limit, int) and limit >= 1)
        source = self.checkpoint_source(backend)
        request.config.stash.setdefault(CHECKED_CHECKPOINTS, []).append((request.node.nodeid, source))
        if source.kind == "gguf":
            from genlm_core.engine.gguf_metadata import read_gguf_metadata

            config, generation = read_gguf_metadata(source.path).checkpoint_config(), {}
        else:
            config = checkpoint.read_config(source.path)
            generation = checkpoint.read_generation_config(source.path)
        expected_eos = checkpoint.default_eos_ids(
            generation, config, getattr(backend.tokenizer, "eos_token_id", None), backend.vocab_size
        )
        assert eos == expected_eos, (eos, expected_eos, source)
        # no model loaded: no positions; otherwise an engine option may lower the limit (vLLM
        # max_model_len, llama.cpp n_ctx), never raise it
        expected_limit = None if source.kind == "none" else checkpoint.context_limit(config)
        assert limit == expected_limit or (
            limit is not None and (expected_limit is None or limit < expected_limit)
        ), (limit, expected_limit, source)
        if source.requested_dtype == "auto":
            # a GGUF's dtype is its weights' (none for quantised ones); else the placement's
            # "auto" (genlm_core.engine.placement.auto_dtype): the folder's declared dtype,
            # else the backend's config's default (the core's: float32)
            if source.kind == "gguf":
                want = config.get("dtype")
            else:
                from genlm_core.config import BackendConfig
                from genlm_core.engine.placement import auto_dtype

                default = getattr(type(getattr(backend, "config", None)), "default_dtype", None)
                files = checkpoint.Checkpoint.of_files(source.path if source.kind == "folder" else None)
                want = auto_dtype(files, default or BackendConfig.default_dtype)
            assert want is None or backend.dtype == want, (backend.dtype, want, source)


def backend_bound(kit: LogprobBackendConformance, backend: Any, rows: Any) -> float:
    """The tolerance ``kit`` applies to ``backend``'s ``rows`` (its ``atol``, else the
    derived bound of the largest row): a difference far above it is a real one."""
    from genlm_core.testing.tolerance import row_atol, row_magnitude

    if kit.atol is not None:
        return kit.atol
    return row_atol(kit.model_shape(backend), row_magnitude(rows), backend.dtype)
