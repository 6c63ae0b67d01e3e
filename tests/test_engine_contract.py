"""The engine contract: the core reads the checkpoint and places the engine once; an engine
loads from what it is handed and computes; the talk is one way.

Oracles: checkpoint folders and GGUF files written here with known values (the limit,
EOS ids and dtype they must give), engines written here that record what the core
hands them and refuse any attribute written into them, and the rows of the backend
itself (sampling without an engine sampler must draw what the rows say).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import genlm_core
from genlm_core import model_files
from genlm_core.config import BackendConfig
from genlm_core.engine import (
    BaseLogprobBackend,
    Checkpoint,
    Engine,
    EngineServices,
    Placement,
    SampleRequest,
    Token,
    UnsupportedDtypeError,
    place,
    read_checkpoint,
)
from genlm_core.engine import checkpoint as checkpoint_module
from genlm_core.errors import ConfigError

V = 8  # tokens of the test engines: bytes a..h


def folder(tmp_path: Path, config: dict, generation: dict | None = None, name: str = "m") -> str:
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    (path / "tokenizer.json").write_text("{}")
    if generation is not None:
        (path / "generation_config.json").write_text(json.dumps(generation))
    return str(path)


def gguf_file(tmp_path: Path, context_length: int, eos: int, file_type: int) -> str:
    import gguf  # llama.cpp's writer: an independent author of the file

    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(context_length)
    writer.add_eos_token_id(eos)
    writer.add_file_type(file_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return str(path)


class Tok:
    eos_token_id = 7


class TableEngine(Engine):
    """A fixed row per last token; records what the core asks."""

    def __init__(
        self,
        checkpoint: Checkpoint | None = None,
        config: Any = None,
        services: EngineServices | None = None,
        **facts: Any,
    ) -> None:
        self.services = services
        self.tokenizer = Tok()
        self.byte_vocab = [Token(i, bytes([97 + i])) for i in range(V)]
        self.table = torch.log_softmax(torch.arange(V * V, dtype=torch.float32).reshape(V, V) % 5, -1)
        self.calls: list[list[tuple[int, ...]]] = []
        self.checkpoint_seen = checkpoint
        for key, value in facts.items():
            setattr(self, key, value)

    def forward(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        self.calls.append(list(contexts))
        return self.table[torch.tensor([c[-1] for c in contexts])] * 3  # logits: the core normalises


class SamplingEngine(TableEngine):
    supports = frozenset({"sample"})

    def sample(self, requests: list[SampleRequest]) -> list[list[int]]:
        self.requests = getattr(self, "requests", []) + [list(requests)]
        return [[1] * r.max_tokens for r in requests]


# ---------------------------------------------------------------------- the checkpoint, read once
def test_a_folder_is_read_into_a_checkpoint(tmp_path: Path) -> None:
    path = folder(
        tmp_path,
        {"max_position_embeddings": 10, "eos_token_id": 3, "torch_dtype": "bfloat16"},
        {"eos_token_id": [5, 4]},
    )
    ckpt = read_checkpoint(BackendConfig(model=path), ["hf-folder", "hub-id"], "test")
    assert (ckpt.kind, ckpt.model, ckpt.tokenizer) == ("folder", path, path)
    assert ckpt.max_context_length == 9 and place(BackendConfig(model=path), ckpt).dtype == "bfloat16"
    assert ckpt.eos_token_ids(7, V) == [4, 5]  # generation_config wins over config.json and the tokenizer
    asked = BackendConfig(model=path, dtype="float16")
    assert place(asked, read_checkpoint(asked, None)) == Placement("cpu", "float16")


def test_a_gguf_file_is_read_from_its_metadata(tmp_path: Path) -> None:
    path = gguf_file(tmp_path, context_length=64, eos=2, file_type=1)  # F16 weights
    for formats in (["gguf"], ["hf-folder", "hub-id"]):  # a .gguf file is a GGUF checkpoint for any backend
        ckpt = read_checkpoint(BackendConfig(model=path), formats)
        assert (ckpt.kind, ckpt.path, ckpt.max_context_length) == ("gguf", path, 63)
        assert place(BackendConfig(model=path), ckpt).dtype == "float16"  # its weights' file type
        assert ckpt.eos_token_ids(7, V) == [2]

    class GGUFConfig(BackendConfig):
        def model_needs(self) -> tuple[str, ...]:
            return ()  # the file holds the tokenizer and the config

    by_folder = read_checkpoint(GGUFConfig(model=str(tmp_path)), ["gguf"])  # a GGUF reader, its folder
    assert by_folder.path == path
    (tmp_path / "other.gguf").write_bytes(b"")
    with pytest.raises(ConfigError, match="holds 2 .gguf files.*gguf_file"):
        read_checkpoint(GGUFConfig(model=str(tmp_path)), ["gguf"])


def test_model_none_is_the_default_model_for_what_the_backend_reads(tmp_path: Path, monkeypatch) -> None:
    path = folder(tmp_path, {"n_positions": 32})
    asked = []
    monkeypatch.setattr(checkpoint_module, "default_model", lambda gguf=False: asked.append(gguf) or path)
    assert read_checkpoint(BackendConfig(), ["hf-folder"]).model == path
    assert read_checkpoint(BackendConfig(), None).max_context_length == 31
    assert asked == [False, False]
    none = read_checkpoint(BackendConfig(), [])  # loads no model: nothing to resolve
    assert (none.kind, none.model, none.max_context_length) == ("none", None, None)
    assert place(BackendConfig(), none).dtype == "float32"  # the config's default_dtype


def test_the_folder_is_checked_and_read_once_per_load(tiny_llama_path: Path, monkeypatch) -> None:
    counts: dict[str, int] = {}

    def counting(module: Any, name: str) -> None:
        real = getattr(module, name)

        def spy(*args: Any, **kwargs: Any) -> Any:
            counts[name] = counts.get(name, 0) + 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)

    counting(model_files, "check_model_folder")
    counting(checkpoint_module, "read_config")
    counting(checkpoint_module, "read_generation_config")
    llm = genlm_core.load("mock", model=str(tiny_llama_path))  # a folder lending a tokenizer
    llm.close()
    assert counts == {"check_model_folder": 1, "read_config": 1, "read_generation_config": 1}


def test_a_served_model_is_not_read_here() -> None:
    class Served(BackendConfig):
        reads_checkpoint = False

    ckpt = read_checkpoint(Served(model="/not/on/this/machine"), None)
    assert (ckpt.kind, ckpt.max_context_length) == ("served", None)
    assert place(Served(), ckpt).dtype is None  # the server decided it
    assert place(Served(dtype="bf16"), ckpt).dtype == "bfloat16"  # asked: the engine checks it


# ---------------------------------------------------------------------- the backend decides
def backend(engine: Engine, ckpt: Checkpoint | None = None, **options: Any) -> BaseLogprobBackend:
    return BaseLogprobBackend(engine, BackendConfig(**options), ckpt, name="test")


def test_the_smaller_context_limit_and_the_checkpoints_eos_ids(tmp_path: Path) -> None:
    ckpt = read_checkpoint(
        BackendConfig(model=folder(tmp_path, {"max_position_embeddings": 10, "eos_token_id": 3}))
    )
    assert backend(TableEngine(max_positions=5), ckpt).max_context_length == 4  # the engine's own bound
    llm = backend(TableEngine(max_positions=51), ckpt)
    assert llm.max_context_length == 9  # the checkpoint's
    assert llm.eos_token_ids == [3]  # config.json over the tokenizer's 7
    with pytest.raises(ValueError, match="at most 9"):
        llm.next_token_logprobs_sync([1] * 10)
    assert backend(TableEngine()).eos_token_ids == [7]  # no checkpoint: the tokenizer's
    assert backend(TableEngine(eos_token_ids=[2, 6])).eos_token_ids == [
        2,
        6,
    ]  # the engine's tokenizer knows more


def test_a_dtype_is_refused_before_loading_and_the_engine_loads_placed(tmp_path: Path) -> None:
    loads: list[EngineServices] = []
    asked: list[str] = []

    class Float32Only(TableEngine):
        @classmethod
        def dtypes_on(cls, device: str) -> tuple[str, ...]:
            asked.append(device)
            return ("float32",)

        @classmethod
        def load(cls, checkpoint: Checkpoint, config: Any, services: EngineServices) -> "Float32Only":
            loads.append(services)
            return cls(checkpoint, config, services)

    ckpt = read_checkpoint(BackendConfig(model=folder(tmp_path, {}), dtype="bfloat16"))
    with pytest.raises(UnsupportedDtypeError, match="dtype='bfloat16' cannot run on device 'cpu'"):
        BaseLogprobBackend.from_checkpoint(ckpt, BackendConfig(dtype="bfloat16"), engine_class=Float32Only)
    assert loads == [] and asked == ["cpu"]  # refused before anything loaded, asked once
    llm = BaseLogprobBackend.from_checkpoint(ckpt, BackendConfig(dtype="float32"), engine_class=Float32Only)
    (services,) = loads
    assert services.placement == Placement("cpu", "float32") and asked == ["cpu", "cpu"]
    assert (llm.device, llm.dtype) == ("cpu", "float32")  # the placement's, not checked again
    llm.close()


def test_the_placement_names_a_device_this_machine_lacks() -> None:
    class Placed(BackendConfig):
        device: str | None = None

        def requested_device(self) -> str | None:
            return self.device

    none = Checkpoint("none")
    assert place(Placed(device="cpu"), none, ["cpu"]).device == "cpu"
    with pytest.raises(ConfigError, match="device='tpu': expected 'cuda', 'cuda:N', 'mps' or 'cpu'"):
        place(Placed(device="tpu"), none, ["cpu"])
    with pytest.raises(ConfigError, match="device='cuda:1' is not available to this backend here"):
        place(Placed(device="cuda:1"), none, ["cpu"])
    assert place(BackendConfig(), none, ["cuda", "cpu"]).device == "cuda"  # the best present

    class Half(BackendConfig):
        default_dtype = "float16"  # an engine's one default, declared with its options

    assert place(Half(), none).dtype == "float16" and place(Half(dtype="float32"), none).dtype == "float32"


class Guarded(TableEngine):
    """Refuses every attribute written after it loaded: the core writes nothing into it."""

    loaded = False

    def __setattr__(self, name: str, value: Any) -> None:
        if self.loaded:
            raise AssertionError(f"something wrote {name!r} into the engine")
        super().__setattr__(name, value)

    def forward(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        return self.table[torch.tensor([c[-1] for c in contexts])] * 3

    def sample(self, requests: list[SampleRequest]) -> list[list[int]]:
        assert all(r.width == V for r in requests)  # the row width comes with the call
        return [[1] * r.max_tokens for r in requests]


def test_the_core_writes_nothing_into_an_engine(tmp_path: Path) -> None:
    import dataclasses

    class Loads(Guarded):
        supports = frozenset({"sample"})

        @classmethod
        def load(cls, checkpoint: Checkpoint, config: Any, services: EngineServices) -> "Loads":
            with pytest.raises(dataclasses.FrozenInstanceError):
                services.name = "other"  # type: ignore[misc] - input only
            assert services.placement.device == "cpu" and not hasattr(services, "kv_reuse")
            engine = cls(checkpoint, config, services)
            object.__setattr__(engine, "loaded", True)
            return engine

    ckpt = read_checkpoint(BackendConfig(model=folder(tmp_path, {})))
    llm = BaseLogprobBackend.from_checkpoint(ckpt, BackendConfig(), engine_class=Loads)
    llm.batch_next_token_logprobs_sync([[1], [2, 3]])
    assert llm.sample_sync([1], max_tokens=2, seed=0) == [1, 1]
    llm.clear_cache()
    llm.close()
    by_hand = Guarded()  # built by hand: no services at all
    object.__setattr__(by_hand, "loaded", True)
    held = BaseLogprobBackend(by_hand, name="test")
    assert held.services.placement.device is None and held.next_token_logprobs_sync([1]).shape == (V,)
    held.close()


def test_an_engine_of_the_old_contract_loads_warning(tmp_path: Path) -> None:
    class Old(TableEngine):  # genlm-core 0.1: load(checkpoint, config), supported_dtypes(config)
        def __init__(self, checkpoint: Any, config: Any) -> None:
            super().__init__(checkpoint, config, max_context_length=3)

        @classmethod
        def supported_dtypes(cls, config: Any) -> tuple[str, tuple[str, ...]]:
            return "cpu", ("float32",)

    ckpt = read_checkpoint(BackendConfig(model=folder(tmp_path, {})))
    with pytest.warns(DeprecationWarning) as caught:
        llm = BaseLogprobBackend.from_checkpoint(ckpt, BackendConfig(), engine_class=Old)
    said = " ".join(str(w.message) for w in caught)
    assert "Old.supported_dtypes(config) is deprecated" in said and "Old.__init__(checkpoint, config)" in said
    assert "Old.max_context_length" in said and llm.max_context_length == 3
    with pytest.warns(DeprecationWarning), pytest.raises(UnsupportedDtypeError):
        BaseLogprobBackend.from_checkpoint(ckpt, BackendConfig(dtype="float16"), engine_class=Old)
    llm.close()


def test_the_engine_gets_distinct_validated_contexts_and_rows_are_normalised() -> None:
    engine = TableEngine()
    llm = backend(engine, cache_size=0)
    rows = llm.batch_next_token_logprobs_sync([[1, 2], [3], [1, 2]])
    assert engine.calls == [[(1, 2), (3,)]]
    assert torch.allclose(rows[0], torch.log_softmax(engine.table[2] * 3, -1), atol=0, rtol=0)
    assert torch.equal(rows[0], rows[2])


def test_an_engine_returning_logprobs_keeps_its_rows() -> None:
    class Final(TableEngine):
        returns = "logprobs"

        def forward(self, contexts: list[tuple[int, ...]]) -> list[torch.Tensor]:
            return [torch.full((V,), -1.0) for _ in contexts]  # not normalised: the core must not touch it

    row = backend(Final()).next_token_logprobs_sync([1])
    assert torch.equal(row, torch.full((V,), -1.0))


def test_a_declared_capability_needs_its_method() -> None:
    class Claims(TableEngine):
        supports = frozenset({"sample"})

    with pytest.raises(TypeError, match="declares 'sample' but does not define sample"):
        backend(Claims())
    with pytest.raises(TypeError, match="not a capability"):
        backend(type("Odd", (TableEngine,), {"supports": frozenset({"teleport"})})())
    with pytest.raises(TypeError, match="'kv'.*'resume'.*forward_rows"):  # the old capability names its fix
        backend(type("OldKV", (TableEngine,), {"supports": frozenset({"kv"})})())


# ---------------------------------------------------------------------- the sampling template
async def test_the_engine_sampler_gets_checked_clamped_requests() -> None:
    engine = SamplingEngine(max_positions=7)
    llm = backend(engine)
    out = await llm.sample([1, 2, 3, 4], max_tokens=10, seed=3, temperature=0.5)
    # room for the tokens drawn from contexts of 4, 5 and 6 tokens: 6 + 1 - 4
    assert out == [1, 1, 1]
    (req,) = engine.requests[-1]
    assert req == SampleRequest((1, 2, 3, 4), 3, frozenset({7}), 0.5, 3, width=V)
    assert await llm.sample([1] * 6, max_tokens=2) == [1] and await llm.sample([1], max_tokens=0) == []
    for bad in ({"max_tokens": -1}, {"max_tokens": 2, "temperature": -1.0}):
        with pytest.raises(ValueError):
            await llm.sample([1], **bad)
    with pytest.raises(ValueError):
        await llm.sample([V], max_tokens=1)
    many = await llm.batch_sample([[1], [2]], max_tokens=2, seed=5, eos_token_ids=[4])
    assert many == [[1, 1], [1, 1]] and sorted(r.seed for r in engine.requests[-1]) == [5, 6]
    assert llm.stats()["sample_batcher"]["batches"] >= 2
    assert llm.sample_sync([1], max_tokens=2) == [1, 1]


async def test_without_a_sampler_tokens_are_drawn_from_the_rows() -> None:
    engine = TableEngine(max_positions=4)
    llm = backend(engine)
    greedy = await llm.sample([0], max_tokens=10, temperature=0.0, eos_token_ids=[])
    ctx = [0]
    for tok in greedy:  # the oracle: the argmax of the backend's own rows
        assert tok == int(llm.next_token_logprobs_sync(ctx).argmax())
        ctx.append(tok)
    assert len(greedy) == 3  # clamped like every engine: contexts of 1, 2 and 3 tokens
    seeded = await llm.sample([0], max_tokens=3, seed=11, eos_token_ids=[])
    assert seeded == await llm.sample([0], max_tokens=3, seed=11, eos_token_ids=[])
    assert seeded == llm.sample_sync([0], max_tokens=3, seed=11, eos_token_ids=[])


def test_a_plugin_registers_its_engine_class_only(monkeypatch) -> None:
    import types

    from genlm_core import api, hookimpl
    from genlm_core.registry import Registry

    plugin = types.ModuleType("old_style_plugin")

    def register_backends(register: Any) -> None:
        register("old-style", "genlm_mock._deprecated:MockBackend", devices=["cpu"], model_formats=[])
        register("table", "genlm_core.bytes.testing:TableBackend", devices=["cpu"], model_formats=[])

    plugin.genlm_register_backends = hookimpl(register_backends)
    reg = Registry()
    reg._add_plugin(plugin, "old", "old-dist", "1")
    monkeypatch.setattr(api, "get_registry", lambda: reg)
    with pytest.raises(ConfigError, match="is not a genlm_core.engine.Engine.*genlm_mock.engine:MockEngine"):
        genlm_core.load("old-style")
    with pytest.raises(ConfigError, match="registers its Engine class; the core builds the backend"):
        genlm_core.load("table")
