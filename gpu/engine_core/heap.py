"""The core process's garbage collector: the build's heap frozen before the first step.

Building an engine leaves a large heap of long-lived objects (modules, the tokenizer, and
above all Numba's compiler state: a cold build compiles every kernel in this process). Python's
full collection walks all of it, inside whichever step it falls: on an H100, one decode step at
batch 256 took 418 ms instead of ~2 ms, a 417 ms generation-2 collection
(tests/device/sampling_table.py's collector callback, random Llama-3.2-1B weights, cold build);
on the 2-core CPU a warm build of the default model leaves ~157,000 objects, a 48-51 ms full
collection. Collected once and frozen (`gc.freeze`), that heap is never walked again: a full
collection then costs what the steps made since (~0 ms on the same CPU heap).

Only a process that holds one engine for its whole life should freeze: frozen objects are never
collected, so a process that builds and drops engines (the tests) would keep each one's cycles.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> None:
    """Collect the build's garbage, then freeze every object that survives (call once, after
    the engine is built and warmed up, before it serves)."""
    gc.collect()
    gc.freeze()
