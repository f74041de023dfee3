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
imported; gpu/kernels/__init__.py calls it. Setting the variable (rather than only the config
attribute) also hands the folder to the compile workers (gpu/backends/cuda/precompile.py),
which inherit the environment.

The cache is keyed by each kernel file's path, modification time and size (and Numba's own
version): it survives a new venv over the same source tree (`pip install -e .`); a copy of the
package installed elsewhere compiles once more, into the same folder.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

CACHE_ENV = "NUMBA_CACHE_DIR"
CACHE_SUBDIR = "numba-cache"


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
    return folder
