"""How many threads the CPU backend's products run on: the cores this process may really use.

`os.cpu_count()` counts the machine; a container or `taskset` may give the process fewer
(`os.sched_getaffinity`), and a cgroup CPU quota (cgroup v2 `cpu.max`) fewer still. More
threads than that is worse than useless: OpenBLAS's threads spin while they wait for each
other, so two threads on a core that something else also wants turn a 0.3 ms product into tens
of milliseconds. The chat app leaves one core to its UI (`EngineConfig.cpu_threads`).
Both thread pools follow the one count: OpenBLAS's (threadpoolctl) and Numba's.

Numba's parallel loops run on its OpenMP layer here, whose threads spin between loops by
default: on 2 busy cores a [3072, 576] product took 3.5 ms that way against 0.15 ms with the
threads told to sleep (OMP_WAIT_POLICY=PASSIVE, read once, when Numba starts its threads; set
here, before that, unless the user chose a policy).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

USER_OMP_WAIT_POLICY = os.environ.get("OMP_WAIT_POLICY")  # the user's, before the default
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def usable_cpus() -> int:
    """The cores this process can run on: its affinity mask, capped by a cgroup CPU quota."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, cpus)


def _cgroup_quota(path: Path = Path("/sys/fs/cgroup/cpu.max")) -> float | None:
    """Cores' worth of CPU time the cgroup grants ("max" or no file: no limit)."""
    try:
        quota, period = path.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        return int(quota) / int(period)
    except (ValueError, ZeroDivisionError):
        return None


def resolve_threads(requested: int | None, reserve: int = 0) -> int:
    """`requested` if set; else the BLAS thread count the user set in the environment
    (OPENBLAS_NUM_THREADS / OMP_NUM_THREADS, as a test runner with a worker per core does);
    else every usable core but `reserve` (at least one)."""
    if requested is not None:
        return max(1, requested)
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return max(1, usable_cpus() - reserve)


def set_cpu_threads(blas: int, numba_threads: int | None = None) -> None:
    """Limit OpenBLAS (and any other BLAS pool numpy loaded) to `blas` threads, process-wide,
    and Numba's parallel loops run from the calling thread to `numba_threads` (None: Numba is
    left alone: the float32 oracle runs no Numba code)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=blas, user_api="blas")
    if numba_threads is not None:
        import numba

        numba.set_num_threads(max(1, min(numba_threads, numba.config.NUMBA_NUM_THREADS)))
