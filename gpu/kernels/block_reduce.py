"""Block-wide reductions: sum, max and argmax over a thread block.

Every thread passes its partial value and gets the block's result back. The caller owns the
shared scratch, so one kernel can run several reductions of different dtypes.

On the GPU a reduction is two warp-level butterflies around one shared-memory exchange:

1. each warp combines its 32 values with `cuda.shfl_xor_sync` (5 steps, registers only, no
   barrier); lane 0 of warp w writes the warp's result to buf[w];
2. one barrier; then every warp reads the blockDim.x / 32 warp results and combines them with
   another butterfly, so every thread ends with the result and no broadcast barrier is needed;
3. one more barrier before returning, so the caller may reuse buf for the next reduction.

That is 2 barriers whatever the block size, instead of log2(blockDim.x) for a shared-memory
tree; a barrier costs tens of cycles plus waiting for the slowest warp, and a small kernel
(rmsnorm of a few rows) is a chain of exactly these waits. An xor butterfly gives every lane the
same bits (a + b == b + a in floating point), so a block-wide decision on a reduced value (the
sampler's binary searches) is taken the same way by every thread. The GPU path needs blockDim.x
a power of two, multiple of 32, at most 1024, and buf of at least 32 slots.

The CUDA simulator has no warp shuffles: there (`if SIMULATOR`) the reduction is the classic
shared-memory tree, which halves the active threads each step (blockDim.x a power of two; buf
of at least blockDim.x slots; any block size, the simulator's 32 included).
tests/kernel_helpers.gpu_code_path runs the GPU path in the simulator with emulated shuffles.

numpy twin: `np.sum`, `np.max`, `np.argmax` (first index of the maximum).
"""

from __future__ import annotations

from numba import cuda

from gpu.kernels.launch import SIMULATOR, device_function

FULL_MASK = 0xFFFFFFFF


@device_function
def better(v, i, w, j):
    """Whether the pair (w, j) beats (v, i): a larger value, or the same value at a smaller
    index; index -1 means "nothing" and loses to any real pair."""
    return j >= 0 and (i < 0 or w > v or (w == v and j < i))


@device_function
def warp_sum(value, width):
    """The sum of `value` over each aligned group of `width` lanes (a power of two <= 32), in
    every lane of the group: an xor butterfly, no barrier."""
    offset = width // 2
    while offset > 0:
        value += cuda.shfl_xor_sync(FULL_MASK, value, offset)
        offset //= 2
    return value


@device_function
def warp_max(value, width):
    """The maximum of `value` over each aligned group of `width` lanes, in every lane."""
    offset = width // 2
    while offset > 0:
        other = cuda.shfl_xor_sync(FULL_MASK, value, offset)
        if other > value:
            value = other
        offset //= 2
    return value


@device_function
def warp_argmax(value, index, width):
    """The best (value, index) pair of each aligned group of `width` lanes, in every lane."""
    offset = width // 2
    while offset > 0:
        w = cuda.shfl_xor_sync(FULL_MASK, value, offset)
        j = cuda.shfl_xor_sync(FULL_MASK, index, offset)
        if better(value, index, w, j):
            value = w
            index = j
        offset //= 2
    return value, index


@device_function
def block_sum(buf, value):
    """The sum of `value` over the block (buf: shared, of the accumulation dtype)."""
    tid = cuda.threadIdx.x
    if SIMULATOR:
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
    warps = cuda.blockDim.x // 32
    lane = tid % 32
    value = warp_sum(value, 32)
    if lane == 0:
        buf[tid // 32] = value
    cuda.syncthreads()
    # Lane l of every warp takes warp l's result (lanes past the warp count repeat them, in
    # groups of `warps` lanes that each sum to the total).
    total = warp_sum(buf[lane & (warps - 1)], warps)
    cuda.syncthreads()
    return total


@device_function
def block_max(buf, value):
    """The maximum of `value` over the block."""
    tid = cuda.threadIdx.x
    if SIMULATOR:
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
    warps = cuda.blockDim.x // 32
    lane = tid % 32
    value = warp_max(value, 32)
    if lane == 0:
        buf[tid // 32] = value
    cuda.syncthreads()
    best = warp_max(buf[lane & (warps - 1)], warps)
    cuda.syncthreads()
    return best


@device_function
def block_argmax(vbuf, ibuf, value, index):
    """The (value, index) pair with the largest value, the smallest index among ties.

    A thread with nothing to offer passes value -inf and index -1: it loses to any real pair,
    and if every value is -inf the smallest real index still wins, as np.argmax would have it.
    """
    tid = cuda.threadIdx.x
    if SIMULATOR:
        vbuf[tid] = value
        ibuf[tid] = index
        cuda.syncthreads()
        stride = cuda.blockDim.x // 2
        while stride > 0:
            if tid < stride:
                v, i = vbuf[tid + stride], ibuf[tid + stride]
                w, j = vbuf[tid], ibuf[tid]
                if better(w, j, v, i):
                    vbuf[tid] = v
                    ibuf[tid] = i
            cuda.syncthreads()
            stride //= 2
        best, best_index = vbuf[0], ibuf[0]
        cuda.syncthreads()
        return best, best_index
    warps = cuda.blockDim.x // 32
    lane = tid % 32
    value, index = warp_argmax(value, index, 32)
    if lane == 0:
        vbuf[tid // 32] = value
        ibuf[tid // 32] = index
    cuda.syncthreads()
    slot = lane & (warps - 1)
    best, best_index = warp_argmax(vbuf[slot], ibuf[slot], warps)
    cuda.syncthreads()
    return best, best_index
