"""Tensor cores through inline PTX (gpu/kernels/mma.py): the fragment layout is right.

One warp multiplies a random 16 x 16 bf16 A by a 16 x 8 bf16 B and adds a float32 C, each
thread packing its fragments as the module docstring lays them out; numpy does the same product
in float64. A wrong row, column or half-word would put whole products in the wrong place, far
outside the tolerance (fp32 accumulation of exact bf16 products). In the CUDA simulator this
checks mma.py's twin, on the device the instruction itself: the kernels that use it are tested
in the simulator through the twin, so the two must agree. The PTX compiles for sm_90 everywhere
(tests/test_kernels_compile.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from gpu.kernels.bf16 import from_bf16_bits, to_bf16_bits


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mma_tile_matches_numpy(seed):
    from numba import cuda

    from gpu.kernels.mma import mma_tile_kernel

    rng = np.random.default_rng(seed)
    a = to_bf16_bits(rng.standard_normal((16, 16)).astype(np.float32))
    b = to_bf16_bits(rng.standard_normal((16, 8)).astype(np.float32))
    c = rng.standard_normal((16, 8)).astype(np.float32)
    d = cuda.device_array((16, 8), np.float32)
    mma_tile_kernel[1, 32](cuda.to_device(a), cuda.to_device(b), cuda.to_device(c), d)
    want = from_bf16_bits(a).astype(np.float64) @ from_bf16_bits(b).astype(np.float64) + c
    np.testing.assert_allclose(d.copy_to_host(), want, rtol=1e-5, atol=1e-5)
