"""Where Numba keeps the compiled kernels: `$TINYCHAT_HOME/numba-cache`, next to the models.

Numba's in-tree default (a `__pycache__` beside each kernel file) lives and dies with the
installed package, so a new virtual environment started with a cold cache: every kernel
compiled again (26 s for a first `tinychat generate` of Llama-3.2-1B on an H100). Under the
tinychat home the compiled kernels outlive the venv. A user who sets NUMBA_CACHE_DIR keeps it.

When Numba reads the setting: `numba.core.config` copies NUMBA_CACHE_DIR into
`config.CACHE_DIR` when numba is first imported, and again in `reload_config()` (which the
compiler also calls before every compile) whenever a NUMBA_* variable changed. A kernel reads
`config.CACHE_DIR` once, when `@cuda.jit(cache=True)` builds its cache locator
(`_UserProvidedCacheLocator`, numba/cuda/core/caching.py): at import for a module-level kernel,
when a factory is first called for the others. So this must run before any kernel module is
imported; gpu/kernels/__init__.py calls it. It sets the variable (rather than only the config
attribute) so that child processes (a bench's start-up runs) inherit the folder.

Numba's own locator keys a kernel's cache on its file's path, modification time and size: a
package installed at a new path (a new venv) would miss it, and a kernel whose helper changed
(bf16.py, block_reduce.py, pdl.py) would load stale code, since only its own file is stamped.
So gpu/kernels' kernels get a locator of their own (KernelSourceLocator, first in line): one
folder, `<cache>/gpu-kernels`, whatever the install path, stamped with a hash of every source
file of gpu/kernels. Any edit there invalidates every kernel (Numba then compiles and
overwrites); the same sources anywhere find their kernels.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from pathlib import Path

CACHE_ENV = "NUMBA_CACHE_DIR"
CACHE_SUBDIR = "numba-cache"
KERNELS_DIR = Path(__file__).resolve().parent
KERNELS_SUBDIR = "gpu-kernels"
CPU_KERNELS_DIR = KERNELS_DIR / "cpu"
CPU_KERNELS_SUBDIR = "cpu-kernels"


def default_cache_dir() -> Path:
    """`$TINYCHAT_HOME/numba-cache` (the home as the weights package resolves it)."""
    from weights.paths import tinychat_home

    return tinychat_home() / CACHE_SUBDIR


def use_cache_dir() -> str:
    """Point Numba's kernel cache at the tinychat home unless NUMBA_CACHE_DIR is set already;
    returns the folder in use. Safe to call again (the first call decides)."""
    folder = os.environ.get(CACHE_ENV) or str(default_cache_dir())
    os.environ[CACHE_ENV] = folder
    if "numba" in sys.modules:  # imported already: make its config see the variable now
        from numba.core import config

        if config.CACHE_DIR != folder:
            config.reload_config()
    _install_locator()
    return folder


@functools.cache
def kernel_sources_hash(folder: Path = KERNELS_DIR) -> str:
    """sha256 over the names and bytes of every .py file of `folder` (gpu/kernels)."""
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _install_locator() -> None:
    """Put CpuKernelSourceLocator first among the CPU cache's locators and KernelSourceLocator
    first among the CUDA cache's (once; the CUDA one not in the simulator, which caches
    nothing)."""
    from numba.core import config

    _install_cpu_locator()
    if config.ENABLE_CUDASIM:
        return
    from numba.cuda.core.caching import _UserProvidedCacheLocator
    from numba.cuda.dispatcher import CUDACacheImpl

    if any(getattr(c, "tinychat_kernels", False) for c in CUDACacheImpl._locator_classes):
        return

    class KernelSourceLocator(_UserProvidedCacheLocator):
        """gpu/kernels' kernels: `<NUMBA_CACHE_DIR>/gpu-kernels`, stamped with the hash of
        every kernel source file (see the module's docstring)."""

        tinychat_kernels = True

        def __init__(self, py_func, py_file) -> None:
            super().__init__(py_func, py_file)
            self._cache_path = os.path.join(config.CACHE_DIR, KERNELS_SUBDIR)

        def get_source_stamp(self) -> str:
            return kernel_sources_hash()

        @classmethod
        def from_function(cls, py_func, py_file):
            if Path(py_file).resolve().parent != KERNELS_DIR:
                return None  # not one of ours: Numba's own locators decide
            return super().from_function(py_func, py_file)

    CUDACacheImpl._locator_classes = [KernelSourceLocator, *CUDACacheImpl._locator_classes]


def _install_cpu_locator() -> None:
    """The CPU kernels (gpu/kernels/cpu) the same way: `<NUMBA_CACHE_DIR>/cpu-kernels`, stamped
    with the hash of every source file there. The whole-step decode kernel (decode_step.py)
    is compiled with the per-op kernels of other files inlined: stamped by its own file only,
    it kept loading the code of those kernels as they were before a change to them (a fix to
    the q8 product's rounding reached the per-op path and not the decode step)."""
    from numba.core.caching import CacheImpl, UserProvidedCacheLocator

    if any(getattr(c, "tinychat_kernels", False) for c in CacheImpl._locator_classes):
        return

    class CpuKernelSourceLocator(UserProvidedCacheLocator):
        tinychat_kernels = True

        def __init__(self, py_func, py_file) -> None:
            super().__init__(py_func, py_file)
            self._cache_path = os.path.join(config_cache_dir(), CPU_KERNELS_SUBDIR)

        def get_source_stamp(self) -> str:
            return kernel_sources_hash(CPU_KERNELS_DIR)

        @classmethod
        def from_function(cls, py_func, py_file):
            if Path(py_file).resolve().parent != CPU_KERNELS_DIR:
                return None
            return super().from_function(py_func, py_file)

    CacheImpl._locator_classes = [CpuKernelSourceLocator, *CacheImpl._locator_classes]


def config_cache_dir() -> str:
    from numba.core import config

    return config.CACHE_DIR
