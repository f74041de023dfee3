"""RMSNorm, and RMSNorm fused with the residual add that precedes it.

    rmsnorm:      out = x / sqrt(mean(x**2) + eps) * weight
    add_rmsnorm:  residual += x; out = rmsnorm(residual)

One block per row (token). The sum of squares is a block-wide reduction: each thread sums a
strided slice of the row (coalesced reads), then a shared-memory tree combines the partial sums
(block_reduce.block_sum); a second sweep scales the row and writes bf16, the dtype the next
matrix product reads. The residual stream stays float32. Fusing the add saves a kernel launch
and a full read and write of the residual per layer, which is what a decode step (a few rows,
bound by launches and memory) pays for.

numpy twins: CpuBackend.rmsnorm and CpuBackend.add_rmsnorm (gpu/backends/cpu.py).
"""

from __future__ import annotations

import math

from numba import cuda, float32

from gpu.kernels.bf16 import f32_to_bf16
from gpu.kernels.block_reduce import block_sum
from gpu.kernels.launch import MAX_THREADS, threads

SIGNATURES = {
    "rmsnorm_kernel": ["void(float32[:, ::1], float32[::1], float64, uint16[:, ::1])"],
    "add_rmsnorm_kernel": [
        "void(float32[:, ::1], float32[:, ::1], float32[::1], float64, uint16[:, ::1])"
    ],
}


@cuda.jit(cache=True)
def rmsnorm_kernel(x, weight, eps, out):
    buf = cuda.shared.array(MAX_THREADS, float32)
    row = cuda.blockIdx.x
    hidden = x.shape[1]
    squares = float32(0.0)
    for i in range(cuda.threadIdx.x, hidden, cuda.blockDim.x):
        v = x[row, i]
        squares += v * v
    total = block_sum(buf, squares)
    denom = math.sqrt(float32(total / float32(hidden)) + float32(eps))
    for i in range(cuda.threadIdx.x, hidden, cuda.blockDim.x):
        out[row, i] = f32_to_bf16(x[row, i] / denom * weight[i])


@cuda.jit(cache=True)
def add_rmsnorm_kernel(x, residual, weight, eps, out):
    buf = cuda.shared.array(MAX_THREADS, float32)
    row = cuda.blockIdx.x
    hidden = x.shape[1]
    squares = float32(0.0)
    for i in range(cuda.threadIdx.x, hidden, cuda.blockDim.x):
        v = residual[row, i] + x[row, i]
        residual[row, i] = v
        squares += v * v
    total = block_sum(buf, squares)
    denom = math.sqrt(float32(total / float32(hidden)) + float32(eps))
    # Each thread re-reads only the residual elements it wrote itself: no barrier needed.
    for i in range(cuda.threadIdx.x, hidden, cuda.blockDim.x):
        out[row, i] = f32_to_bf16(residual[row, i] / denom * weight[i])


def rmsnorm(x, weight, eps: float, out, stream=0) -> None:
    """out [T, H] bf16 = rmsnorm(x [T, H] f32) * weight [H] f32."""
    if x.shape[0]:
        rmsnorm_kernel[x.shape[0], threads(256), stream](x, weight, float(eps), out)


def add_rmsnorm(x, residual, weight, eps: float, out, stream=0) -> None:
    """residual += x (both [T, H] f32); out [T, H] bf16 = rmsnorm(residual) * weight."""
    if x.shape[0]:
        add_rmsnorm_kernel[x.shape[0], threads(256), stream](x, residual, weight, float(eps), out)
