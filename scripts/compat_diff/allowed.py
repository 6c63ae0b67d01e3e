"""The intended differences between genlm-compat and genlm-backend 0.3.1 / genlm-bytes 0.2.0.

Each entry names the observations of one case (``cases.py``) where genlm-compat answers
otherwise on purpose, and why. The differential suite fails when such an observation
agrees after all (a stale entry) and when any other observation differs.
``docs/migration.md`` shows this list (:func:`markdown`, between the markers
:data:`BEGIN` and :data:`END`); the suite checks the two are the same.

Usage: ``python allowed.py`` prints the Markdown section.
"""

from __future__ import annotations

from dataclasses import dataclass

BEGIN = "<!-- allowed differences: generated from scripts/compat_diff/allowed.py -->"
END = "<!-- end of allowed differences -->"


@dataclass(frozen=True)
class Allowed:
    case: str
    observations: tuple[str, ...]
    what: str
    reference: str
    compat: str


ALLOWED: tuple[Allowed, ...] = (
    Allowed(
        "character_trie_max_of_logprobs",
        ("max",),
        "`TokenCharacterTrie.weight_max` of log-probabilities",
        "internal nodes are clamped at 0.0 (the max starts from 0): wrong for negative weights",
        "the max of the weights below each node, any real weights",
    ),
    Allowed(
        "byte_trie_masses",
        ("max", "batch_max"),
        "`genlm.bytes.TokenByteTrie.weight_max` of the EOS node",
        "0.0 (no token reaches it outside `TrieMode.WITH_EOS`)",
        "`-inf`, the max of no weight (right for log-weights too)",
    ),
    Allowed(
        "async_tries",
        ("bytes.sums",),
        "`AsyncTokenByteTrie.weight_max` of the EOS node",
        "0.0",
        "`-inf` (as `TokenByteTrie.weight_max`)",
    ),
    Allowed(
        "character_trie_bad_weights",
        ("nan", "inf", "short", "long"),
        "NaN, infinite, too short or too long weight vectors in `weight_sum`",
        "reads past the vector's end (garbage masses) or spreads NaN",
        "`ValueError` naming the bad entry or the expected shape",
    ),
    Allowed(
        "batch_with_one_bad_request",
        ("callers",),
        "one bad request among concurrent ones",
        "the whole batch fails: every caller gets the `IndexError`",
        "only the bad caller fails; the others get their results",
    ),
    Allowed(
        "results_belong_to_the_caller",
        ("again",),
        "editing a returned logprob tensor in place",
        "the tensor is the cached object: a later call for the same context returns the edited values",
        "every call returns a tensor of its own",
    ),
    Allowed(
        "stateful_lm",
        ("limit_kept",),
        "`StatefulTokenizedLM(max_context_length=...)` after `<<`",
        "the new state has no limit (`max_context_length` is lost after one step)",
        "every extended state keeps the limit",
    ),
    Allowed(
        "beam_params_validation",
        ("zero_width", "threshold_one", "lone_bytes"),
        "`BeamParams` checks",
        "accepts `K=0` and `prune_threshold >= 1` (beams that can hold nothing); a lone "
        '`eos_byte_strings=b"<e>"` becomes the set of its byte values',
        "`ValueError` for `K < 1` or `prune_threshold` outside [0, 1); a lone bytes or str value is one EOS token",
    ),
    Allowed(
        "empty_batch",
        ("sync", "async"),
        "`batch_next_token_logprobs([])`",
        "`RuntimeError` from `torch.stack`",
        "an empty `(0, len(byte_vocab))` tensor",
    ),
    Allowed(
        "mock_lm",
        ("out_of_range", "empty"),
        "`MockAsyncLM` with an empty or out-of-vocabulary context",
        "answers anyway",
        "refuses it as the real engines do (`ValueError`, an `IndexError` too for the ids)",
    ),
    Allowed(
        "byte_beam",
        ("bad_byte",),
        "`beam << 300` (not a byte)",
        "returns a beam",
        "`ValueError`: a beam reads bytes 0-255 or EOS (257)",
    ),
    Allowed(
        "unported_names",
        (
            "Query",
            "check_byte_decoder",
            "get_byte_tokens_from_byte_decoder",
            "get_byte_tokens_from_sp",
        ),  # fmt: skip
        "`genlm.backend.llm.hf.Query`, `tokenization.bytes.check_byte_decoder`, "
        "`get_byte_tokens_from_byte_decoder`, `get_byte_tokens_from_sp`",
        "internals of genlm-backend's batching and vocabulary decoding",
        "import, and raise `NotImplementedError` naming the genlm-core equivalent (genlm-hf forms its own "
        "batches; `decode_vocab` / `get_byte_vocab` decode any tokenizer)",
    ),
    Allowed(
        "unported_names",
        ("StatefulByteLM",),
        "`genlm.bytes.byte_lm.lm_state.StatefulByteLM`",
        "the abstract base of `ByteBeamState`",
        "a name that raises on use: `ByteBeamState` is genlm-core's beam (its `greedy`, `sample`, `prefill`, "
        "`logp_next` are there)",
    ),
    Allowed(
        "unported_names",
        ("LazyTrieState.initial",),
        "`LazyTrieState.initial(llm, async_trie)`",
        "builds a beam candidate from a model and a `TokenByteTrie`",
        "`LazyTrieState` is genlm-core's candidate (`initial(StatefulTokenizedLM, mass trie)`); beams build "
        "their own: use `ByteBeamState.initial`",
    ),
    Allowed(
        "added_names",
        ("genlm.bytes.EOS", "genlm.bytes.EOT", "AsyncRemoteLM"),
        "names genlm-compat adds",
        "absent",
        "`genlm.bytes.EOS` (257) and `EOT` (`None`); `genlm.backend.llm.AsyncRemoteLM` and "
        '`load_model_by_name(..., backend="remote")` (a model served by `genlm serve`)',
    ),
)


def lookup() -> dict[tuple[str, str], Allowed]:
    """``(case, observation) -> entry``."""
    return {(a.case, o): a for a in ALLOWED for o in a.observations}


def markdown() -> str:
    """The section of docs/migration.md (between :data:`BEGIN` and :data:`END`)."""
    rows = ["| | genlm-backend 0.3.1 / genlm-bytes 0.2.0 | genlm-compat |", "|---|---|---|"]
    rows += [f"| {a.what} | {a.reference} | {a.compat} |" for a in ALLOWED]
    return "\n".join([BEGIN, *rows, END])


if __name__ == "__main__":
    print(markdown())
