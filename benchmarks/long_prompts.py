"""The long-prompt benchmark's prompts and shapes (standard library only).

Prompts (``PROMPTS``): the first characters of ``prompts/GPL-3.txt`` (the GNU GPL v3,
shipped verbatim and whole; ``prompts/README.md`` gives its source and licence), cut
where SmolLM2-135M-Instruct's tokenizer ends a token - ``"907"`` (907 tokens, the
issue's headline shape) and ``"4096"`` - and ``"3"``, genlm-backend's README prompt
"Montreal is", the comparison point.

A shape (:class:`Shape`) is a prompt, a particle count, a token count and a program
(``sis``: the README's SIS, ``sis_workload.sis``; ``smc``: SMC with resampling,
``smc_workload.smc``), written ``PROMPTxPARTICLESxTOKENS:PROGRAM`` (``907x32x30:sis``).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROMPT_DIR = Path(__file__).resolve().parent / "prompts"


@dataclass(frozen=True)
class Prompt:
    """A prompt: ``chars`` characters of ``file`` (in ``prompts/``), or ``literal``;
    ``smollm2_tokens``: its length in SmolLM2-135M-Instruct tokens."""

    name: str
    smollm2_tokens: int
    file: str | None = None
    chars: int | None = None
    literal: str | None = None

    def text(self) -> str:
        if self.literal is not None:
            return self.literal
        assert self.file is not None and self.chars is not None
        return (PROMPT_DIR / self.file).read_text(encoding="utf-8")[: self.chars]


PROMPTS: dict[str, Prompt] = {
    p.name: p
    for p in (
        Prompt("3", 3, literal="Montreal is"),
        Prompt("907", 907, file="GPL-3.txt", chars=4132),
        Prompt("4096", 4096, file="GPL-3.txt", chars=19345),
    )
}

PROGRAMS = ("sis", "smc")


def prompt_ids(name: str, tokenizer: Any, expect_smollm2: bool = True) -> list[int]:
    """Prompt ``name`` encoded by ``tokenizer`` (no special tokens). ``expect_smollm2``:
    the tokenizer is SmolLM2's, so the count must be the catalogue's (a cut that moved)."""
    prompt = PROMPTS[name]
    ids = [int(i) for i in tokenizer.encode(prompt.text(), add_special_tokens=False)]
    if expect_smollm2 and len(ids) != prompt.smollm2_tokens:
        raise ValueError(
            f"prompt {name!r} encodes to {len(ids)} tokens, not {prompt.smollm2_tokens}: the cut in "
            f"long_prompts.PROMPTS is for SmolLM2-135M-Instruct's tokenizer (pass another model's "
            "folder only with its own token counts in mind) or prompts/GPL-3.txt was changed"
        )
    return ids


@dataclass(frozen=True)
class Shape:
    """One workload: ``particles`` particles extend prompt ``prompt`` by up to ``tokens``
    tokens with ``program``."""

    prompt: str
    particles: int
    tokens: int
    program: str

    @property
    def name(self) -> str:
        return f"{self.prompt}x{self.particles}x{self.tokens}:{self.program}"

    def sort_key(self) -> tuple[int, int, int, int]:
        """Cheapest first: tokens, particles, prompt length, then SIS before SMC."""
        return (
            self.tokens,
            self.particles,
            PROMPTS[self.prompt].smollm2_tokens,
            PROGRAMS.index(self.program),
        )


_SHAPE = re.compile(r"^(\d+)x(\d+)x(\d+)(?::(\w+))?$")


def parse_shapes(texts: Iterable[str]) -> list[Shape]:
    """``PROMPTxPARTICLESxTOKENS[:PROGRAM]`` each (no program: both), in the order given."""
    out: list[Shape] = []
    for text in texts:
        m = _SHAPE.match(text.strip())
        if not m:
            raise ValueError(
                f"shape {text!r}: write PROMPTxPARTICLESxTOKENS[:PROGRAM], e.g. 907x32x30:sis "
                f"(prompts {', '.join(PROMPTS)}; programs {', '.join(PROGRAMS)})"
            )
        prompt, particles, tokens, program = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
        if prompt not in PROMPTS:
            raise ValueError(f"shape {text!r}: no prompt {prompt!r}; the prompts are {', '.join(PROMPTS)}")
        if program is not None and program not in PROGRAMS:
            raise ValueError(
                f"shape {text!r}: no program {program!r}; the programs are {', '.join(PROGRAMS)}"
            )
        if particles < 1 or tokens < 1:
            raise ValueError(f"shape {text!r}: particles and tokens must be at least 1")
        for prog in [program] if program else PROGRAMS:
            out.append(Shape(prompt, particles, tokens, prog))
    return list(dict.fromkeys(out))


def grid(
    prompts: Sequence[str], particles: Sequence[int], tokens: Sequence[int], programs: Sequence[str]
) -> list[Shape]:
    """Every combination, cheapest first (:meth:`Shape.sort_key`)."""
    shapes = [Shape(*c) for c in itertools.product(prompts, particles, tokens, programs)]
    return sorted(dict.fromkeys(shapes), key=Shape.sort_key)


#: the issue's grid: every prompt, 32/64/256 particles, 30/200 tokens, SIS and SMC
FULL = grid(list(PROMPTS), (32, 64, 256), (30, 200), PROGRAMS)
#: the issue's targets are read at these shapes (SIS, the program of the issue's table)
HEADLINE = Shape("907", 32, 30, "sis")
#: "within 2x of the 3-token prompt's figure": these shapes against the same shape at prompt "3"
WITHIN_2X = (Shape("907", 64, 200, "sis"), Shape("4096", 32, 30, "sis"), Shape("4096", 64, 200, "sis"))
#: --smoke (CI) and --quick: the long prompt shared by 32 particles for a few tokens (SIS),
#: and for 8 tokens (SMC: resampling within 8 steps) - counters only
SMOKE = [Shape("907", 32, 3, "sis"), Shape("907", 32, 8, "smc")]
