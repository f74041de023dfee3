"""The FFMA walk of paged decode attention: a thread group per token, online softmax per slot.

This is the plain paged-attention kernel of attention_decode.py, written for CUDA cores; the
tensor-core walk (attention_decode_tc.py) replaces it where the shape fits (head_dim 64, at most
8 query heads a KV head) and it serves every other shape (head_dim 128, larger groups).

* Thread-group-per-token. A token's K row of one KV head is head_dim bf16 = 128 contiguous bytes
  (head_dim 64). `lanes = head_dim / 8` consecutive threads own one token: each lane reads two
  8-byte words of the row (four bf16 each: the cache is viewed as uint64 on the host side and
  unpacked with shifts), so every load instruction of a warp covers whole 32-byte sectors. A
  block has 128 / lanes token slots (16 at head_dim 64) and each slot takes UNROLL = 4 tokens
  per iteration: one iteration = a tile of 64 tokens, 16 KB of K and V, whose loads (16 x 8
  bytes per thread) are all issued before any is used.
* Scores without shared memory: each lane holds its 8 dimensions of q for every head of the
  group in registers (pre-scaled by scale * log2(e), so the softmax uses exp2), computes 8-long
  partial dot products and sums them over the lanes of its token with warp shuffles
  (log2(lanes) xor-shuffles per score, no barrier).
* Online softmax per token slot. Every slot keeps its own running max m, sum l and accumulator
  (group x 8 values per lane, registers) and rescales them once per tile. Slots never talk to
  each other inside the loop: the main loop has no barrier and no shared memory at all. At the
  end the slots are merged through shared memory (weights 2^(m_slot - M)), once per block.
* Instructions, not bytes. The cache is passed as flat uint64 words and indexed with unsigned
  64-bit arithmetic whose factors are constants of the build (block size, words per row): one
  product per token, the same word index for K and V. Numba's signed int64 indexing had cost
  ~600 integer instructions a tile (negative-index wrap, floor division, run-time strides)
  against 256 FFMAs; the loop is now ~900 instructions (FFMA 256, FADD 84, FMUL 76, SHFL 48,
  MUFU 20, LDG 20; the bf16 unpacking ~64 of the rest), 127 registers and no spill at the
  128-register bound. Measured on the H200 (cold KV, tests/device/bench_kernels.py): batch 64 /
  context 1,024 in 55.3 us (2.43 TB/s of KV; the first, shared-memory version took 849), batch
  256 / context 512 in 111.5 us.
* UNROLL = 4 tokens a slot: measured against 2 and 8 on the H200 (cold KV, us, with 168 and
  255 registers allowed): batch 64 context 1,024 71.8 / 74.8 / 81.0, batch 256 context 512
  144.9 / 148.3 / 171.3.

In the CUDA simulator (no warp shuffles) the lane sums go through shared memory with two
barriers per tile; `if SIMULATOR` picks the path at run time (the tests turn this module's
switch off to run the GPU path with emulated shuffles) and the GPU build drops the other.

numpy twin: CpuBackend.attention (gpu/backends/cpu.py), with one query row per sequence.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, uint64

from gpu.kernels.bf16 import bf16_of_word
from gpu.kernels.launch import SIMULATOR, device_function

DIMS = 8  # head dimensions per lane: two 8-byte words of four bf16
UNROLL = 4  # tokens per token slot per tile
NEG_INF = float32(-math.inf)
FULL_MASK = 0xFFFFFFFF


def ffma_walk_function(head_dim: int, group: int, block_size: int, nthreads: int, simulated: bool):
    """The walk's device function, ffma_walk(...), specialised for one shape: every small loop
    has a constant trip count and every per-thread array is indexed by constants only, so they
    live in registers."""
    lanes = head_dim // DIMS  # threads per token
    log_lanes = lanes.bit_length() - 1
    slots = nthreads // lanes  # tokens in flight per step
    tile = slots * UNROLL  # tokens per iteration; splits are whole tiles
    nq = group * DIMS  # q values (and accumulators) per lane
    ns = group * UNROLL  # scores per lane per tile
    nw = 2 * UNROLL  # 8-byte words per lane per tile, of K and of V
    red_shape = (ns, nthreads) if simulated else (1, 1)
    u_block_size = np.uint64(block_size)
    u_words = np.uint64(head_dim // 4)  # 8-byte words of one head's K (or V) row
    u_lanes = np.uint64(lanes)

    @device_function
    def ffma_walk(
        qkv, k_cache, v_cache, block_tables, table, row, kvh, start, end, qscale, num_kv_heads,
        m_sh, l_sh, acc_sh, blk,
    ):  # fmt: skip
        """The FFMA walk of this split's tokens, [start, end): the partial results of its token
        slots into m_sh / l_sh / acc_sh (blk: the first tile's blocks, looked up already)."""
        red = cuda.shared.array(red_shape, float32)  # the simulator's lane sums
        q = cuda.local.array(nq, float32)
        acc = cuda.local.array(nq, float32)
        m = cuda.local.array(group, float32)
        den = cuda.local.array(group, float32)
        shift = cuda.local.array(group, float32)
        s = cuda.local.array(ns, float32)
        kw = cuda.local.array(nw, uint64)
        vw = cuda.local.array(nw, uint64)
        x = cuda.local.array(DIMS, float32)
        tid = cuda.threadIdx.x
        slot = tid // lanes
        lane = tid % lanes
        last = end - 1
        # Lane `lane` owns dimensions 4 * (lane + w * lanes) + i of every head (word w = 0, 1
        # of its token's row, bf16 i = 0..3 of the word): j = 4 * w + i below.
        for h in range(group):
            col = (kvh * group + h) * head_dim
            for j in range(DIMS):
                d = 4 * (lane + (j // 4) * lanes) + j % 4
                q[h * DIMS + j] = qkv[row, col + d] * qscale
                acc[h * DIMS + j] = float32(0.0)
            m[h] = NEG_INF
            den[h] = float32(0.0)

        # Word (block, offset, kvh, lane) of the flat cache: (block * block_size + offset) *
        # row_words + head_words, the same for K and V.
        row_words = uint64(num_kv_heads) * u_words
        head_words = uint64(kvh) * u_words + uint64(lane)
        for t0 in range(start, end, tile):
            for u in range(UNROLL):  # UNROLL tokens x 2 words x (K, V), all in flight at once
                off = uint64(min(t0 + u * slots + slot, last)) % u_block_size
                word = (uint64(blk[u]) * u_block_size + off) * row_words + head_words
                kw[2 * u] = k_cache[word]
                kw[2 * u + 1] = k_cache[word + u_lanes]
                vw[2 * u] = v_cache[word]
                vw[2 * u + 1] = v_cache[word + u_lanes]
            for u in range(UNROLL):  # the next tile's blocks, while this one computes
                t = uint64(min(t0 + tile + u * slots + slot, last))
                blk[u] = block_tables[table + t // u_block_size]
            # Partial scores over this lane's 8 dimensions, then summed over the token's lanes.
            for u in range(UNROLL):
                for j in range(DIMS):
                    x[j] = bf16_of_word(kw[2 * u + j // 4], j % 4)
                for h in range(group):
                    dot = float32(0.0)
                    for j in range(DIMS):
                        dot += q[h * DIMS + j] * x[j]
                    s[u * group + h] = dot
            if SIMULATOR:
                for i in range(ns):
                    red[i, tid] = s[i]
                cuda.syncthreads()
                for i in range(ns):
                    total = float32(0.0)
                    for k in range(lanes):
                        total += red[i, slot * lanes + k]
                    s[i] = total
                cuda.syncthreads()
            else:
                for i in range(ns):
                    v = s[i]
                    for k in range(log_lanes):
                        v += cuda.shfl_xor_sync(FULL_MASK, v, 1 << k)
                    s[i] = v
            # Online softmax (log2 units): new running max, rescale the past once per tile.
            for h in range(group):
                top = m[h]
                for u in range(UNROLL):
                    if t0 + u * slots + slot < end:
                        top = max(top, s[u * group + h])
                # A slot with no token yet keeps m = -inf: shift by 0 so no -inf - -inf.
                base = top if top > NEG_INF else float32(0.0)
                alpha = math.exp2(m[h] - base)
                m[h] = top
                shift[h] = base
                den[h] *= alpha
                for j in range(DIMS):
                    acc[h * DIMS + j] *= alpha
            for u in range(UNROLL):
                valid = t0 + u * slots + slot < end
                for j in range(DIMS):
                    x[j] = bf16_of_word(vw[2 * u + j // 4], j % 4)
                for h in range(group):
                    p = float32(0.0)
                    if valid:
                        p = math.exp2(s[u * group + h] - shift[h])
                    den[h] += p
                    for j in range(DIMS):
                        acc[h * DIMS + j] += p * x[j]

        # Merge the token slots: M = max of their m, weights 2^(m_slot - M).
        if lane == 0:
            for h in range(group):
                m_sh[slot, h] = m[h]
        cuda.syncthreads()
        for h in range(group):
            top = NEG_INF
            for k in range(slots):
                top = max(top, m_sh[k, h])
            w = float32(0.0)
            if top > NEG_INF:
                w = math.exp2(m[h] - top)
            for j in range(DIMS):
                d = 4 * (lane + (j // 4) * lanes) + j % 4
                acc_sh[slot, h * head_dim + d] = acc[h * DIMS + j] * w
            if lane == 0:
                l_sh[slot, h] = den[h] * w
        cuda.syncthreads()

    return ffma_walk
