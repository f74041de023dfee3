"""What every kernel launcher shares: the simulator switch and block sizes.

Under `NUMBA_ENABLE_CUDASIM=1` (CI, no GPU) a kernel runs as Python threads, about 0.7 s per
128-thread launch, so launchers use 32-thread blocks there and the GPU's sizes on the device.
The kernels read `cuda.blockDim.x` and never assume a block size beyond "a power of two, at most
MAX_THREADS", so both run the same code.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import config, cuda

SIMULATOR: bool = bool(config.ENABLE_CUDASIM)
# Decode launches are small on purpose (a grid of one block per sequence and head is the point
# of a batch-1 step): Numba's "grid size will likely under-utilize the GPU" warning is noise.
config.CUDA_LOW_OCCUPANCY_WARNINGS = 0
MAX_THREADS = 1024  # the largest block; shared reduction buffers are sized for it


def threads(gpu: int) -> int:
    """Threads per block: `gpu` on a real device, 32 (one warp) in the simulator."""
    return 32 if SIMULATOR else gpu


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def device_function(fn):
    """A `@cuda.jit(device=True)` helper, always inlined on the GPU (the simulator has no
    forceinline option and needs none)."""
    if SIMULATOR:
        return cuda.jit(device=True)(fn)
    return cuda.jit(device=True, forceinline=True)(fn)


@functools.cache
def _zero_slot():
    return cuda.to_device(np.zeros(1, np.int32))


def no_ring(out) -> tuple:
    """(ring, ring_slot) for a sampler launch that has no host ring (argmax.py): out itself as
    the ring's one row, and slot 0. The zero slot is made on the first such call, so a launch
    being captured into a graph must pass its own ring (the executor's always does)."""
    return out.reshape(1, out.shape[0]), _zero_slot()
