"""The long-prompt benchmark's prompts and shapes (standard library only).

Prompts (``PROMPTS``): the first characters of ``prompts/GPL-3.txt`` (the GNU GPL v3,
shipped verbatim and whole; ``prompts/README.md`` gives its source and licence), cut
where SmolLM2-135M-Instruct's tokenizer ends a token - ``"907"`` (907 tokens, the
issue's headline shape) and ``"4096"`` - and ``"3"``, genlm-backend's README prompt
"Montreal is", the comparison point.

A shape (:class:`Shape`) is a prompt, a particle count, a token count and a program
(``sis``: the README's SIS, ``sis_workload.sis``; ``smc``: SMC with resampling,
``smc_workload.smc``), written ``PROMPTxPARTICLESxTOKENS:PROGRAM`` (``907x32x30:sis``).

Many programs, one engine (the shape of an evaluation over a dataset): ``manyKx`` before
a shape runs K programs, each with its own prompt (``MANY_PROMPTS``: K cuts of
``GPL-3.txt`` of the prompt's token count, each starting at another paragraph), against
one engine in one process; ``serveKx`` runs the same through ``genlm serve``
(``many8x907x16x30:sis``, ``serve8x907x16x30:sis``). Program ``i`` is its cut ``i``
with seed ``seed + i``; ``many_programs.py`` runs them one after another and together.
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
    """A prompt: characters ``start`` to ``chars`` of ``file`` (in ``prompts/``), or
    ``literal``; ``smollm2_tokens``: its length in SmolLM2-135M-Instruct tokens."""

    name: str
    smollm2_tokens: int
    file: str | None = None
    chars: int | None = None
    literal: str | None = None
    start: int = 0

    def text(self) -> str:
        if self.literal is not None:
            return self.literal
        assert self.file is not None and self.chars is not None
        return (PROMPT_DIR / self.file).read_text(encoding="utf-8")[self.start : self.chars]


PROMPTS: dict[str, Prompt] = {
    p.name: p
    for p in (
        Prompt("3", 3, literal="Montreal is"),
        Prompt("907", 907, file="GPL-3.txt", chars=4132),
        Prompt("4096", 4096, file="GPL-3.txt", chars=19345),
    )
}

#: the many-programs shapes' prompts: program i's is cut i, 907 SmolLM2 tokens from the
#: start of a paragraph of GPL-3.txt (about evenly spaced; cut 0 is PROMPTS["907"]); (start, end)
#: in characters, each end where the tokenizer ends a token of the text from that start
_MANY_907 = (
    (0, 4132),
    (4416, 8679),
    (8879, 13117),
    (13540, 17952),
    (17490, 21907),
    (22095, 26285),
    (26697, 30889),
    (30808, 34381),
)
#: and the comparison point, as "3" is for one program: "<city> is", 3 SmolLM2 tokens each
_MANY_3 = ("Montreal", "Toronto", "Berlin", "Madrid", "Tokyo", "Vienna", "Oslo", "Quebec")
MANY_PROMPTS: dict[str, tuple[Prompt, ...]] = {
    "3": tuple(Prompt(f"3.{i}", 3, literal=f"{city} is") for i, city in enumerate(_MANY_3)),
    "907": tuple(
        Prompt(f"907.{i}", 907, file="GPL-3.txt", chars=end, start=start)
        for i, (start, end) in enumerate(_MANY_907)
    ),
}

PROGRAMS = ("sis", "smc")


def encode(prompt: Prompt, tokenizer: Any, expect_smollm2: bool = True) -> list[int]:
    """``prompt`` encoded by ``tokenizer`` (no special tokens). ``expect_smollm2``: the
    tokenizer is SmolLM2's, so the count must be the catalogue's (a cut that moved)."""
    ids = [int(i) for i in tokenizer.encode(prompt.text(), add_special_tokens=False)]
    if expect_smollm2 and len(ids) != prompt.smollm2_tokens:
        raise ValueError(
            f"prompt {prompt.name!r} encodes to {len(ids)} tokens, not {prompt.smollm2_tokens}: the cut "
            f"in long_prompts is for SmolLM2-135M-Instruct's tokenizer (pass another model's "
            "folder only with its own token counts in mind) or prompts/GPL-3.txt was changed"
        )
    return ids


def prompt_ids(name: str, tokenizer: Any, expect_smollm2: bool = True) -> list[int]:
    """Prompt ``name`` of :data:`PROMPTS` encoded (:func:`encode`)."""
    return encode(PROMPTS[name], tokenizer, expect_smollm2)


def many_prompt_ids(name: str, programs: int, tokenizer: Any, expect_smollm2: bool = True) -> list[list[int]]:
    """The first ``programs`` prompts of ``MANY_PROMPTS[name]`` encoded (:func:`encode`)."""
    cuts = MANY_PROMPTS[name]
    if programs > len(cuts):
        raise ValueError(f"{programs} programs of prompt {name!r}: it has {len(cuts)} cuts (MANY_PROMPTS)")
    return [encode(p, tokenizer, expect_smollm2) for p in cuts[:programs]]


#: how a many-programs shape reaches its engine: the engine in the worker's process, or
#: ``genlm serve`` (a server process the worker starts; the programs are its clients)
VIAS = ("many", "serve")


@dataclass(frozen=True)
class Shape:
    """One workload: ``particles`` particles extend prompt ``prompt`` by up to ``tokens``
    tokens with ``program``. ``programs`` (many programs, one engine): that many such
    programs, each with its own cut of the prompt (:data:`MANY_PROMPTS`), reaching the
    engine ``via`` its process or ``genlm serve``; 0 for one program of ``prompt``."""

    prompt: str
    particles: int
    tokens: int
    program: str
    programs: int = 0
    via: str = "many"

    @property
    def name(self) -> str:
        many = f"{self.via}{self.programs}x" if self.programs else ""
        return f"{many}{self.prompt}x{self.particles}x{self.tokens}:{self.program}"

    @property
    def serve(self) -> bool:
        return bool(self.programs) and self.via == "serve"

    def sort_key(self) -> tuple[int, ...]:
        """Cheapest first: tokens, particles, prompt length, then SIS before SMC; the
        many-programs shapes after the others (fewest programs first, in process first)."""
        return (
            self.programs,
            VIAS.index(self.via),
            self.tokens,
            self.particles,
            PROMPTS[self.prompt].smollm2_tokens,
            PROGRAMS.index(self.program),
        )


_SHAPE = re.compile(r"^(?:(many|serve)(\d+)x)?(\d+)x(\d+)x(\d+)(?::(\w+))?$")


def parse_shapes(texts: Iterable[str]) -> list[Shape]:
    """``[manyK|serveK x]PROMPTxPARTICLESxTOKENS[:PROGRAM]`` each (no program: both), in
    the order given."""
    out: list[Shape] = []
    for text in texts:
        m = _SHAPE.match(text.strip())
        if not m:
            raise ValueError(
                f"shape {text!r}: write PROMPTxPARTICLESxTOKENS[:PROGRAM], e.g. 907x32x30:sis, or "
                f"manyKx... / serveKx... for K programs with their own prompts, e.g. many8x907x16x30:sis "
                f"(prompts {', '.join(PROMPTS)}; programs {', '.join(PROGRAMS)})"
            )
        via, k = m.group(1) or "many", int(m.group(2) or 0)
        prompt, particles, tokens, program = m.group(3), int(m.group(4)), int(m.group(5)), m.group(6)
        if prompt not in PROMPTS:
            raise ValueError(f"shape {text!r}: no prompt {prompt!r}; the prompts are {', '.join(PROMPTS)}")
        if m.group(1) and prompt not in MANY_PROMPTS:
            raise ValueError(
                f"shape {text!r}: many programs need one cut of the prompt each; prompts with cuts: "
                f"{', '.join(MANY_PROMPTS)}"
            )
        if m.group(1) and not 1 <= k <= len(MANY_PROMPTS[prompt]):
            raise ValueError(
                f"shape {text!r}: {k} programs; prompt {prompt!r} has cuts for 1 to {len(MANY_PROMPTS[prompt])}"
            )
        if program is not None and program not in PROGRAMS:
            raise ValueError(
                f"shape {text!r}: no program {program!r}; the programs are {', '.join(PROGRAMS)}"
            )
        if particles < 1 or tokens < 1:
            raise ValueError(f"shape {text!r}: particles and tokens must be at least 1")
        for prog in [program] if program else PROGRAMS:
            out.append(Shape(prompt, particles, tokens, prog, k, via))
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
#: many programs, one engine: 8 programs, each its own 907-token prompt, 16 particles x 30
#: tokens (SIS), in the engine's process and through genlm serve
MANY = [Shape("907", 16, 30, "sis", 8, "many"), Shape("907", 16, 30, "sis", 8, "serve")]
#: --smoke (CI) and --quick: the long prompt shared by 32 particles for a few tokens (SIS),
#: and for 8 tokens (SMC: resampling within 8 steps); 3 programs with their own prompts x 4
#: particles x 3 tokens - counters only
SMOKE = [Shape("907", 32, 3, "sis"), Shape("907", 32, 8, "smc"), Shape("907", 4, 3, "sis", 3, "many")]
#: the smoke's run through genlm serve (on the engines of SMOKE_SERVE_ENGINES in bench_long_prompt)
SMOKE_SERVE = Shape("907", 4, 3, "sis", 3, "serve")
