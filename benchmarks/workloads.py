"""The benchmark suite's workloads, each declared once.

``run_all.py`` takes its sections from :data:`WORKLOADS` (their order, which is the
summary table's, their commands, ``--only`` and ``--help``, the backend each needs, the
JSON each writes, its verdict's arguments), and ``scripts/gpu_check.py`` takes the runs
of its GPU check from each workload's :attr:`Workload.gpu` (their arguments on a GPU and
in a dry run on the CPU, the time each may take, and their place in the check's plan).
Adding a workload is one :class:`Workload` entry here, beside its ``bench_*.py`` (see
benchmarks/README.md). Standard library only: run_all imports it to list its sections.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: the GPU check's model tags (scripts/gpu_check.py's GPU_MODELS; scripts/gpu_targets.py)
LARGE, SMALL = "smollm2-1.7b-bf16", "smollm2-135m-f32"


@dataclass(frozen=True)
class Slot:
    """A GPU run's place in the check's plan: runs go in ``order`` (ascending); an
    ``optional`` run is left out, not failed, when the budget is spent."""

    order: int
    model: str
    optional: bool = False


@dataclass(frozen=True)
class GpuRun:
    """A run of its workload's script in the GPU check (``--skip NAME`` leaves it out)."""

    name: str
    gpu: tuple[str, ...]  # the arguments on a GPU (short repetitions)
    dry: tuple[str, ...]  # the arguments in a dry run on the CPU (tiny model, smallest settings)
    cap_s: int  # the most seconds it may take (and never past the budget)
    plan: tuple[Slot, ...]


@dataclass(frozen=True)
class Workload:
    name: str  # run_all's section (``--only NAME``)
    script: str  # the benchmark script in benchmarks/
    measures: str  # one line for ``run_all.py --help`` and benchmarks/README.md
    args: tuple[str, ...] = ()  # the section's arguments, always
    full: tuple[str, ...] = ()  # then these in a full run
    quick: tuple[str, ...] = ()  # or these with ``--quick`` / ``--smoke``
    files: tuple[str, ...] = ()  # the JSON it writes into benchmarks/out (the verdict reads the first)
    needs: str | None = None  # the backend plugin it needs (skipped without it, unless --smoke)
    verdict_args: dict[str, Any] = field(default_factory=dict)  # keywords of headline() and smoke()
    gpu: tuple[GpuRun, ...] = ()  # its runs in the GPU check (none: the check leaves it out)

    def argv(self, quick: bool) -> list[str]:
        """The section's command: the script and its arguments."""
        return [self.script, *self.args, *(self.quick if quick else self.full)]

    @property
    def stem(self) -> str:
        """The GPU check's name of the script (``bench_<stem>.py``)."""
        return self.script.removeprefix("bench_").removesuffix(".py")


SIS_PARTICLES = "16"
QUICK = ("--quick",)

#: bench_hf_step's settings in the GPU check: contexts growing a token a call, as SIS's (the
#: decode step's path), with both accounts of a step (on a GPU, in a dry run on the CPU:
#: there with the decode step on, the path the GPU's "auto" takes)
HF_STEP = (
    tuple("--grow --rows 16 64 --repeat 5 --warmup 2 --graph-account --host-account".split()),
    tuple(
        "--grow --rows 2 4 --repeat 1 --warmup 1 --past 4 --graph-account --host-account --static-decode on".split()
    ),
)


def _hf_step_ab(name: str, *gpu: str, dry: tuple[str, ...] | None = None, plan: tuple[Slot, ...]) -> GpuRun:
    """An A/B run of the hf step: :data:`HF_STEP` with the options ``gpu`` (in a dry run
    ``dry``, by default the same)."""
    return GpuRun(name, (*HF_STEP[0], *gpu), (*HF_STEP[1], *(gpu if dry is None else dry)), 90, plan)


def _sis_ab(name: str, gpu: str, dry: str, plan: tuple[Slot, ...]) -> GpuRun:
    """An A/B run of genlm-hf's SIS alone (no reference, no uncached loop) with the load()
    options ``gpu`` (in a dry run ``dry``: the other side of the question on the CPU)."""
    alone = ("--no-anchor", "--no-uncached", "--options")
    return GpuRun(
        name,
        ("--particles", "64", "--repeats", "2", *alone, gpu),
        ("--particles", "6", "--max-tokens", "3", *alone, dry),
        60,
        plan,
    )


