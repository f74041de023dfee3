"""Compile every kernel a reply can need before the engine reports ready.

Numba compiles a kernel the first time it is launched with new argument types, and the kernel
factories of gpu/kernels/ make one kernel per shape (a batch size's gemv variant, a head
layout's attention). Left to first use, that put seconds of compiling inside replies: the first
reply of a fresh install waited ~14 s for its first token, and a reply whose batch shrank to a
size not seen before stalled ~6 s while that size's kernels compiled.

So the executor hands over every step a reply can run (CudaExecutor.warm_up_steps: each decode
bucket and each prefill/mixed bucket, greedy and sampling), and this module:

1. Discovers the kernels those steps launch without running anything: the steps run with
   `CUDADispatcher.call` replaced by a recorder of (kernel, argument types), the types Numba's
   own launch would compile for, and with the cuBLAS products skipped. No list of kernels is
   kept by hand, so a new kernel (a sampler's, say) is covered the day a step launches it.
2. Loads each from Numba's on-disk cache (gpu/kernels/compile_cache.py) where it is there:
   a warm start only pays this.
3. Compiles the rest here, one after another, and writes each to the disk cache. Numba holds
   the GIL and a global lock while compiling, so threads would run one at a time, and a
   kernel compiled in another process cannot be installed here (numba-cuda 0.30.4's unpickled
   kernel has no target context). On an H100 a Llama-3.2-1B engine was ready in ~11 s with
   most of its kernels compiling.

`count_compiled_kernels()` counts the kernels compiled or loaded so far in this process, for
the test that nothing compiles after the engine is ready.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from numba.cuda.dispatcher import CUDADispatcher

log = logging.getLogger(__name__)

ProgressFn = Callable[[str, int, int], None]
KernelUse = tuple[CUDADispatcher, tuple]  # (kernel, argument types)

COMPILING = "compiling kernels"
LOADING = "loading kernels"


@dataclass
class PrecompileReport:
    """What the precompile did (the bench and the logs show it)."""

    kernels: int = 0  # distinct (kernel, argument types) the steps launch
    steps: int = 0  # steps discovered
    already: int = 0  # compiled or loaded before (an earlier engine of this process)
    loaded: int = 0  # found in the disk cache
    compiled: int = 0  # compiled now (and written to the disk cache)
    discover_s: float = 0.0
    seconds: float = 0.0


class _SkippedGemm:
    """Stands in for the backend's cuBLAS object while kernels are discovered."""

    def linear(self, x, w, out, accumulate: bool = False) -> None:
        pass


@contextlib.contextmanager
def recording_launches(backend: Any) -> Iterator[dict[tuple, KernelUse]]:
    """Within: every Numba kernel launch records (dispatcher, argument types) in the dict it
    yields instead of compiling and running, and the backend's cuBLAS products are skipped.
    Process-wide (the patch is on the class): nothing else may launch kernels meanwhile."""
    uses: dict[tuple, KernelUse] = {}

    def record(dispatcher: CUDADispatcher, args: tuple, launch_config: Any) -> None:
        argtypes = tuple(dispatcher.typeof_pyval(a) for a in args)
        uses.setdefault((id(dispatcher), argtypes), (dispatcher, argtypes))

    original = CUDADispatcher.call
    gemm = backend.gemm
    CUDADispatcher.call = record
    backend.gemm = _SkippedGemm()
    try:
        yield uses
    finally:
        CUDADispatcher.call = original
        backend.gemm = gemm


def discover(backend: Any, steps: Iterable[tuple[Any, Callable[[], None]]]) -> tuple[list, int]:
    """The distinct kernel uses of `steps` ((key, run) pairs), in launch order, and the number
    of steps."""
    count = 0
    with recording_launches(backend) as uses:
        for _key, run in steps:
            run()
            count += 1
    return list(uses.values()), count


def _load_cached(dispatcher: CUDADispatcher, argtypes: tuple) -> bool:
    """Install the kernel from the disk cache if it is there; never compile."""
    can_compile = dispatcher._can_compile
    dispatcher._can_compile = False  # compile() then stops at the cache ("Compilation disabled")
    try:
        dispatcher.compile(argtypes)
        return True
    except RuntimeError:
        return False
    finally:
        dispatcher._can_compile = can_compile


def precompile(
    backend: Any,
    steps: Iterable[tuple[Any, Callable[[], None]]],
    progress: ProgressFn | None = None,
) -> PrecompileReport:
    """Make every kernel that `steps` launch ready to run in this process: loaded from the
    disk cache, or compiled."""
    t0 = time.perf_counter()
    report = PrecompileReport()
    uses, report.steps = discover(backend, steps)
    report.discover_s = time.perf_counter() - t0
    report.kernels = len(uses)
    pending = [(d, a) for d, a in uses if a not in d.overloads]
    report.already = len(uses) - len(pending)
    total, done = len(uses), report.already
    missing = []
    for dispatcher, argtypes in pending:
        if _load_cached(dispatcher, argtypes):
            report.loaded += 1
            done += 1
            if progress is not None:
                progress(LOADING, done, total)
        else:
            missing.append((dispatcher, argtypes))
    for dispatcher, argtypes in missing:
        dispatcher.compile(argtypes)
        report.compiled += 1
        done += 1
        if progress is not None:
            progress(COMPILING, done, total)
    report.seconds = time.perf_counter() - t0
    log.info("precompile: %s", report)
    return report


def count_compiled_kernels() -> int:
    """Kernels compiled or loaded from the disk cache in this process so far: the overloads of
    every live Numba CUDA dispatcher. It grows by one each time a launch has to compile (or
    load) a kernel; a test takes it before and after replies to show that none did."""
    return sum(len(obj.overloads) for obj in gc.get_objects() if isinstance(obj, CUDADispatcher))
