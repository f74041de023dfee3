"""The tensor-core walk of paged decode attention, and a warp per head at large batches.

The FFMA walk (attention_decode_ffma.py) spends ~900 instructions per warp and 16 tokens, 256
of them FFMAs: 4 per KV bf16 and query head at GQA 4. This walk (head_dim 64, at most 8 query
heads a KV head: tensor_cores_fit) gives the products to the tensor cores through mma.py: per
warp and 16 tokens, 8 mma for S = Q K^T (A = Q: the group's heads in rows 0-7 of 16) and 8 for
O += P V, whose A operand is S's accumulator fragment as it comes out: no shuffle, no shared
memory between the two products. The row max takes 2 xor shuffles, the exponentials 4 MUFU.
The fragments come straight from global memory: for K, 32 contiguous bytes of the row per lane
(the k index of the product is permuted, the same way for Q, so a lane's four k slots are four
adjacent dimensions); for V, 16 contiguous bytes of four tokens, paired bf16 by bf16 into the B
fragments. A block's 4 warps take 16 tokens each of every 64-token tile and merge their (m, l,
o) through shared memory at the end (tc_merge_warps).

Precision: a bf16 q would cost ~2^-9 of every score, a bf16 P as much of every weight (outputs
off by up to ~1e-2 on the tests' data). Both are split into two bf16, hi + lo, and the lo parts
ride in rows 8-15 of the A operand, which GQA leaves empty: rows g and g + 8 of the result add
up to fp32-accurate products at no extra mma, and the walk meets the FFMA walk's tolerance.

ptxas, sm_90: 358 loop instructions per 16 tokens (16 HMMA, 17 LDG) against the FFMA walk's
905, 112 registers, no spill. Each next tile's cache block is looked up one tile ahead (the
first before the wait for the previous kernel, pdl.py): batch 1 1,068 -> 1,081 tok/s. Measured
on the H200 (cold KV, tests/device/bench_kernels.py, FFMA walk -> tensor cores): batch 64 /
context 1,024 55.3 -> 45.5 us (2.95 TB/s), batch 256 / context 512 111.5 -> 96.4 us, batch 1
the same within 0.4 us (latency-bound); `tinychat bench decode`: batch 64 47,475 -> 48,603
tok/s, batch 256 107,978 -> 111,392.

A warp per head (choose_warp_heads_ctx, tc_write_head): at batch 256 the grid is 2,048 blocks,
4 waves, and at short contexts each block's set-up and merge cost as much as its walk. There a
warp walks its head's whole context 16 tokens a step and writes the output from its registers;
the grid's warps are all resident at once. Measured on the H200 (cold KV, us, off -> on): batch
256 context 128 43.8 -> 28.4, context 512 97.1 -> 79.0, context 1,024 165.8 -> 147.1 (3.65
TB/s); `tinychat bench decode` at batch 256 113,714 -> 126,670 tok/s.

The simulator runs the walk through mma.py's twin of the instruction.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, uint16, uint32, uint64

from gpu.kernels import mma
from gpu.kernels.bf16 import bf16_to_f32, f32_to_bf16
from gpu.kernels.launch import device_function

NEG_INF = float32(-math.inf)
FULL_MASK = 0xFFFFFFFF
LOW32, HIGH_SHIFT, LOW16 = np.uint64(0xFFFFFFFF), np.uint64(32), np.uint64(0xFFFF)
# A warp per (sequence, KV head) for contexts up to WARP_HEADS_MAX_CTX tokens, in launches of
# at least WARP_HEADS_MIN_BLOCKS blocks an SM (choose_warp_heads_ctx).
WARP_HEADS_MAX_CTX = 512
WARP_HEADS_MIN_BLOCKS = 4


def tensor_cores_fit(head_dim: int, group: int) -> bool:
    """Shapes the tensor-core walk is written for: head_dim 64 (4 lanes x 16 dimensions of a K
    row, 8 output tiles of 8), at most 8 query heads a KV head (the 16-row A operand)."""
    return head_dim == 64 and group <= 8


def tensor_core_functions(head_dim: int, group: int, block_size: int, nthreads: int):
    """(tensor_core_walk, tc_merge_warps, tc_write_head): the walk's device functions for one
    shape, every loop bound a constant of the build."""
    u_block_size = np.uint64(block_size)
    u_words = np.uint64(head_dim // 4)  # 8-byte words of one head's K (or V) row
    nwarps = nthreads // 32
    one_block = block_size % 16 == 0  # a warp's 16 tokens lie in one cache block

    @device_function
    def tc_tile_loads(
        base, last, step, block_tables, table, k_cache, v_cache, row_words, k_words, v_words,
        kk, vv, blk,
    ):  # fmt: skip
        """A warp's 16 tokens from `base` (clamped to `last`): this lane's K words (tokens g,
        8 + g: words 4c .. 4c + 3) into kk, its V words (tokens 2c, 2c + 1, 8 + 2c, 9 + 2c:
        words 2g, 2g + 1) into vv, all issued back to back. With blocks of a multiple of 16
        tokens the warp's 16 share one cache block: blk[0], looked up one step ahead (the
        first before the wait for the previous kernel), so no tile waits for its lookup."""
        tid = cuda.threadIdx.x
        g = (tid % 32) // 4
        c = tid % 4
        shared_block = blk[0]
        for n in range(6):
            if n < 2:
                t = uint64(min(base + 8 * n + g, last))
            else:
                t = uint64(min(base + 8 * ((n - 2) // 2) + 2 * c + n % 2, last))
            cache_block = shared_block
            if not one_block:
                cache_block = block_tables[table + t // u_block_size]
            word = (uint64(cache_block) * u_block_size + t % u_block_size) * row_words
            if n < 2:
                for i in range(4):
                    kk[4 * n + i] = k_cache[word + k_words + uint64(i)]
            else:
                vv[2 * (n - 2)] = v_cache[word + v_words]
                vv[2 * (n - 2) + 1] = v_cache[word + v_words + uint64(1)]
        if one_block:  # the next tile's block, while this one's words are in flight
            blk[0] = block_tables[table + uint64(min(base + step, last)) // u_block_size]

    @device_function
    def tensor_core_walk(
        qkv, k_cache, v_cache, block_tables, table, row, kvh, first, end, step, qscale,
        num_kv_heads, o, fa, fb, fc, blk,
    ):  # fmt: skip
        """This warp's share of a tensor-core walk: the 16 tokens from `first`, then every
        `step`-th 16 up to `end` (step 64: one of a block's 4 warps on one head; step 16: the
        warp alone on it). Returns (m, l) of head g, l summed over its 4 lanes; o holds the
        unnormalised output. Per warp and 16 tokens, S = Q K^T as 2 x 4
        mma (heads x 8 tokens, 16 dimensions each) and O += P V as 8 mma (heads x 8
        dimensions, 16 tokens). Lane = 4 g + c. Q is the A operand: row g = head g (rows past
        the group, and 8-15, are zero), k slots (2c, 2c+1, 2c+8, 2c+9) of chunk i = dimensions
        16c + 4i + 0..3, one 8-byte word. K^T is B: column g = token g of the n-tile, the same
        dimensions: word 4c + i of that token's row. S comes out as d0, d1 = S[head g, tokens
        2c, 2c+1], which is exactly P's A fragment for P V (two n-tiles = 16 tokens). V is B:
        column g of output tile j = dimension 8g + j, so a lane reads 16 contiguous bytes
        (words 2g, 2g+1) of its four tokens (2c, 2c+1, 8+2c, 9+2c) and pairs their bf16; D
        holds O[head g, dimensions 16c + j and 16c + 8 + j]. The softmax is online per warp
        (the row max of head g over 2 lanes' xor shuffles)."""
        qa = cuda.local.array(16, uint32)
        kk = cuda.local.array(8, uint64)  # 2 tokens x words 4c .. 4c+3
        vv = cuda.local.array(8, uint64)  # 4 tokens x words 2g, 2g+1
        sc = cuda.local.array(4, float32)
        ph = cuda.local.array(4, uint16)
        pl = cuda.local.array(4, uint16)
        tid = cuda.threadIdx.x
        g = (tid % 32) // 4
        c = tid % 4
        last = end - 1
        zero = uint32(0)
        # Q fragments, scaled to log2 units, split q = hi + lo into two bf16: hi in row g, lo
        # in row g + 8 (padding otherwise), so S's rows g and g + 8 add up to fp32-accurate
        # scores (bf16 q alone would cost ~2^-9 of each score) at no extra mma.
        for i in range(4):
            for e in range(2):  # dimensions +0, +1 (a0, a1) and +2, +3 (a2, a3)
                hi = zero
                lo = zero
                if g < group:
                    col = (kvh * group + g) * head_dim + 16 * c + 4 * i + 2 * e
                    x0 = qkv[row, col] * qscale
                    x1 = qkv[row, col + 1] * qscale
                    h0 = f32_to_bf16(x0)
                    h1 = f32_to_bf16(x1)
                    hi = mma.pack_bf16x2(h0, h1)
                    lo = mma.pack_bf16x2(
                        f32_to_bf16(x0 - bf16_to_f32(h0)), f32_to_bf16(x1 - bf16_to_f32(h1))
                    )
                qa[4 * i + 2 * e] = hi
                qa[4 * i + 2 * e + 1] = lo
        for j in range(16):
            o[j] = float32(0.0)
        m = NEG_INF
        lpart = float32(0.0)
        row_words = uint64(num_kv_heads) * u_words
        k_words = uint64(kvh) * u_words + uint64(4 * c)
        v_words = uint64(kvh) * u_words + uint64(2 * g)
        for base in range(first, end, step):
            tc_tile_loads(
                base, last, step, block_tables, table, k_cache, v_cache, row_words, k_words,
                v_words, kk, vv, blk,
            )  # fmt: skip
            # S = Q K^T, two n-tiles of 8 tokens; tokens past the end are masked.
            for n in range(2):
                s0 = float32(0.0)
                s1 = float32(0.0)
                s2 = float32(0.0)
                s3 = float32(0.0)
                for i in range(4):
                    w = kk[4 * n + i]
                    s0, s1, s2, s3 = mma.mma_m16n8k16(
                        fa, fb, fc, qa[4 * i], qa[4 * i + 1], qa[4 * i + 2], qa[4 * i + 3],
                        uint32(w & LOW32), uint32(w >> HIGH_SHIFT), s0, s1, s2, s3,
                    )  # fmt: skip
                t = base + 8 * n + 2 * c
                sc[2 * n] = s0 + s2 if t < end else NEG_INF  # q's hi and lo rows
                sc[2 * n + 1] = s1 + s3 if t + 1 < end else NEG_INF
            top = max(max(sc[0], sc[1]), max(sc[2], sc[3]))
            top = max(top, cuda.shfl_xor_sync(FULL_MASK, top, 1))
            top = max(top, cuda.shfl_xor_sync(FULL_MASK, top, 2))
            top = max(top, m)
            shift = top if top > NEG_INF else float32(0.0)
            alpha = math.exp2(m - shift)
            m = top
            lpart *= alpha
            for j in range(16):
                o[j] *= alpha
            for k in range(4):
                sc[k] = math.exp2(sc[k] - shift)  # p; 0 where masked
                lpart += sc[k]
            # P = hi + lo in bf16, hi in row g and lo in row g + 8, as for q.
            for k in range(4):
                ph[k] = f32_to_bf16(sc[k])
                pl[k] = f32_to_bf16(sc[k] - bf16_to_f32(ph[k]))
            pa0 = mma.pack_bf16x2(ph[0], ph[1])
            pa1 = mma.pack_bf16x2(pl[0], pl[1])
            pa2 = mma.pack_bf16x2(ph[2], ph[3])
            pa3 = mma.pack_bf16x2(pl[2], pl[3])
            # O += P V: output tile j holds dimensions 8 g' + j of column g'.
            for j in range(8):
                half = uint64(16 * (j % 4))
                word = j // 4
                b0 = mma.pack_bf16x2((vv[word] >> half) & LOW16, (vv[2 + word] >> half) & LOW16)
                b1 = mma.pack_bf16x2((vv[4 + word] >> half) & LOW16, (vv[6 + word] >> half) & LOW16)
                d0, d1, d2, d3 = mma.mma_m16n8k16(
                    fa, fb, fc, pa0, pa1, pa2, pa3, b0, b1, o[2 * j], o[2 * j + 1],
                    float32(0.0), float32(0.0),
                )  # fmt: skip
                o[2 * j] = d0 + d2  # P's hi and lo rows
                o[2 * j + 1] = d1 + d3
        # The row sum over the 4 lanes of head g.
        lpart += cuda.shfl_xor_sync(FULL_MASK, lpart, 1)
        lpart += cuda.shfl_xor_sync(FULL_MASK, lpart, 2)
        return m, lpart

    @device_function
    def tc_merge_warps(m, lpart, o, m_sh, l_sh, acc_sh):
        """The block's 4 warps walked one head together: each one's (m, l, o), rescaled to the
        block's max, into shared memory, where the kernel sums them like token slots."""
        tid = cuda.threadIdx.x
        wid = tid // 32
        g = (tid % 32) // 4
        c = tid % 4
        if c == 0 and g < group:
            m_sh[wid, g] = m
        cuda.syncthreads()
        if g < group:
            top = NEG_INF
            for k in range(nwarps):
                top = max(top, m_sh[k, g])
            wgt = float32(0.0)
            if top > NEG_INF:
                wgt = math.exp2(m - top)
            for j in range(8):
                acc_sh[wid, g * head_dim + 16 * c + j] = o[2 * j] * wgt
                acc_sh[wid, g * head_dim + 16 * c + 8 + j] = o[2 * j + 1] * wgt
            if c == 0:
                l_sh[wid, g] = lpart * wgt
        cuda.syncthreads()

    @device_function
    def tc_write_head(m, lpart, o, out, row, kvh):
        """A warp that walked its head alone: normalise and write. Lane (g, c) holds head g's
        dimensions 16c .. 16c + 15 (o[2j]: 16c + j, o[2j + 1]: 16c + 8 + j), 32 bytes of bf16."""
        tid = cuda.threadIdx.x
        g = (tid % 32) // 4
        c = tid % 4
        if g < group:
            inv = float32(0.0)
            if lpart > 0:
                inv = float32(1.0) / lpart
            col = (kvh * group + g) * head_dim + 16 * c
            for j in range(8):
                out[row, col + j] = f32_to_bf16(o[2 * j] * inv)
                out[row, col + 8 + j] = f32_to_bf16(o[2 * j + 1] * inv)

    return tensor_core_walk, tc_merge_warps, tc_write_head


def choose_warp_heads_ctx(
    num_seqs: int, num_kv_heads: int, num_sms: int, num_splits: int, head_dim: int, group: int
) -> int:
    """The longest context that a launch walks a warp per (sequence, KV head); 0: none.

    A block of 4 warps on one head splits each 64-token tile between its warps and merges
    their partial results through shared memory at the end. When the grid is many waves of
    such blocks (batch 256: 2,048 blocks, 528 resident) and the contexts are short, the set-up
    and merge of every wave cost more than its walk: 32.6 us a layer at batch 256 / context
    ~112 on the H200, against 13.8 at the copy rate. With a warp per head, the first quarter
    of a sequence's blocks walk 4 heads each, a warp a head, and write each output straight
    from its registers: the same tokens per warp, the same number of warps, now all resident
    in one wave, no barrier and no merge.

    A long context would make one warp's walk the launch's tail, so above WARP_HEADS_MAX_CTX
    tokens a sequence's blocks walk as before (decided per sequence, on the device, from
    seq_lens): on the throughput workload (contexts up to 2,048) a limit of 0 / 512 / 1,024 /
    2,048 gave 37,115 / 37,139 / 36,619 / 35,340 output tok/s. A launch of fewer than
    WARP_HEADS_MIN_BLOCKS blocks an SM keeps 4 warps a head, which it needs to fill the GPU:
    Llama-3.2-1B's batch 64 (512 blocks, one wave) would lose (48,420 -> 46,169 tok/s), its
    batch 128 gains (78,394 -> 81,344). Tensor-core walk only (the FFMA walk's token slots are
    not warps)."""
    blocks = num_seqs * num_kv_heads
    if num_splits != 1 or not tensor_cores_fit(head_dim, group):
        return 0
    return WARP_HEADS_MAX_CTX if blocks >= WARP_HEADS_MIN_BLOCKS * num_sms else 0
