"""Paged attention for decode: one query token per sequence, split-KV (flash-decoding).

A decode step asks, for every sequence b and query head h: softmax(q . K^T * scale) @ V over
the sequence's whole context, whose K and V live in scattered cache blocks (the block table maps
logical block j of b to a physical block). This is memory-bound: every K/V byte of the context
is read once per step, so the kernel is shaped around reading them well and reading them once:

* One thread block per (sequence, KV head, split). GQA: the `group = nh / nkv` query heads that
  share a KV head are handled by the same block, so each K/V tile is loaded from memory once
  and used `group` times (Llama-3.2-1B: 4 heads per load).
* The context is walked in tiles of KT tokens. A tile's K and V rows are gathered through the
  block table into shared memory (converted from bf16 once), then every (head, token) score is a
  dot product out of shared memory. K rows are padded to HD_MAX + 1 floats so the threads of a
  warp, reading different tokens at the same dimension, hit different banks.
* Online softmax, one pass: each head keeps a running max m and sum l; a tile with a new max
  rescales the accumulator by exp(m_old - m_new). No score matrix, no second pass.
* Split-KV: with few sequences, (sequences x KV heads) blocks would leave most of the 132 SMs
  idle, e.g. batch 1 of Llama-3.2-1B is 8 blocks. So the context is cut into `num_splits`
  contiguous chunks (a multiple of KT tokens each, computed on the device from seq_lens), one
  block each; every split writes its unnormalised accumulator and (m, l), and a small reduce
  kernel merges them: out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s. num_splits depends
  only on the number of sequences (choose_num_splits), so a captured graph per batch-size bucket
  stays valid for any context length. With one split the kernel normalises and writes directly.

All shapes come from device buffers (query_start_loc, seq_lens, the block table and its row
stride in a one-element device array): no host value of the step is baked into the launch but
the number of sequences. A sequence with seq_len 0 (graph padding) writes zeros.

Measured on the H200 (issue 4, Llama-3.2-1B shapes): correct everywhere, but slow: 48 us at
batch 1 / context 1024 (32 splits), 849 us at batch 64 / context 1024, i.e. 90-140 GB/s of KV
against a 4.3 TB/s copy rate. Removing the 64-bit divisions from the inner loops gained only
6%, so the time is elsewhere: candidates are the 6 barriers per 32-token tile, the per-head
max and sum done serially by `group` threads, 64-long shared-memory dot products per thread,
and accumulators in local memory. Issue 5 measures and fixes it.

numpy twin: CpuBackend.attention (gpu/backends/cpu.py), with one query row per sequence.
"""

from __future__ import annotations

import math

from numba import cuda, float32, int32

from gpu.kernels.bf16 import bf16_to_f32, f32_to_bf16
from gpu.kernels.launch import cdiv, threads

KT = 32  # context tokens per tile
KT_PAD = KT + 1
MAX_GROUP = 8  # query heads per KV head
HD_MAX = 128  # head_dim
HD_PAD = HD_MAX + 1  # K and Q rows padded by one float: no shared-memory bank conflicts
ACC = 32  # accumulators per thread: MAX_GROUP * cdiv(HD_MAX, 32) for blocks of >= 32 threads
MAX_SPLITS = 32
NEG_INF = float32(-math.inf)

SIGNATURES = {
    "decode_attention_kernel": [
        "void(float32[:, ::1], uint16[:, :, :, ::1], uint16[:, :, :, ::1], int32[::1],"
        " int32[::1], int32[::1], int32[::1], int64, float64, int64, uint16[:, ::1],"
        " float32[::1], float32[::1])"
    ],
    "decode_reduce_kernel": [
        "void(int32[::1], int64, int64, uint16[:, ::1], float32[::1], float32[::1])"
    ],
}


