"""The interpreter's heap after the first model loads: one full garbage collection, once
a process.

Importing torch and transformers (or vLLM, MLX) and building a model leave a few hundred
thousand container objects that CPython's cyclic collector has not yet examined in a
full (oldest-generation) collection. CPython 3.11 and 3.12 run that collection once the
objects that survived the younger collections since the last full one exceed a quarter
of the long-lived heap - right after a first load that debt is nearly due, so a
program's first few dozen steps pay one full collection over the whole heap (measured on
a 2-core Xeon, about 400,000 tracked objects after loading the tiny Llama: 224-271 ms,
at step 31 of a loop of 64-row steps taking 6 ms each, 0.15 s to 0.3 s depending on the
heap). A step on a GPU takes a few milliseconds: that one pause costs a short program
(SIS, 20 tokens) as much as all its steps.

:func:`settle_after_load` pays it where seconds are spent anyway: the first time a
backend finishes loading in this process it runs ``gc.collect()``, which resets that
debt; later loads add only their own model's objects, far below the next full
collection's threshold. Nothing is frozen (``gc.freeze`` would keep a closed model's
reference cycles from ever being collected).
"""

from __future__ import annotations

import gc
import threading

__all__ = ["settle_after_load"]

_lock = threading.Lock()
_settled = False


def settle_after_load() -> bool:
    """A full collection the first time it is called in this process (True then); later
    calls do nothing."""
    global _settled
    with _lock:
        if _settled:
            return False
        _settled = True
    gc.collect()
    return True
