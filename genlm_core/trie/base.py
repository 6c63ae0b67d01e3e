"""Common surface of the trie implementations: structure access, the checks every
implementation applies to its options and weights, visualisation.

Weights (every implementation, every path: eager, lazy, batch, max):

* ``weight_sum`` needs finite weights (negative and zero entries are fine). A NaN
  or infinite weight, or finite weights whose float64 sum overflows, raises
  :class:`NonFiniteWeightsError` naming the row and position: a prefix-sum layout
  cannot give ``inf`` its brute-force meaning (``inf - inf`` is NaN in unrelated
  branches), and a NaN mass is never what a caller wants. The check reads the
  total the sums compute anyway (a sum of floats is finite only if every term is).
* ``weight_max`` accepts ``-inf`` and ``inf`` (log-space weights; the max is exact)
  and rejects NaN the same way.
* dtypes: float16 / bfloat16 / integer weights are upcast to float32 on the host
  (float64 stays float64); complex, bool or object arrays raise ``TypeError``.
* ``batch_*`` of a ``(0, len(decode))`` array returns a ``(0, num_nodes)`` result;
  an empty *list* raises (it has no shape to read the vocabulary size from).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from genlm_core.token import Token
from genlm_core.trie.structure import EOS, EOT, EOSMode, TrieStructure, coerce_mode

__all__ = ["BaseTokenByteTrie", "NonFiniteWeightsError"]


class NonFiniteWeightsError(ValueError):
    """Weights a trie cannot aggregate: NaN (any method) or infinite (``weight_sum``).

    ``row`` is the batch row (``None`` for a single vector), ``position`` the token
    id of the first bad weight (``None`` when only the sum overflows)."""

    def __init__(self, message: str, row: int | None = None, position: int | None = None) -> None:
        super().__init__(message)
        self.row = row
        self.position = position


def nonfinite_error(w: Any, op: str, row: int | None = None) -> NonFiniteWeightsError:
    """The error for weights ``w`` (one row, numpy or torch) that failed the check
    of ``op`` (``"sum"``: every weight finite; ``"max"``: no NaN)."""
    a = w.detach().cpu().double().numpy() if type(w).__module__.startswith("torch") else np.asarray(w)
    a = np.asarray(a, dtype=np.float64).reshape(-1)
    bad = np.flatnonzero(np.isnan(a) if op == "max" else ~np.isfinite(a))
    if bad.size == 0:
        where = "weights" if row is None else f"weights row {row}"
        return NonFiniteWeightsError(
            f"{where}: the float64 sum of the weights overflows (largest |weight| "
            f"{np.abs(a).max():.3g}); scale the weights down",
            row,
        )
    pos = int(bad[0])
    where = f"weights[{pos}]" if row is None else f"weights[{row}, {pos}]"
    more = f" (and {bad.size - 1} more)" if bad.size > 1 else ""
    if op == "max":
        fix = "weight_max accepts any real weights and -inf/inf, not NaN"
    else:
        fix = (
            "weight_sum needs finite weights (probabilities, or any finite reals); "
            "for log-probabilities use weight_max, or exp() them first"
        )
    return NonFiniteWeightsError(f"{where} = {float(a[pos])!r}{more}: {fix}", row, pos)


def first_bad_row(flags: Sequence[bool] | np.ndarray) -> int | None:
    """Index of the first true flag, or ``None``."""
    idx = np.flatnonzero(np.asarray(flags))
    return int(idx[0]) if idx.size else None


def check_device_cpu(device: Any, cls: str) -> None:
    """The CPU trie accepts ``device`` for a common signature: ``None``, ``"auto"``
    or ``"cpu"`` only."""
    if device is None or str(device) in ("auto", "cpu"):
        return
    raise ValueError(
        f"{cls} runs on the CPU, got device={device!r}; use device='cpu' (or None), or "
        "TorchTokenByteTrie / make_trie(vocab, device=...) for an accelerator"
    )


def check_positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


class BaseTokenByteTrie:
    """Structure attributes shared by every implementation.

    Attributes mirror genlm-bytes' ``TokenByteTrie``: ``root``, ``children``
    (``children[node]`` is a dict: byte ``int`` / ``(None, token_id)`` end-of-token
    edge / atomic ``bytes`` / ``EOS`` -> child node; ``.get(None)`` gives the
    lowest-id end-of-token leaf), ``node2prefix`` (node -> ``bytes``), ``word2leaf``,
    ``leaf2word``, ``leaf2token_id``, ``decode`` (the vocabulary as ``Token``),
    ``num_nodes``, ``eos_node`` (``None`` without EOS tokens), ``eot_token`` (``None``), ``eos_tokens``,
    ``eos_token_ids``. See :mod:`genlm_core.trie.structure` for the numbering.
    """

    EOS = EOS
    EOT = EOT
    #: ``weight_sum(..., lazy=True)`` returns masses computed on access
    #: (:class:`~genlm_core.trie.node_masses.NodeMasses`); ``False``: it is accepted
    #: and computes the eager result.
    computes_lazily: bool = False

    def __init__(
        self,
        decode: Iterable[bytes | Token] | TrieStructure,
        eos_tokens: Iterable[bytes | Token] | None = (),
        atomic_tokens: Iterable[bytes | Token] | None = (),
    ) -> None:
        if isinstance(decode, TrieStructure):
            self.structure = decode
        else:
            self.structure = TrieStructure(decode, eos_tokens or (), atomic_tokens or ())
        s = self.structure
        self.root = s.root
        self.eos_node = s.eos_node
        self.num_nodes = s.num_nodes
        self.children = s.children
        self.node2prefix = s.node2prefix
        self.word2leaf = s.word2leaf
        self.leaf2word = s.leaf2word
        self.leaf2token_id = s.leaf2token_id
        self.eot_token = EOT
        self.eot_sentinel = EOT  # genlm-bytes 0.2 name
        self.eos_tokens = s.eos_tokens
        self.eos_token_ids = s.eos_token_ids
        self.atomic_tokens = s.atomic_tokens

    def _reject_unknown(self, options: dict[str, Any]) -> None:
        """Raise a ``ConfigError`` naming unknown constructor options (with close
        matches among the accepted ones)."""
        if not options:
            return
        import inspect

        from genlm_core.config import reject_unknown_options

        params = inspect.signature(type(self).__init__).parameters.values()
        accepted = [
            p.name for p in params if p.name not in ("self", "decode") and p.kind is not p.VAR_KEYWORD
        ]
        reject_unknown_options(type(self).__name__, options, accepted)

    # genlm-bytes' LazyTrieState reaches the structure through ``async_trie.trie``;
    # a plain trie answers ``.trie`` with itself so both spellings work.
    @property
    def trie(self) -> "BaseTokenByteTrie":
        return self

    def __len__(self) -> int:
        return self.num_nodes

    @property
    def decode(self) -> list[Any]:
        """The vocabulary by position (``Token`` objects, and symbols as given)."""
        return self.structure.decode

    @property
    def vocab_size(self) -> int:
        return self.structure.num_leaves

    def leaves_of(self, node: int) -> list[int]:
        """All end-of-token leaves hanging below ``node`` (duplicates included)."""
        return self.structure.leaves_of(node)

    @staticmethod
    def _mode(mode: Any) -> EOSMode:
        return coerce_mode(mode)

    def visualize(self, ws: Any = None) -> Any:
        """A ``graphviz.Digraph`` of the trie, optionally labelled with node weights
        ``ws`` (length ``num_nodes``, e.g. the output of :meth:`weight_sum`)."""
        from genlm_core.trie.viz import visualize

        return visualize(self, ws)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(vocab={len(self.decode)}, nodes={self.num_nodes}, "
            f"eos={len(self.eos_token_ids)}, atomic={len(self.atomic_tokens)})"
        )