@cuda.jit(cache=True)
def decode_attention_kernel(
    qkv,
    k_cache,
    v_cache,
    block_tables,
    block_table_stride,
    query_start_loc,
    seq_lens,
    num_heads,
    scale,
    num_splits,
    out,
    part_acc,
    part_ml,
):
    q_sh = cuda.shared.array((MAX_GROUP, HD_PAD), float32)
    k_sh = cuda.shared.array((KT, HD_PAD), float32)
    v_sh = cuda.shared.array((KT, HD_MAX), float32)
    s_sh = cuda.shared.array((MAX_GROUP, KT_PAD), float32)
    m_sh = cuda.shared.array(MAX_GROUP, float32)
    l_sh = cuda.shared.array(MAX_GROUP, float32)
    alpha_sh = cuda.shared.array(MAX_GROUP, float32)
    block_sh = cuda.shared.array(KT, int32)
    offset_sh = cuda.shared.array(KT, int32)
    acc = cuda.local.array(ACC, float32)

    b = cuda.blockIdx.x
    kvh = cuda.blockIdx.y
    split = cuda.blockIdx.z
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    block_size = k_cache.shape[1]
    nkv = k_cache.shape[2]
    hd = k_cache.shape[3]
    group = num_heads // nkv
    row = query_start_loc[b]
    ctx = seq_lens[b]
    table = b * block_table_stride[0]

    # Each thread owns one dimension `lane_d` of rows lane_r, lane_r + row_step, ... (heads of
    # q / the accumulator, tokens of a K/V tile), fixed for the whole kernel: the inner loops do
    # no integer division (64-bit divisions by a runtime value cost ~100 instructions each).
    if nt >= hd:
        row_step = nt // hd
        lane_r = tid // hd if tid < row_step * hd else MAX_GROUP + KT  # spare threads idle
        lane_d = tid % hd
        d_step = hd
    else:  # fewer threads than dimensions (the simulator's 32-thread blocks)
        row_step = 1
        lane_r = 0
        lane_d = tid
        d_step = nt

    # This split's share of the context: whole tiles, the last split possibly short or empty.
    chunk = ((ctx + num_splits - 1) // num_splits + KT - 1) // KT * KT
    start = split * chunk
    end = min(ctx, start + chunk)

    for r in range(lane_r, group, row_step):
        for d in range(lane_d, hd, d_step):
            q_sh[r, d] = qkv[row, (kvh * group + r) * hd + d] * float32(scale)
    for r in range(tid, group, nt):
        m_sh[r] = NEG_INF
        l_sh[r] = float32(0.0)
    for k in range(ACC):
        acc[k] = float32(0.0)

    for t0 in range(start, end, KT):
        n = min(KT, end - t0)
        # The physical place of each token of the tile, once per token.
        if tid < n:
            pos = t0 + tid
            block_sh[tid] = block_tables[table + pos // block_size]
            offset_sh[tid] = pos % block_size
        cuda.syncthreads()
        # Gather the tile's K and V rows (consecutive threads read consecutive dimensions of
        # one token: coalesced); rows past the context are zeros in V and masked in S.
        for t in range(lane_r, KT, row_step):
            for d in range(lane_d, hd, d_step):
                if t < n:
                    k_sh[t, d] = bf16_to_f32(k_cache[block_sh[t], offset_sh[t], kvh, d])
                    v_sh[t, d] = bf16_to_f32(v_cache[block_sh[t], offset_sh[t], kvh, d])
                else:
                    v_sh[t, d] = float32(0.0)
        cuda.syncthreads()
        # Scores of every (head, token) pair of the tile (KT is a power of two: no division).
        for e in range(tid, group * KT, nt):
            r = e // KT
            t = e - r * KT
            s = NEG_INF
            if t < n:
                s = float32(0.0)
                for d in range(hd):
                    s += q_sh[r, d] * k_sh[t, d]
            s_sh[r, t] = s
        cuda.syncthreads()
        # Online softmax: the new running max of each head and the factor rescaling the past.
        for r in range(tid, group, nt):
            m_old = m_sh[r]
            m_new = m_old
            for t in range(n):
                m_new = max(m_new, s_sh[r, t])
            alpha_sh[r] = math.exp(m_old - m_new)
            m_sh[r] = m_new
        cuda.syncthreads()
        for e in range(tid, group * KT, nt):
            r = e // KT
            t = e - r * KT
            s_sh[r, t] = math.exp(s_sh[r, t] - m_sh[r]) if t < n else float32(0.0)
        cuda.syncthreads()
        for r in range(tid, group, nt):
            total = l_sh[r] * alpha_sh[r]
            for t in range(n):
                total += s_sh[r, t]
            l_sh[r] = total
        k = 0
        for r in range(lane_r, group, row_step):
            for d in range(lane_d, hd, d_step):
                a = acc[k] * alpha_sh[r]
                for t in range(n):
                    a += s_sh[r, t] * v_sh[t, d]
                acc[k] = a
                k += 1
        cuda.syncthreads()

    cuda.syncthreads()  # an empty split ran no tile: make the initial (m, l) visible
    k = 0
    for r in range(lane_r, group, row_step):
        for d in range(lane_d, hd, d_step):
            h = kvh * group + r
            if num_splits == 1:
                value = float32(0.0)
                if l_sh[r] > 0:
                    value = acc[k] / l_sh[r]
                out[row, h * hd + d] = f32_to_bf16(value)
            else:
                part_acc[((b * num_heads + h) * num_splits + split) * hd + d] = acc[k]
            k += 1
    if num_splits > 1:
        for r in range(tid, group, nt):
            base = ((b * num_heads + kvh * group + r) * num_splits + split) * 2
            part_ml[base] = m_sh[r]
            part_ml[base + 1] = l_sh[r]


@cuda.jit(cache=True)
def decode_reduce_kernel(query_start_loc, num_heads, num_splits, out, part_acc, part_ml):
    """Merge the splits of one (sequence, head): one block, one thread per dimension."""
    b = cuda.blockIdx.x
    h = cuda.blockIdx.y
    hd = out.shape[1] // num_heads
    row = query_start_loc[b]
    base = (b * num_heads + h) * num_splits
    m_all = NEG_INF
    for s in range(num_splits):
        m_all = max(m_all, part_ml[(base + s) * 2])
    for d in range(cuda.threadIdx.x, hd, cuda.blockDim.x):
        num = float32(0.0)
        den = float32(0.0)
        if m_all != NEG_INF:
            for s in range(num_splits):
                m = part_ml[(base + s) * 2]
                if m != NEG_INF:  # an empty split wrote (m, l) only: skip its accumulator
                    w = math.exp(m - m_all)
                    num += w * part_acc[(base + s) * hd + d]
                    den += w * part_ml[(base + s) * 2 + 1]
        value = float32(0.0)
        if den > 0:
            value = num / den
        out[row, h * hd + d] = f32_to_bf16(value)


def choose_num_splits(num_seqs: int, num_kv_heads: int, num_sms: int) -> int:
    """Splits per sequence so that about two blocks per SM are busy (1 once the batch does it).

    A function of the batch size alone, so every step of a graph bucket launches the same grid.
    """
    blocks = num_seqs * num_kv_heads
    if blocks >= num_sms:
        return 1
    return min(MAX_SPLITS, cdiv(2 * num_sms, blocks))


def partial_sizes(num_seqs: int, num_heads: int, head_dim: int, num_splits: int) -> tuple:
    """Elements of the (accumulator, (m, l)) scratch that a split launch needs."""
    if num_splits == 1:
        return 0, 0
    return num_seqs * num_heads * num_splits * head_dim, num_seqs * num_heads * num_splits * 2


def decode_attention(
    qkv,
    k_cache,
    v_cache,
    block_tables,
    block_table_stride,
    query_start_loc,
    seq_lens,
    num_seqs: int,
    num_heads: int,
    scale: float,
    out,
    part_acc,
    part_ml,
    num_splits: int = 1,
    stream=0,
) -> None:
    """out [B, nh * hd] bf16: attention of the one query row of each of num_seqs sequences.

    part_acc / part_ml: float32 scratch of at least partial_sizes(...) elements (unused, any
    array, when num_splits is 1).
    """
    if num_seqs == 0:
        return
    nkv, hd = k_cache.shape[2], k_cache.shape[3]
    group = num_heads // nkv
    block = threads(128)
    if group > MAX_GROUP or hd > HD_MAX or block < 32:
        raise ValueError(f"decode attention supports group <= {MAX_GROUP}, head_dim <= {HD_MAX}")
    decode_attention_kernel[(num_seqs, nkv, num_splits), block, stream](
        qkv, k_cache, v_cache, block_tables, block_table_stride, query_start_loc, seq_lens,
        num_heads, float(scale), num_splits, out, part_acc, part_ml,
    )  # fmt: skip
    if num_splits > 1:
        decode_reduce_kernel[(num_seqs, num_heads), min(threads(128), 128), stream](
            query_start_loc, num_heads, num_splits, out, part_acc, part_ml
        )
