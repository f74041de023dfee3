"""Rotary position embedding (HF's rotate-half layout) fused with the paged KV-cache write.

qkv [T, (nh + 2 nkv) * hd] float32 is the merged projection's output: q heads, then k heads,
then v heads. For each token and each of its q and k heads, dimension j of the first half pairs
with j + hd/2 of the second:

    x1' = x1 * cos[pos, j] - x2 * sin[pos, j]
    x2' = x2 * cos[pos, j] + x1 * sin[pos, j]

with cos/sin precomputed on the host for every position (gpu/rope.py: llama3 frequency scaling
included), so the kernel does no transcendental math. q is rotated in place (attention reads it
from qkv); the rotated k and the untouched v go straight to the bf16 cache at
slot_mapping[t] = block * block_size + offset, i.e. k_cache[block, offset, head, :]. Fusing the
write saves a kernel and a round trip of k through memory; a negative slot (a padding row of a
captured graph) rotates but writes nothing.

Shape: one thread per (token, head, j < hd/2): one (x1, x2) pair of a q or k head, or the
two values d = j and j + hd/2 of a v head, copied to the cache. No loop, and no division but
the slot's (block, offset): the block is 2-D, (hd/2, heads_per_block) with heads_per_block =
128 / (hd/2) (4 heads of 64 dimensions: one warp a head), the grid is (T, ceil((nh + 2 nkv) /
heads_per_block)), so j = threadIdx.x and head = blockIdx.y * heads_per_block + threadIdx.y.
At decode (1-8 tokens) this spreads a token over many blocks and SMs (Llama-3.2-1B: 48 heads,
12 blocks of 128 threads a token), and each thread's work is one short chain: positions[t] and
slot_mapping[t] (one broadcast load per warp) together with x1 and x2; then cos and sin; then
the stores (one 128-thread block per token, looping over ~1,300 pairs with 64-bit divisions,
took 7.9 us at batch 1). At prefill (thousands of tokens) the same
grid has tens of thousands of blocks, every warp reading and writing whole 128-byte runs (a
head's half row of x1, of x2, of cos and of sin): a streaming kernel. Each thread owns its
pair, so the in-place update needs no barrier.

The bound it is shaped for, on the H200: ~2 us at 1-8 tokens, two dependent memory round trips
(positions, then the cos/sin row) and the launch.

numpy twin: CpuBackend.rope_kv_write (gpu/backends/cpu.py).
"""

from __future__ import annotations

from numba import cuda

from gpu.kernels.bf16 import f32_to_bf16
from gpu.kernels.launch import cdiv, threads
from gpu.kernels.pdl import grid_dependency_sync

BLOCK_THREADS = 128  # per block on the GPU (32 in the simulator): 128 // (hd/2) heads, at least 1

SIGNATURES = {
    "rope_kv_kernel": [
        "void(float32[:, ::1], int32[::1], float32[:, ::1], float32[:, ::1],"
        " uint16[:, :, :, ::1], uint16[:, :, :, ::1], int32[::1], int64, int64, int64)"
    ]
}


@cuda.jit(cache=True)
def rope_kv_kernel(qkv, positions, cos, sin, k_cache, v_cache, slot_mapping, nh, nkv, hd):
    grid_dependency_sync()
    t = cuda.blockIdx.x
    j = cuda.threadIdx.x  # blockDim.x == hd // 2
    head = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
    if head >= nh + 2 * nkv:
        return
    half = hd // 2
    pos = positions[t]
    slot = slot_mapping[t]
    col = head * hd + j
    x1 = qkv[t, col]
    x2 = qkv[t, col + half]
    if head < nh + nkv:  # q or k: rotate in place
        c = cos[pos, j]
        s = sin[pos, j]
        r1 = x1 * c - x2 * s
        r2 = x2 * c + x1 * s
        qkv[t, col] = r1
        qkv[t, col + half] = r2
        if head >= nh and slot >= 0:
            block_size = k_cache.shape[1]
            block = slot // block_size
            offset = slot - block * block_size
            k_cache[block, offset, head - nh, j] = f32_to_bf16(r1)
            k_cache[block, offset, head - nh, j + half] = f32_to_bf16(r2)
    elif slot >= 0:  # v: copy to the cache
        block_size = v_cache.shape[1]
        block = slot // block_size
        offset = slot - block * block_size
        v_cache[block, offset, head - nh - nkv, j] = f32_to_bf16(x1)
        v_cache[block, offset, head - nh - nkv, j + half] = f32_to_bf16(x2)


def rope_kv_write(
    qkv, positions, cos, sin, k_cache, v_cache, slot_mapping, nh: int, nkv: int, hd: int, stream=0
) -> None:
    """Rotate q and k of qkv [T, ...] in place; write k and v to the caches at slot_mapping."""
    tokens = qkv.shape[0]
    if tokens == 0:
        return
    half = hd // 2
    heads_per_block = max(1, threads(BLOCK_THREADS) // half)
    grid = (tokens, cdiv(nh + 2 * nkv, heads_per_block))
    rope_kv_kernel[grid, (half, heads_per_block), stream](
        qkv, positions, cos, sin, k_cache, v_cache, slot_mapping, nh, nkv, hd
    )
