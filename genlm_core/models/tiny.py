"""Tiny random models for tests and benchmarks, built offline in seconds, deterministically.

:func:`tiny_model_path` builds ``"llama"`` and ``"gpt2"`` (2 layers, hidden size 64,
head_dim 32, 256 positions) with a byte-level BPE tokenizer trained on a text shipped
with the package (:data:`TINY_CORPUS`), and ``"llama-spm"``: the same Llama shapes with
a Llama-2-style sentencepiece tokenizer (BPE with byte fallback, ``tokenizer.model``
beside ``tokenizer.json``), the sentencepiece case of the byte-vocabulary and GGUF tests.
Fixed seeds: every host builds the same bytes (``tests/test_tiny_models_pinned.py``).

torch, transformers, tokenizers and sentencepiece are imported only inside the builders.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from genlm_core.models.store import BuildProgress, ensure_built, legacy_rope_keys, update_config_json

__all__ = [
    "TINY_ARCHS",
    "TINY_CORPUS",
    "TINY_EOS",
    "TINY_EXTRA_ARCHS",
    "TINY_MAX_POSITIONS",
    "TINY_ROPE_THETA",
    "TINY_VOCAB_SIZE",
    "tiny_model_path",
    "train_tiny_sentencepiece",
    "train_tiny_tokenizer",
]

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


#: the tiny tokenizers' training text, shipped as package data so every host builds the
#: same models: the license texts GPL-3, Apache-2.0, LGPL-2.1, MPL-2.0, Artistic, BSD and
#: GFDL-1.3 (verbatim copies, which each permits), three genlm-core modules frozen at the
#: time (so that code and indentation get merges) and a line of non-ASCII text
TINY_CORPUS = Path(__file__).parent / "data" / "tiny_corpus.txt"


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
    return ensure_built(key, key, lambda tmp, report: _build_tiny(arch, tmp, report), progress)


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


def _build_tiny(arch: str, out: Path, report: BuildProgress) -> dict[str, Any]:
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
        update_config_json(out, **legacy_rope_keys(config))
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
        update_config_json(out, n_ctx=TINY_MAX_POSITIONS)  # mlx-lm's GPT-2 requires it
        model.generation_config.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    corpus = hashlib.sha256("\x00".join(_tiny_corpus_texts()).encode()).hexdigest()
    return {"arch": arch, "vocab_size": vocab_size, "seed": seed, "corpus_sha256": corpus}
