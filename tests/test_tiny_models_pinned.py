"""The tiny test models are the same on every host: built from the text shipped in
genlm-core (``genlm_core/models/data/tiny_corpus.txt``) with fixed seeds, so the digest of
each built folder (weights, config, tokenizer files) is pinned here. A change of the
corpus, the builder or a library that changes what is written fails this test; bump
the builder's version in ``genlm_core.models`` and the digests together."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from genlm_core import models

PINNED = {
    "llama": "1cc60222758a521ceadb61d954eaf197763f4fd59be5f112200bf91dbcc75108",
    "gpt2": "1a1b861b29a9a63435ea239d47e250f76ce8a4ddb923af5840df481bc5d5e61a",
    "llama-spm": "5ebcbad91696b317acf965451cffa691f10cfe1a16fa3d32a00377c011517519",
}
CORPUS_SHA256 = "b5e0c10d3e5f441540394aae75c234e8fa13ace1daeae54812cc7a45d8299b57"


def folder_digest(folder: Path) -> str:
    """sha256 over every file's relative name and sha256 (the build marker excluded)."""
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != models.MARKER):
        h.update(
            f"{path.relative_to(folder).as_posix()}\\0{hashlib.sha256(path.read_bytes()).hexdigest()}\\n".encode()
        )
    return h.hexdigest()


def test_corpus_ships_with_the_package() -> None:
    assert models.TINY_CORPUS.is_file()
    assert hashlib.sha256(models.TINY_CORPUS.read_bytes()).hexdigest() == CORPUS_SHA256


@pytest.mark.parametrize("arch", sorted(PINNED))
def test_built_models_are_pinned(arch: str) -> None:
    assert folder_digest(models.tiny_model_path(arch, progress=False)) == PINNED[arch]