# The GPU check's plan (the Slot orders below): the runs that give the speed targets'
# figures first (scripts/gpu_targets.py: the hf step on both models, burst and SIS on the
# 1.7B, serve on the 135M), then the rest while the budget
# lasts (optional: a run the budget leaves out is listed, not failed). The optional runs
# no check has made come first: the H200 check of d0aafca (benchmarks/results/gpu/
# nvidia-h200/d0aafca/) answered the step's A/B runs and the byte beam, and made the event
# loop genlm-hf's default, so its other side (the worker thread) comes first now.
WORKLOADS: tuple[Workload, ...] = (
    Workload(
        "batcher",
        "bench_batcher.py",
        "AutoBatcher overhead per request and the timer policy under SMC load",
        quick=QUICK,
        files=("batcher_overhead", "batcher_policy", "batcher_sequential"),
    ),
    Workload(
        "gather",
        "bench_gather.py",
        "genlm serve's gatherer in front of an engine timed like the H100's and this CPU's "
        "passes: holding for every missing client vs only those due in time",
        quick=QUICK,
        files=("gather",),
    ),
    Workload(
        "vocab",
        "bench_vocab.py",
        "byte-vocabulary decoding of real tokenizers (Qwen 151k, GPT-2, ...)",
        quick=QUICK,
        files=("vocab",),
    ),
    Workload(
        "trie",
        "bench_trie.py",
        "trie mass sums, Qwen 151k and GPT-2, vs genlm-backend / genlm-bytes",
        quick=("--no-anchors", "--repeat", "10"),
        files=("trie",),
    ),
    Workload(
        "sis",
        "bench_sis.py",
        "autobatched SIS on genlm-hf vs genlm-backend and an uncached loop, plus throughput "
        "against particle count",
        args=("--backend", "hf", "--particles", SIS_PARTICLES, "--sweep"),
        full=("1", "4", "32"),
        quick=("1", "4", "--no-anchor", "--no-uncached", "--max-tokens", "8"),
        files=("sis",),
        needs="hf",
        verdict_args={"backend": "hf"},
        gpu=(
            GpuRun(  # two runs a figure (their median): the reference's speed moved 31% between two checks
                "sis",
                ("--particles", "16", "--sweep", "64", "--repeats", "2"),
                ("--particles", "4", "--max-tokens", "3", "--uncached-particles", "2", "--sweep", "6"),
                90,
                (Slot(50, LARGE), Slot(100, SMALL, optional=True)),
            ),
            # genlm-hf's SIS at 64 particles in one pass a step (batch_size 64) against sis's
            # run of the default batch_size (32: two passes a step): whether a larger default
            # pays on a GPU
            _sis_ab(
                "sis_batch64", '{"batch_size": 64}', '{"batch_size": 8}', (Slot(160, LARGE, optional=True),)
            ),
            # the batches on the event loop's thread (a GPU engine runs them in the batcher's
            # worker, beside the program's sampling): what the thread gives SIS on a GPU
            _sis_ab(
                "sis_thread",
                '{"forward_thread": true}',
                '{"forward_thread": false}',
                (Slot(80, LARGE, optional=True),),
            ),
        ),
    ),
    Workload(
        "sis-mlx",
        "bench_sis.py",
        "the same workload on genlm-mlx (throughput against particles)",
        args=("--backend", "mlx", "--particles", SIS_PARTICLES, "--no-anchor", "--no-uncached", "--sweep"),
        full=("1", "4", "32"),
        quick=("1", "--max-tokens", "8"),
        files=("sis",),
        needs="mlx",
        verdict_args={"backend": "mlx"},
    ),
    Workload(
        "sis-vllm",
        "bench_sis.py",
        "the same workload on genlm-vllm (throughput against particles)",
        args=("--backend", "vllm", "--particles", SIS_PARTICLES, "--no-anchor", "--no-uncached", "--sweep"),
        full=("1", "4", "32"),
        quick=("1", "--max-tokens", "8"),
        files=("sis",),
        needs="vllm",
        verdict_args={"backend": "vllm"},
    ),
    Workload(
        "vllm",
        "bench_vllm.py",
        "genlm-vllm's logprob capture vs raw ``generate`` and the logprobs dict",
        quick=("--batches", "1", "8", "--lengths", "8", "--repeat", "3", "--dict-repeat", "1"),
        files=("vllm",),
        needs="vllm",
    ),
    Workload(
        "bytes",
        "bench_bytes.py",
        "byte-level beam (K=5, K=1) vs genlm-bytes over genlm-backend",
        quick=("--no-anchor", "--k", "1"),
        files=("bytes",),
        needs="hf",
        gpu=(
            # the byte beam (genlm-hf's default on CUDA: the decode step), K=5 and K=1: its
            # calls mix one-token extensions (decode steps) with new tokenisations' contexts
            # (eager passes; the engine counters in its JSON say how many of each)
            GpuRun(
                "bytes",
                ("--no-anchor", "--k", "5", "1"),
                ("--no-anchor", "--k", "2"),
                60,
                (Slot(130, SMALL, optional=True),),
            ),
            # the same beam on eager passes alone: what the decode step gives the beam on a GPU
            GpuRun(
                "bytes_eager",
                ("--no-anchor", "--k", "5", "1", "--options", '{"static_decode": "off"}'),
                ("--no-anchor", "--k", "2", "--options", '{"static_decode": "on"}'),
                60,
                (Slot(140, SMALL, optional=True),),
            ),
        ),
    ),
    Workload(
        "llamacpp",
        "bench_llamacpp.py",
        "genlm-llamacpp (SmolLM2 Q4_1 and f16 GGUFs) vs genlm-hf float32 on SIS and the byte "
        "beam K=5, and our layer vs raw llama.cpp replaying the same batches",
        quick=("--quick", "--no-raw"),
        files=("llamacpp",),
        needs="llamacpp",
    ),
    Workload(
        "serve",
        "bench_serve.py",
        "four SIS client processes: a backend each vs one `genlm serve hf` (shared memory, "
        "network frame): calls/s, per-call latency, total RSS, where a step goes",
        quick=QUICK,
        files=("serve",),
        needs="hf",
        gpu=(
            GpuRun(  # three SIS runs a client: one run was 21 steps, a few passes of noise in its figures
                "serve",
                ("--clients", "4", "--particles", "16", "--max-tokens", "20", "--runs", "3", "--repeat", "5"),
                ("--clients", "2", "--particles", "4", "--max-tokens", "3", "--runs", "1", "--repeat", "2"),
                150,
                (Slot(60, SMALL), Slot(90, LARGE, optional=True)),
            ),
        ),
    ),
    Workload(
        "hf-step",
        "bench_hf_step.py",
        "the hf backend's SIS-like step vs the raw transformers forward, 16 and 64 rows",
        quick=QUICK,
        files=("hf_step",),
        needs="hf",
    ),
    Workload(
        "hf-step-grow",
        "bench_hf_step.py",
        "the same with every row's context growing a token a call, as SIS's "
        "(``bench_hf_step.py --grow``: the path of genlm-hf's decode step)",
        args=("--grow",),
        quick=QUICK,
        files=("hf_step_grow",),
        needs="hf",
        gpu=(
            GpuRun("hf_step", *HF_STEP, 90, (Slot(10, LARGE), Slot(30, SMALL))),
            # 64 particles of one 2,048-token prompt (genlm-hf holds and reads it once; raw
            # transformers holds it in every row): the step against hf_step's 28-token one, <= 2x
            GpuRun(
                "hf_step_prompt",
                tuple("--grow --rows 64 --repeat 5 --warmup 2 --shared-prompt 2048".split()),
                tuple(
                    "--grow --rows 4 --repeat 1 --warmup 1 --past 4 --shared-prompt 64 --static-decode on".split()
                ),
                150,
                (Slot(20, LARGE),),
            ),
            # the same with the model's own forward in the static step: the fused step's before/after
            _hf_step_ab("hf_step_unfused", "--fused-decode", "off", plan=(Slot(150, SMALL, optional=True),)),
            # the batches in the batcher's worker thread, not on the event loop (genlm-hf's
            # default since the H200 check of d0aafca): the hand-over and hand-back against a
            # loop kept free during a pass
            _hf_step_ab(
                "hf_step_thread",
                "--forward-thread",
                "on",
                dry=("--forward-thread", "off"),
                plan=(Slot(70, SMALL, optional=True),),
            ),
            # the step without the output cache: on a GPU the step copies each row for the
            # cache (a second batched copy) and, while the cache fills, takes new device memory
            _hf_step_ab(
                "hf_step_nocache", "--options", '{"cache_size": 0}', plan=(Slot(110, SMALL, optional=True),)
            ),
            # the same with the output cache in host memory (genlm serve's setting): one
            # transfer of the step's rows to the host instead of a device copy of each
            _hf_step_ab(
                "hf_step_cachecpu",
                "--options",
                '{"cache_to_cpu": true}',
                plan=(Slot(120, SMALL, optional=True),),
            ),
        ),
    ),
    Workload(
        "burst",
        "bench_burst.py",
        "the SIS program as per-step calls vs one burst (hf f32, llama.cpp f16)",
        quick=QUICK,
        files=("burst",),
        needs="hf",
        gpu=(
            GpuRun(
                "burst",
                ("--engines", "hf", "--particles", "16", "64", "--repeats", "1"),
                ("--engines", "hf", "--particles", "4", "--max-tokens", "3", "--repeats", "1"),
                90,
                (Slot(40, LARGE), Slot(170, SMALL, optional=True)),
            ),
        ),
    ),
    Workload(
        "long-prompt",
        "bench_long_prompt.py",
        "a 907- and a 4,096-token prompt shared by 32-256 particles (SIS, SMC with resampling) "
        "on hf, llama.cpp, vLLM, MLX and genlm-backend (time-capped): calls/s, tokens computed "
        "against the minimum, peak RSS, time outside the engine; many programs, one engine (8 "
        "programs with their own 907-token prompts x 16 particles x 30 tokens, in process and "
        "through genlm serve: together against one after another, memory against one program's, "
        "the slowest program) (``--smoke``: 907 x 32 x 3 SIS, 907 x 32 x 8 SMC and 3 programs x "
        "907 x 4 x 3 SIS on every engine, one process each, no warm-up (MLX: 907 x 32 x 3 and "
        "the 3 programs from 3-token prompts), and the 3 programs through genlm serve on hf; "
        "counters only)",
        quick=("--smoke",),
        files=("long_prompt",),
        needs="hf",
    ),
    Workload(
        "many-programs",
        "bench_many_programs.py",
        "8 SIS programs at once on one genlm-hf backend, each with its own ~900-token prompt, "
        "16 particles x 30 tokens: calls/s against the programs one by one, the slowest program "
        "against the mean, peak device memory, tokens computed against the minimum",
        quick=QUICK,
        files=("many_programs",),
        needs="hf",
        gpu=(
            # issue 69, item 3 on a GPU: together >= 0.9x one by one, peak memory <= 1.5x one
            # program's; the hook for bench_long_prompt.py's many-programs shape, once it has one
            GpuRun(
                "many_programs",
                (),
                ("--programs", "3", "--prompt-tokens", "48", "--particles", "3", "--tokens", "3"),
                150,
                (Slot(65, SMALL),),
            ),
        ),
    ),
)

