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
So gpu/kernels' kernels get a locator of their own (_source_locator, first in line): one
folder, `<cache>/gpu-kernels`, whatever the install path, stamped with a hash of every source
file of gpu/kernels. Any edit there invalidates every kernel (Numba then compiles and
overwrites); the same sources anywhere find their kernels. The CPU kernels of gpu/kernels/cpu
likewise, in `<cache>/cpu-kernels`, stamped by that folder's files.
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
    """Put a source-stamped locator first among the CPU cache's locators (gpu/kernels/cpu's
    kernels) and among the CUDA cache's (gpu/kernels'; not in the simulator, which caches
    nothing). Once."""
    from numba.core import config
    from numba.core.caching import CacheImpl, UserProvidedCacheLocator

    _put_first(CacheImpl, _source_locator(UserProvidedCacheLocator, CPU_KERNELS_DIR,
                                          CPU_KERNELS_SUBDIR))  # fmt: skip
    if config.ENABLE_CUDASIM:
        return
    from numba.cuda.core.caching import _UserProvidedCacheLocator
    from numba.cuda.dispatcher import CUDACacheImpl

    _put_first(CUDACacheImpl, _source_locator(_UserProvidedCacheLocator, KERNELS_DIR,
                                              KERNELS_SUBDIR))  # fmt: skip


def _put_first(impl: type, locator: type) -> None:
    if not any(getattr(c, "tinychat_kernels", False) for c in impl._locator_classes):
        impl._locator_classes = [locator, *impl._locator_classes]


def _source_locator(base: type, folder: Path, subdir: str) -> type:
    """A locator (subclassing Numba's `base`) for the kernels defined in `folder`'s files:
    `<NUMBA_CACHE_DIR>/<subdir>`, stamped with the hash of every source file there. The CPU
    kernels get one of their own because the whole-step decode kernel (cpu/decode_step.py) is
    compiled with the per-op kernels of other files inlined: stamped by its own file only, it
    kept loading those kernels' code as it was before a change to them."""
    from numba.core import config

    class SourceLocator(base):
        tinychat_kernels = True

        def __init__(self, py_func, py_file) -> None:
            super().__init__(py_func, py_file)
            self._cache_path = os.path.join(config.CACHE_DIR, subdir)

        def get_source_stamp(self) -> str:
            return kernel_sources_hash(folder)

        @classmethod
        def from_function(cls, py_func, py_file):
            if Path(py_file).resolve().parent != folder:
                return None  # not one of ours: Numba's own locators decide
            return super().from_function(py_func, py_file)

    return SourceLocator
