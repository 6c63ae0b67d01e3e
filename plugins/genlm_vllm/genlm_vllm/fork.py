"""Forking a live request's KV: a new request copies the blocks of its prompt that a live
request (its *source*) holds and vLLM's prefix cache cannot supply, instead of prefilling
them.

Why: vLLM's prefix cache shares *full* KV blocks only (``block_size`` tokens, 32-128 on a
CPU; a block of a dense model's single KV cache group holds no sub-block hits). When 32
particles extend one 907-token prompt by a token each, one continues the prompt's row (a
streaming-input session, :mod:`genlm_vllm.sessions`) and the other 31 start new requests:
each re-prefilled the prompt's last 11 tokens past its last full 128-token block (and a
resampled particle the tail of its parent's context), 1.2x the tokens a run needs. Here the
source's partial last block is copied into the new request's own block (vLLM's own
``copy_kv_cache_blocks_inplace``, what its copy-on-write of sub-block hits runs), and the
request computes its own new tokens only.

How: :class:`ForkConnector` is a KV connector (vLLM's public ``KVConnectorBase_V1``
extension point, ``kv_transfer_config`` with ``kv_connector_module_path``), synchronous,
in the engine's scheduler and on every worker:

* a request asks for a fork with ``SamplingParams.extra_args["kv_transfer_params"] =
  {"genlm_fork": [source_request_id, tokens]}`` (:func:`fork_params`): its first
  ``tokens`` tokens are the source's;
* the scheduler side (``get_num_new_matched_tokens``) checks, when the request is first
  scheduled, that the source is still live, has computed at least ``tokens`` tokens whose
  ids are the request's, under the same adapter, and holds their blocks; then it reports
  the tokens past vLLM's own prefix-cache hit (block-aligned) as loaded, and after the
  allocation (``update_state_after_alloc``) pairs the source's blocks with the request's
  new ones; anything else (a source ended, preempted, or of other tokens) forks nothing
  and the request prefills as before;
* the step's model runner copies those block pairs in every layer's KV cache after zeroing
  the step's new blocks and before its forward: they are added to the scheduler output's
  ``kv_cache_block_copies``, the channel of vLLM's own copy-on-write (the connector's
  worker side is one object per process, shared by every in-process engine: it does
  nothing).

A copied block is the source's own KV: the request's logits are those of a prefill over
that KV, bit-identical on the CPUs measured (as a session's continued row is). The copy is
per step, of whole blocks (``block_size`` tokens x every layer), in the engine's process.
vLLM counts the copied tokens as cached (``RequestOutput.num_cached_tokens``), so the
backend's ``tokens_computed`` does not count them; :attr:`ForkConnector.counts` (scheduler
side) says how many forks and tokens were copied.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)

if TYPE_CHECKING:  # pragma: no cover
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

__all__ = ["FORK_KEY", "ForkConnector", "fork_params", "transfer_config"]

#: the key of a fork request in ``kv_transfer_params``
FORK_KEY = "genlm_fork"


def transfer_config() -> dict[str, Any]:
    """The ``vllm.LLM(kv_transfer_config=...)`` that installs :class:`ForkConnector`."""
    return {
        "kv_connector": "ForkConnector",
        "kv_connector_module_path": __name__,
        "kv_role": "kv_consumer",
    }


def fork_params(source_request_id: str, tokens: int) -> dict[str, Any]:
    """``SamplingParams.extra_args`` entries asking to copy the first ``tokens`` tokens'
    KV from the live request ``source_request_id`` (vLLM's internal id)."""
    return {"kv_transfer_params": {FORK_KEY: [source_request_id, int(tokens)]}}


class ForkMetadata(KVConnectorMetadata):
    """Nothing for the workers: the copies ride on the scheduler output's own
    ``kv_cache_block_copies`` (:meth:`ForkConnector.build_connector_meta`)."""


class ForkConnector(KVConnectorBase_V1, SupportsHMA):
    """See the module doc. One instance in the scheduler, one per worker."""

    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        groups = kv_cache_config.kv_cache_groups
        #: forking needs one KV cache group of full attention (dense decoders); else a no-op
        self.enabled = len(groups) == 1 and type(groups[0].kv_cache_spec).__name__ == "FullAttentionSpec"
        self.block_size = int(groups[0].kv_cache_spec.block_size) if groups else 0
        # scheduler side
        self._live: dict[str, Request] = {}  # request id -> request, while it holds KV
        self._planned: dict[str, tuple[str, int, int]] = {}  # request id -> (source, start, tokens)
        self._copies: list[tuple[int, int]] = []
        #: scheduler side: forks made, tokens copied, forks refused (source gone or different;
        #: a fork whose tokens vLLM's prefix cache holds in full is neither)
        self.counts = {"forks": 0, "fork_tokens": 0, "forks_refused": 0}

    # ------------------------------------------------------------------ scheduler
    def on_new_request(self, request: Request) -> None:
        self._live[request.request_id] = request

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        self._planned.pop(request.request_id, None)
        ask = (request.kv_transfer_params or {}).get(FORK_KEY)
        if not ask or not self.enabled:
            return 0, False
        source_id, tokens = str(ask[0]), int(ask[1])
        if tokens <= num_computed_tokens:  # vLLM's prefix cache holds them all: nothing to copy
            return 0, False
        if not self._can_fork(request, source_id, tokens, num_computed_tokens):
            self.counts["forks_refused"] += 1
            return 0, False
        self._planned[request.request_id] = (source_id, num_computed_tokens, tokens)
        return tokens - num_computed_tokens, False

    def _can_fork(self, request: Request, source_id: str, tokens: int, start: int) -> bool:
        source = self._live.get(source_id)
        if source is None or source is request or source.is_finished():
            return False
        # the request computes at least one token of its own (vLLM needs one)
        if tokens >= request.num_tokens or source.num_computed_tokens < tokens:
            return False
        if _adapter(source) != _adapter(request):
            return False
        if list(source.all_token_ids[:tokens]) != list(request.all_token_ids[:tokens]):
            return False
        assert self._kv_cache_manager is not None
        held = self._kv_cache_manager.get_block_ids(source_id)[0]
        return len(held) * self.block_size >= tokens

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        planned = self._planned.pop(request.request_id, None)
        if not num_external_tokens or planned is None:
            return
        source_id, start, tokens = planned
        assert self._kv_cache_manager is not None
        src = self._kv_cache_manager.get_block_ids(source_id)[0]
        dst = blocks.get_block_ids()[0]
        bs = self.block_size
        first, last = start // bs, (tokens + bs - 1) // bs
        self._copies += [(src[j], dst[j]) for j in range(first, last) if src[j] != dst[j]]
        self.counts["forks"] += 1
        self.counts["fork_tokens"] += tokens - start

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        """The step's copies ride on the step's own ``kv_cache_block_copies`` (what vLLM's
        copy-on-write of sub-block hits fills): every engine's model runner copies them in
        its own KV caches, after zeroing the step's new blocks and before the forward. The
        worker side of a connector is one object per process (``get_kv_transfer_group``),
        shared by every in-process engine and dropped when the first one shuts down: it
        holds nothing here."""
        copies, self._copies = self._copies, []
        if copies:
            from vllm.v1.core.kv_cache_utils import KVCacheBlockCopy

            scheduler_output.kv_cache_block_copies = [
                *(scheduler_output.kv_cache_block_copies or ()),
                *(KVCacheBlockCopy(s, d) for s, d in copies),
            ]
        return ForkMetadata()

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._forget(request)
        return False, None

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        self._forget(request)
        return False, None

    def _forget(self, request: Request) -> None:
        self._live.pop(request.request_id, None)
        self._planned.pop(request.request_id, None)

    # ------------------------------------------------------------------ worker (no-ops)
    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        return

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return

    def wait_for_save(self) -> None:
        return


def _adapter(request: Request) -> int:
    lora = getattr(request, "lora_request", None)
    return int(lora.lora_int_id) if lora is not None else 0