BY_NAME = {w.name: w for w in WORKLOADS}


def gpu_runs() -> dict[str, tuple[Workload, GpuRun]]:
    """Every GPU run by its name, with its workload, in the plan's order of first use."""
    runs = {r.name: (w, r) for w in WORKLOADS for r in w.gpu}
    assert len(runs) == sum(len(w.gpu) for w in WORKLOADS), "two GPU runs share a name"
    return {name: runs[name] for name, _model, _optional in gpu_plan() if name in runs} | runs


def gpu_plan() -> list[tuple[str, str, bool]]:
    """The GPU check's runs in order: ``(run name, model tag, optional)``."""
    slots = sorted((s.order, r.name, s.model, s.optional) for w in WORKLOADS for r in w.gpu for s in r.plan)
    orders = [s[0] for s in slots]
    assert len(set(orders)) == len(orders), "two GPU runs share a place in the plan"
    return [(name, model, optional) for _order, name, model, optional in slots]


def sections_help() -> str:
    """The sections as ``run_all.py --help`` lists them."""
    import textwrap

    lines = ["sections (--only picks some; benchmarks/workloads.py declares them):"]
    for w in WORKLOADS:
        lines += textwrap.wrap(
            f"{w.name:<13} {w.measures}", 88, initial_indent="  ", subsequent_indent=" " * 16
        )
    return "\n".join(lines)
