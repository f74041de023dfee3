"""Block-wide reductions through shared memory: sum, max and argmax over a thread block.

Every thread passes its partial value and gets the block's result back. The tree halves the
active threads each step (log2(blockDim.x) barriers), so blockDim.x must be a power of two; the
caller owns the shared scratch (one slot per thread) so that one kernel can run several
reductions of different dtypes. Warp shuffles would save barriers, but the CUDA simulator has
none, and these reductions run once or a few times per row, not per element.

numpy twin: `np.sum`, `np.max`, `np.argmax` (first index of the maximum).
"""

from __future__ import annotations

from numba import cuda

from gpu.kernels.launch import device_function


@device_function
def block_sum(buf, value):
    """The sum of `value` over the block (buf: shared, >= blockDim.x slots of its dtype)."""
    tid = cuda.threadIdx.x
    buf[tid] = value
    cuda.syncthreads()
    stride = cuda.blockDim.x // 2
    while stride > 0:
        if tid < stride:
            buf[tid] += buf[tid + stride]
        cuda.syncthreads()
        stride //= 2
    total = buf[0]
    cuda.syncthreads()  # buf is free again for the next reduction
    return total


@device_function
def block_max(buf, value):
    """The maximum of `value` over the block."""
    tid = cuda.threadIdx.x
    buf[tid] = value
    cuda.syncthreads()
    stride = cuda.blockDim.x // 2
    while stride > 0:
        if tid < stride and buf[tid + stride] > buf[tid]:
            buf[tid] = buf[tid + stride]
        cuda.syncthreads()
        stride //= 2
    best = buf[0]
    cuda.syncthreads()
    return best


@device_function
def block_argmax(vbuf, ibuf, value, index):
    """The (value, index) pair with the largest value, the smallest index among ties.

    A thread with nothing to offer passes value -inf and index -1: it loses to any real pair,
    and if every value is -inf the smallest real index still wins, as np.argmax would have it.
    """
    tid = cuda.threadIdx.x
    vbuf[tid] = value
    ibuf[tid] = index
    cuda.syncthreads()
    stride = cuda.blockDim.x // 2
    while stride > 0:
        if tid < stride:
            v, i = vbuf[tid + stride], ibuf[tid + stride]
            w, j = vbuf[tid], ibuf[tid]
            if i >= 0 and (j < 0 or v > w or (v == w and i < j)):
                vbuf[tid] = v
                ibuf[tid] = i
        cuda.syncthreads()
        stride //= 2
    best, best_index = vbuf[0], ibuf[0]
    cuda.syncthreads()
    return best, best_index
