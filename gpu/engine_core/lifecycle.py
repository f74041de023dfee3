"""The core process dies with its parent: no orphan may hold the GPU after a kill -9 of the app.

Two guards, both cheap:
- a pipe whose write end only the parent holds (client.py makes it, the core inherits the read
  end): it reads EOF the moment the parent process is gone, however it died. A daemon thread
  waits on it and ends the process.
- On Linux, prctl(PR_SET_PDEATHSIG, SIGKILL): the kernel kills the core when its parent dies,
  even while the core's Python is stuck in a long C call. The kernel ties it to the *thread*
  that spawned the core, so it is set only when that thread is the parent's main thread (the
  app spawns from a loader thread that ends long before the app).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading

PR_SET_PDEATHSIG = 1
PARENT_GONE = b"tinychat engine core: its parent process is gone, exiting\n"


def die_with_parent(parent_pid: int, kernel_signal: bool, death_fd: int) -> None:
    """Arm both guards (call first thing in the core process)."""
    if kernel_signal and sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:  # the parent died before the guards were up
        os._exit(1)

    def watch() -> None:
        while os.read(death_fd, 1):  # nothing is ever written: b"" is EOF, the parent is gone
            pass
        os.write(2, PARENT_GONE)
        os._exit(1)

    threading.Thread(target=watch, name="tinychat-parent-watch", daemon=True).start()


def ignore_interrupts() -> None:
    """Ctrl-C reaches every process of the terminal's foreground group: the core leaves it to
    its parent, which stops the core cleanly (SHUTDOWN) or not at all."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
