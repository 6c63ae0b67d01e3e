"""Writing GGUF files of Hugging Face models with llama.cpp's own converter, offline.

The converter (``convert_hf_to_gguf.py``, its ``conversion`` package and the matching
``gguf-py``) ships inside the llama-cpp-python source distribution that
``scripts/setup_env.sh`` keeps in ``<venv>/wheels``; it is unpacked once under the
genlm-core cache and run in a subprocess with that ``gguf-py`` first on the path (the
``gguf`` package installed in the venv may be another version).

``tiny_gguf_path(arch)`` is the f32 GGUF of a tiny test model
(:func:`genlm_core.models.tiny_model_path`: ``"llama"`` and ``"gpt2"`` with a
byte-level BPE tokenizer, ``"llama-spm"`` with a sentencepiece one), built on first
use; the tests compare each with genlm-hf on the same weights.
``smollm2_f16_gguf_path()`` is SmolLM2-135M-Instruct in f16, written from the float32
folder dequantised from the embedded Q4_1 GGUF (the benchmark's unquantised GGUF).

``python -m genlm_llamacpp.convert`` builds the test GGUFs (``scripts/test.sh`` runs it);
``--smollm2-f16`` builds the benchmark's too.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from genlm_core import models

__all__ = [
    "TEST_GGUFS",
    "convert_hf_to_gguf",
    "converter_dir",
    "find_sdist",
    "smollm2_f16_gguf_path",
    "tiny_gguf_path",
]

SDIST_GLOB = "llama_cpp_python-*.tar.gz"

#: the tiny models the tests read as GGUF files (all f32)
TEST_GGUFS = ("llama", "gpt2", "llama-spm")

# The converter names a BPE pre-tokenizer by hashing the encoding of a probe text; a
# tokenizer it does not know (the tiny test model's, trained here) needs the name given.
# The tiny tokenizers use the plain GPT-2 ByteLevel regex: llama.cpp's "gpt-2".
_RUN = """
import runpy, sys
root, pre = sys.argv[1], sys.argv[2]
sys.path[:0] = [root, root + "/gguf-py"]
if pre:
    from conversion import base
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
sys.argv = [root + "/convert_hf_to_gguf.py", *sys.argv[3:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def find_sdist() -> Path:
    """The llama-cpp-python source archive: ``$GENLM_LLAMACPP_SDIST`` or ``<venv>/wheels``."""
    env = os.environ.get("GENLM_LLAMACPP_SDIST")
    candidates = [env] if env else sorted(glob.glob(os.path.join(sys.prefix, "wheels", SDIST_GLOB)))
    for c in reversed(candidates):
        if c and os.path.isfile(c):
            return Path(c)
    raise FileNotFoundError(
        f"no llama-cpp-python source archive ({SDIST_GLOB}) in {os.path.join(sys.prefix, 'wheels')}; "
        "run scripts/setup_env.sh (it keeps the archive there) or set GENLM_LLAMACPP_SDIST"
    )


def converter_dir() -> Path:
    """llama.cpp's converter unpacked from the source archive (once, under the cache)."""
    sdist = find_sdist()
    out = models.cache_dir() / "llama.cpp-convert" / sdist.name.removesuffix(".tar.gz")
    if (out / "convert_hf_to_gguf.py").is_file():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split("/")[0]
        prefix = f"{top}/vendor/llama.cpp/"
        keep = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")
        members = []
        for m in tar.getmembers():
            if m.name.startswith(prefix) and m.name[len(prefix) :].startswith(keep):
                m.name = m.name[len(prefix) :]
                members.append(m)
        tar.extractall(tmp, members=members, filter="data")
    if out.exists():  # another process unpacked it meanwhile
        shutil.rmtree(tmp)
    else:
        tmp.replace(out)
    return out


def convert_hf_to_gguf(
    folder: Path, out: Path, outtype: str = "f32", pre_tokenizer: str | None = None
) -> Path:
    """Write ``out`` from the Hugging Face model ``folder`` with llama.cpp's converter."""
    root = converter_dir()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    cmd = [sys.executable, "-c", _RUN, str(root), pre_tokenizer or "", str(folder)]
    cmd += ["--outtype", outtype, "--outfile", str(tmp)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not tmp.is_file():
        raise RuntimeError(f"convert_hf_to_gguf failed for {folder}:\n{proc.stderr[-4000:]}")
    tmp.replace(out)
    return out


def _fresh(out: Path, source: Path) -> bool:
    return out.is_file() and out.stat().st_mtime >= source.stat().st_mtime


def tiny_gguf_path(arch: str = "llama", outtype: str = "f32") -> Path:
    """The GGUF of the tiny test model ``arch`` (built on first use, then cached)."""
    folder = models.tiny_model_path(arch, progress=False)
    out = models.models_dir() / f"tiny-{arch}-{outtype}.gguf"
    if _fresh(out, folder / "model.safetensors"):
        return out
    # byte-level BPE: name the pre-tokenizer; sentencepiece (tokenizer.model) needs none
    pre = None if (folder / "tokenizer.model").is_file() else "gpt-2"
    return convert_hf_to_gguf(folder, out, outtype, pre_tokenizer=pre)


def smollm2_f16_gguf_path(progress: bool = False) -> Path:
    """SmolLM2-135M-Instruct as an f16 GGUF (cached), from the float32 folder that
    :func:`genlm_core.models.smollm2_path` dequantises from the Q4_1 GGUF.

    The folder's tokenizer is the GGUF's own (``smollm`` pre-tokenizer, restored by
    the folder builder); llama.cpp's converter recognises it by its probe hash.
    """
    folder = models.smollm2_path(progress=progress)
    out = models.models_dir() / f"{models.SMOLLM2_NAME}.f16.gguf"
    if _fresh(out, folder / "model.safetensors"):
        return out
    if progress:
        print(f"[genlm-llamacpp] writing {out}", file=sys.stderr, flush=True)
    return convert_hf_to_gguf(folder, out, "f16")


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="Write the GGUF files of the test models (offline).")
    parser.add_argument(
        "--smollm2-f16", action="store_true", help="also SmolLM2-135M-Instruct in f16 (the benchmark's)"
    )
    args = parser.parse_args(argv)
    for arch in TEST_GGUFS:
        print(tiny_gguf_path(arch))
    if args.smollm2_f16:
        print(smollm2_f16_gguf_path(progress=True))
    return 0


if __name__ == "__main__":  # python -m genlm_llamacpp.convert: build the test GGUFs
    raise SystemExit(main())
