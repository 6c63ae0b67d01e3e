"""Where llama.cpp keeps the weights on a CPU: whether its extra buffer types (AMX,
CPU_REPACK; ``use_extra_bufts``) are used, and why. Imports nothing (no llama_cpp): the
engine applies the decision when a model loads, ``genlm doctor`` reports it.

The decision reads llama.cpp's own system info (``llama_print_system_info()``), so it
holds for any llama-cpp-python build, ours or one a user compiled.
"""

from __future__ import annotations

import re

__all__ = ["amx_buffer_in", "extra_buffers_choice", "use_extra_buffers"]


def amx_buffer_in(system_info: str) -> bool:
    """Whether a llama.cpp build with this system info (``llama_print_system_info()``)
    puts quantised weights into its AMX buffer: it was compiled for AMX (``AMX_INT8 = 1``).

    That buffer's matmul crashes or computes garbage on Q4_0/Q4_1 weights on some AMX
    CPUs (segfault in ``ggml_backend_amx_mul_mat`` at the first decode of a Q4_1 GGUF on
    a Sapphire-Rapids-class Xeon; llama.cpp issue #20824, PR #16315)."""
    return re.search(r"\bAMX_INT8\s*=\s*1\b", system_info) is not None


def extra_buffers_choice(setting: bool | None, system_info: str) -> tuple[bool, str]:
    """``(use_extra_bufts, why)``: the config's ``cpu_extra_buffers`` when set, else off
    exactly where the build has the AMX buffer (the extra buffer types are AMX and
    CPU_REPACK; llama.cpp cannot drop one alone, and REPACK has no x86 kernel for Q4_1 or
    F16/F32 weights, so nothing else is lost)."""
    if setting is not None:
        return setting, f"cpu_extra_buffers={setting} in the config"
    if amx_buffer_in(system_info):
        return False, (
            "llama.cpp's build reports AMX_INT8 = 1, and its AMX buffer computes Q4_0/Q4_1 weights "
            "wrong or segfaults on some AMX CPUs (llama.cpp issue #20824, PR #16315); weights stay in "
            "plain CPU buffers (cpu_extra_buffers=True turns them on, for a build whose AMX path works)"
        )
    return True, "llama.cpp's build reports no AMX_INT8: no AMX buffer, its REPACK layouts are safe"


def use_extra_buffers(setting: bool | None, system_info: str) -> bool:
    """``use_extra_bufts`` for the model (:func:`extra_buffers_choice`'s decision)."""
    return extra_buffers_choice(setting, system_info)[0]
