"""Compile every kernel a reply can need before the engine reports ready, in parallel.

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
3. Compiles the rest in worker processes (compile_worker.py): Numba holds the GIL and a global
   lock while compiling, so threads would run one at a time. Each worker receives a pickled
   dispatcher (Numba pickles a kernel as its Python function and options) and the argument
   types, compiles, and sends back the compiled kernel (PTX and cubin); this process installs
   it and writes it to the disk cache itself. One process writes the cache, so workers never
   race on a kernel's index file (a factory's kernels share one). Workers are not run for a
   couple of kernels (their start-up, ~2 s, would cost more), and anything a worker could not
   deliver is compiled here, so the result is the same with any number of workers.

`count_compiled_kernels()` counts the kernels compiled or loaded so far in this process, for
the test that nothing compiles after the engine is ready.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import pickle
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from numba.cuda.dispatcher import CUDADispatcher

log = logging.getLogger(__name__)

ProgressFn = Callable[[str, int, int], None]
KernelUse = tuple[CUDADispatcher, tuple]  # (kernel, argument types)

# Workers are worth their start-up from this many kernels to compile.
MIN_KERNELS_FOR_WORKERS = 3
MAX_WORKERS = 16
# Each worker holds a CUDA context of its own (~0.5 GiB on an H100): leave room for them.
WORKER_DEVICE_BYTES = 1 << 30
COMPILING = "compiling kernels"
LOADING = "loading kernels"


@dataclass
class PrecompileReport:
    """What the precompile did (the bench and the logs show it)."""

    kernels: int = 0  # distinct (kernel, argument types) the steps launch
    steps: int = 0  # steps discovered
    already: int = 0  # compiled or loaded before (an earlier engine of this process)
    loaded: int = 0  # found in the disk cache
    compiled_by_workers: int = 0
    compiled_here: int = 0  # compiled in this process (few kernels, or a worker failed)
    workers: int = 0
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


def _install(dispatcher: CUDADispatcher, argtypes: tuple, kernel: Any) -> None:
    """Add a kernel compiled elsewhere as if this process had compiled it: an overload of
    the dispatcher, and an entry of its disk cache."""
    if argtypes in dispatcher.overloads:
        return
    dispatcher.add_overload(kernel, argtypes)
    dispatcher._cache.save_overload(argtypes, kernel)  # a NullCache for cache=False kernels


def worker_count(pending: int) -> int:
    """How many compile workers to start for `pending` kernels: one per CPU core but one, at
    most MAX_WORKERS, and no more than the free device memory holds contexts for."""
    if pending < MIN_KERNELS_FOR_WORKERS:
        return 0
    cores = max(1, (os.cpu_count() or 2) - 1)
    try:
        from numba import cuda

        free, _ = cuda.current_context().get_memory_info()
        by_memory = max(0, int(free // WORKER_DEVICE_BYTES) - 1)
    except Exception:  # no answer: let the cores decide
        by_memory = MAX_WORKERS
    return max(0, min(pending, cores, MAX_WORKERS, by_memory))


def _worker_env() -> dict[str, str]:
    """The workers' environment: this one (NUMBA_CACHE_DIR, CUDA_VISIBLE_DEVICES, ...), with
    this source tree importable."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def _serve(proc: subprocess.Popen, tasks: queue.Queue, blobs: dict, results: queue.Queue):
    """Feed one worker tasks until none are left; put each reply (i, kernel or None, error)."""
    try:
        while True:
            try:
                i, key, argtypes = tasks.get_nowait()
            except queue.Empty:
                break
            try:
                pickle.dump((i, blobs[key], argtypes), proc.stdin)
                proc.stdin.flush()
                results.put(pickle.load(proc.stdout))
            except (OSError, EOFError, pickle.UnpicklingError) as exc:
                results.put((i, None, f"worker lost: {exc!r}"))
                break
    finally:
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def compile_in_workers(
    uses: list[KernelUse], workers: int, progress: ProgressFn | None = None, done: int = 0,
    total: int = 0,
) -> list[KernelUse]:  # fmt: skip
    """Compile `uses` in `workers` processes and install each kernel here as it arrives;
    returns the uses that came back without a kernel (to compile here)."""
    blobs: dict[int, bytes | None] = {}
    tasks: queue.Queue = queue.Queue()
    failed: list[KernelUse] = []
    for i, (dispatcher, argtypes) in enumerate(uses):
        key = id(dispatcher)
        if key not in blobs:
            try:
                blobs[key] = pickle.dumps(dispatcher, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as exc:  # a kernel Numba cannot pickle: compiled here
                log.warning("precompile: cannot send %s to a worker: %s", dispatcher, exc)
                blobs[key] = None
        if blobs[key] is None:
            failed.append(uses[i])
        else:
            tasks.put((i, key, argtypes))
    expected = len(uses) - len(failed)
    results: queue.Queue = queue.Queue()
    env = _worker_env()
    procs, threads, logs = [], [], []
    for _ in range(workers):
        err = tempfile.TemporaryFile()
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpu.backends.cuda.compile_worker"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env,
        )  # fmt: skip
        thread = threading.Thread(target=_serve, args=(proc, tasks, blobs, results), daemon=True)
        thread.start()
        procs.append(proc)
        threads.append(thread)
        logs.append(err)
    received = 0
    while received < expected:
        try:
            i, payload, error = results.get(timeout=1.0)
        except queue.Empty:
            if not any(t.is_alive() for t in threads) and results.empty():
                break  # every worker is gone: what is left is compiled here
            continue
        received += 1
        dispatcher, argtypes = uses[i]
        if payload is not None:
            try:
                _install(dispatcher, argtypes, pickle.loads(payload))
            except Exception as exc:
                payload, error = None, f"{type(exc).__name__}: {exc}"
        if payload is None:
            log.warning("precompile: a worker could not compile %s: %s", dispatcher, error)
            failed.append(uses[i])
        if progress is not None:
            progress(COMPILING, done + received, total)
    for t in threads:
        t.join(timeout=5)
    while not tasks.empty():  # never handed out (all workers died)
        i, _, _ = tasks.get_nowait()
        failed.append(uses[i])
    for proc, err in zip(procs, logs, strict=True):
        if proc.returncode not in (0, None):
            err.seek(0)
            tail = err.read()[-2000:].decode(errors="replace")
            log.warning("precompile: a compile worker exited with %s: %s", proc.returncode, tail)
        err.close()
    return failed


def precompile(
    backend: Any,
    steps: Iterable[tuple[Any, Callable[[], None]]],
    progress: ProgressFn | None = None,
    workers: int | None = None,
) -> PrecompileReport:
    """Make every kernel that `steps` launch ready to run in this process: loaded from the
    disk cache, or compiled (in `workers` processes; None: worker_count's choice)."""
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
    report.workers = worker_count(len(missing)) if workers is None else workers
    if missing and report.workers:
        if progress is not None:
            progress(COMPILING, done, total)
        failed = compile_in_workers(missing, report.workers, progress, done, total)
        report.compiled_by_workers = len(missing) - len(failed)
        done += report.compiled_by_workers
        missing = failed
    for dispatcher, argtypes in missing:
        dispatcher.compile(argtypes)
        report.compiled_here += 1
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
