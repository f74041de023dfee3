"""Where the engine computes on this machine's CPU, the app's UI thread runs at a lower
priority than the engine (nice +UI_NICE), so that the engine's threads get the cores first and
the UI draws in what they leave.

The engine core's threads meet at a barrier between every two ops of a decode step
(gpu/kernels/cpu/decode_step.py). A frame (~10 ms of Textual's layout and render) that
preempts one of them holds the whole step up, the other thread waiting at the next barrier: on
two cores the UI's ~0.3 of a core cost the engine ~30%. At nice 10 the kernel runs the engine's
threads first; the UI's frames come later when the cores are busy, and then carry more tokens
each. `tinychat bench app --device cpu --tabs 2 --new-tokens 512` (the default model, the app's
sampling), 2-core host, this code and the code before alternating, load 0.7-1.8: the app on the
core streamed 0.91x, 0.83x, 0.88x of the core alone against 0.80x, 0.69x, 0.75x; the p99 gap
between a tab's frames grew from 83-118 ms to 152-174 ms.

Only the UI thread is reniced: Linux keeps a nice value per thread, and a thread or process
inherits it from the thread that starts it, so the app starts its engines (the core's process,
its receiver, an in-process engine thread) from its loader thread, which keeps the default.
An unprivileged thread cannot take its priority back: this is done once, for good. Elsewhere
than Linux a nice value is the whole process's, and nothing is changed.
"""

from __future__ import annotations

import os
import sys
import threading

UI_NICE = 10


def yield_cores_to_a_cpu_engine(device: str) -> bool:
    """Lower the calling thread's priority to UI_NICE if the engine runs on the CPU (Linux
    only); True if it did. Call it on the UI thread, once the engine is built."""
    if device != "cpu" or not sys.platform.startswith("linux"):
        return False
    tid = threading.get_native_id()
    try:
        if os.getpriority(os.PRIO_PROCESS, tid) < UI_NICE:
            os.setpriority(os.PRIO_PROCESS, tid, UI_NICE)
    except OSError:
        return False
    return True
