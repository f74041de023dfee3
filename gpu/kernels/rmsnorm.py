"""RMSNorm: out = x / sqrt(mean(x**2) + eps) * weight, row by row.

It serves the steps gpu/kernels/gemv.py does not: prefill chunks and decode batches of more
than gemv.MAX_TOKENS tokens, where the cuda backend composes each fused op (ComposedOps in
gpu/backends/base.py: rmsnorm, then a cuBLAS product). Decode steps of a few tokens compute
the norm in gemv.py's prologue instead and never launch this kernel.

One block per row (token): the sum of squares is a block-wide reduction, then every element is
scaled and written as bf16, the dtype the next matrix product reads. The residual stream stays
float32.

At a batch decode (9-64 rows) the kernel does almost no work: its time is the chain of waits
between dependent steps (load the row, reduce, write). So the row kernels are built for one
hidden size (`row_kernel`, cached per size) and shaped to make that chain short:

* the row lives in registers: each of the block's threads owns `per` elements, i, i + threads,
  ... (coalesced), and every load of x and of the weight is issued before the first is used;
  one memory round trip, then the second sweep reads registers, not memory; `per` and the
  strides are compile-time constants, so the loops unroll and the per-thread arrays are
  registers. The last thread's loads past the row are clamped to its last element and skipped
  (no branch around a load);
* the sum of squares is block_reduce.block_sum: warp shuffles, 2 barriers;
* threads = the power of two that gives ~8 elements a thread, 32 to 1024 (576 -> 128 x 5,
  2048 -> 256 x 8, 3072 -> 512 x 6, 4096 -> 512 x 8): few warps to reduce for a few rows, and
  at 64-4096 rows (batch decode, prefill) enough independent loads per SM to keep memory busy.

A row longer than ROW_IN_REGISTERS_MAX (16 x 1024 floats) takes the general kernel instead: a
strided loop over the row for the sum of squares, the same reduction, and a second strided
sweep that re-reads the row (from L1/L2).

The bound it is shaped for, on the H200: ~2 us for a few rows of 2048, one load round trip and
the reduction (strided loops and a 10-barrier tree took 5.5 us); at 4096 rows the copy rate
(32 MB read and 16 MB written at hidden 2048: ~12-15 us).

numpy twin: CpuBackend.rmsnorm (gpu/backends/cpu.py).
"""

from __future__ import annotations

import functools
import math

from numba import cuda, float32

from gpu.kernels.bf16 import f32_to_bf16
from gpu.kernels.block_reduce import block_sum
from gpu.kernels.launch import MAX_THREADS, cdiv, threads
from gpu.kernels.pdl import grid_dependency_sync

ELEMENTS_PER_THREAD = 8  # the target of row_threads
ROW_IN_REGISTERS_MAX = 16 * MAX_THREADS  # longer rows take the general (strided) kernel

_ARGS = "float32[:, ::1], float32[::1], float64, uint16[:, ::1]"


def row_threads(hidden: int) -> int:
    """Threads per block on the GPU for a row of `hidden`: a power of two, ~8 elements each."""
    n = 32
    while n < MAX_THREADS and n * ELEMENTS_PER_THREAD < hidden:
        n *= 2
    return n


@functools.cache
def row_kernel(hidden: int):
    """The rmsnorm kernel that holds a row of `hidden` in registers."""
    nthreads = threads(row_threads(hidden))  # the simulator: 32, with a longer `per`
    per = cdiv(hidden, nthreads)
    last = hidden - 1
    exact = per * nthreads == hidden  # no thread has slots past the row: no guards

    def rmsnorm_row(x, weight, eps, out):
        grid_dependency_sync()
        buf = cuda.shared.array(nthreads, float32)
        xs = cuda.local.array(per, float32)
        ws = cuda.local.array(per, float32)
        row = cuda.blockIdx.x
        tid = cuda.threadIdx.x
        for k in range(per):  # all loads in flight at once
            i = min(tid + k * nthreads, last)
            xs[k] = x[row, i]
            ws[k] = weight[i]
        squares = float32(0.0)
        for k in range(per):
            if exact or tid + k * nthreads < hidden:
                squares += xs[k] * xs[k]
        total = block_sum(buf, squares)
        denom = math.sqrt(total / float32(hidden) + float32(eps))
        for k in range(per):
            i = tid + k * nthreads
            if exact or i < hidden:
                out[row, i] = f32_to_bf16(xs[k] / denom * ws[k])

    return cuda.jit(cache=True)(rmsnorm_row)


@cuda.jit(cache=True)
def rmsnorm_kernel(x, weight, eps, out):
    """The general kernel: any row length, the row read twice."""
    grid_dependency_sync()
    buf = cuda.shared.array(MAX_THREADS, float32)
    row = cuda.blockIdx.x
    hidden = x.shape[1]
    squares = float32(0.0)
    for i in range(cuda.threadIdx.x, hidden, cuda.blockDim.x):
        v = x[row, i]
        squares += v * v
    total = block_sum(buf, squares)
    denom = math.sqrt(total / float32(hidden) + float32(eps))
    for i in range(cuda.threadIdx.x, hidden, cuda.blockDim.x):
        out[row, i] = f32_to_bf16(x[row, i] / denom * weight[i])


# The row kernels of the preset models' hidden sizes (Llama-3.2-1B: 2048, SmolLM2-135M: 576),
# by name, for the sm_90 compile test; any other size is built on first use.
rmsnorm_row_2048 = row_kernel(2048)
rmsnorm_row_576 = row_kernel(576)
SIGNATURES = {
    "rmsnorm_kernel": [f"void({_ARGS})"],
    "rmsnorm_row_2048": [f"void({_ARGS})"],
    "rmsnorm_row_576": [f"void({_ARGS})"],
}


def rmsnorm(x, weight, eps: float, out, stream=0) -> None:
    """out [T, H] bf16 = rmsnorm(x [T, H] f32) * weight [H] f32."""
    rows, hidden = x.shape
    if rows == 0:
        return
    if hidden <= ROW_IN_REGISTERS_MAX:
        kernel = row_kernel(hidden)
        kernel[rows, threads(row_threads(hidden)), stream](x, weight, float(eps), out)
    else:
        rmsnorm_kernel[rows, threads(MAX_THREADS), stream](x, weight, float(eps), out)
