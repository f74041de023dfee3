"""Rotary position embedding (HF's rotate-half layout) fused with the paged KV-cache write.

qkv [T, (nh + 2 nkv) * hd] float32 is the merged projection's output: q heads, then k heads,
then v heads. For each token (one block per token) and each of its q and k heads, dimension j of
the first half pairs with j + hd/2 of the second:

    x1' = x1 * cos[pos, j] - x2 * sin[pos, j]
    x2' = x2 * cos[pos, j] + x1 * sin[pos, j]

with cos/sin precomputed on the host for every position (gpu/rope.py: llama3 frequency scaling
included), so the kernel does no transcendental math. q is rotated in place (attention reads it
from qkv); the rotated k and the untouched v go straight to the bf16 cache at
slot_mapping[t] = block * block_size + offset, i.e. k_cache[block, offset, head, :]. Fusing the
write saves a kernel and a round trip of k through memory; a negative slot (a padding row of a
captured graph) rotates but writes nothing. Each thread owns whole (x1, x2) pairs, so the
in-place update needs no barrier.

numpy twin: CpuBackend.rope_kv_write (gpu/backends/cpu.py).
"""

from __future__ import annotations

from numba import cuda

from gpu.kernels.bf16 import f32_to_bf16
from gpu.kernels.launch import threads

SIGNATURES = {
    "rope_kv_kernel": [
        "void(float32[:, ::1], int32[::1], float32[:, ::1], float32[:, ::1],"
        " uint16[:, :, :, ::1], uint16[:, :, :, ::1], int32[::1], int64, int64, int64)"
    ]
}


@cuda.jit(cache=True)
def rope_kv_kernel(qkv, positions, cos, sin, k_cache, v_cache, slot_mapping, nh, nkv, hd):
    t = cuda.blockIdx.x
    pos = positions[t]
    slot = slot_mapping[t]
    block_size = k_cache.shape[1]
    block = slot // block_size
    offset = slot - block * block_size
    half = hd // 2
    for e in range(cuda.threadIdx.x, (nh + nkv) * half, cuda.blockDim.x):
        head = e // half
        j = e - head * half
        base = head * hd
        x1 = qkv[t, base + j]
        x2 = qkv[t, base + j + half]
        c = cos[pos, j]
        s = sin[pos, j]
        r1 = x1 * c - x2 * s
        r2 = x2 * c + x1 * s
        qkv[t, base + j] = r1
        qkv[t, base + j + half] = r2
        if head >= nh and slot >= 0:
            k_cache[block, offset, head - nh, j] = f32_to_bf16(r1)
            k_cache[block, offset, head - nh, j + half] = f32_to_bf16(r2)
    if slot >= 0:
        v_base = (nh + nkv) * hd
        for e in range(cuda.threadIdx.x, nkv * hd, cuda.blockDim.x):
            head = e // hd
            d = e - head * hd
            v_cache[block, offset, head, d] = f32_to_bf16(qkv[t, v_base + e])


def rope_kv_write(
    qkv, positions, cos, sin, k_cache, v_cache, slot_mapping, nh: int, nkv: int, hd: int, stream=0
) -> None:
    """Rotate q and k of qkv [T, ...] in place; write k and v to the caches at slot_mapping."""
    if qkv.shape[0]:
        rope_kv_kernel[qkv.shape[0], threads(128), stream](
            qkv, positions, cos, sin, k_cache, v_cache, slot_mapping, nh, nkv, hd
        )
