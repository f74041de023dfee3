"""Attention for prefill chunks (and mixed batches): many query tokens per sequence over the
paged cache, causal, tiled through shared memory, online softmax.

Sequence b owns query rows [qsl[b], qsl[b+1]) of this step; they are the last q_len tokens of
its context of seq_lens[b] tokens, so query j sits at position p0 + j with p0 = seq_len - q_len
(p0 > 0 when the chunk starts mid-sequence: an earlier chunk or a cached prefix is already in
the cache, and rope_kv has just written this chunk's K and V behind it). Query j may attend to
context positions 0..p0 + j.

* One thread block per (sequence, KV head, query tile). A query tile holds QT consecutive query
  tokens times the `group` query heads of the KV head: R = QT * group <= R_MAX rows, so each K/V
  tile loaded into shared memory serves all R rows (the GQA sharing of the decode kernel, plus
  reuse across query tokens).
* The block walks the context in KV tiles of KT tokens up to its last query's position (the
  causal mask also bounds the work), gathering K and V through the block table into shared
  memory, scoring all (row, token) pairs out of shared memory, and folding the tile into the
  rows' running max, sum and accumulator (online softmax, one pass over the context).
* A thread owns fixed (row, dimension) accumulators in registers/local memory, so the rescale
  and the P @ V update need no barrier between them.

The grid's third dimension, cdiv(max_query_len, QT), is a host value of the step: prefill runs
eagerly (or one graph per token bucket). Decode-only steps use attention_decode.

numpy twin: CpuBackend.attention (gpu/backends/cpu.py).
"""

from __future__ import annotations

import math

from numba import cuda, float32, int32

from gpu.kernels.bf16 import bf16_to_f32, f32_to_bf16
from gpu.kernels.launch import cdiv, threads

KT = 16  # context tokens per tile
KT_PAD = KT + 1
R_MAX = 32  # query rows (token, head) per block
HD_MAX = 128  # head_dim
HD_PAD = HD_MAX + 1  # K and Q rows padded by one float: no shared-memory bank conflicts
ACC = 128  # accumulators per thread: R_MAX * cdiv(HD_MAX, 32) for blocks of >= 32 threads
NEG_INF = float32(-math.inf)

SIGNATURES = {
    "prefill_attention_kernel": [
        "void(float32[:, ::1], uint16[:, :, :, ::1], uint16[:, :, :, ::1], int32[::1],"
        " int32[::1], int32[::1], int32[::1], int64, int64, float64, uint16[:, ::1])"
    ]
}


@cuda.jit(cache=True)
def prefill_attention_kernel(
    qkv,
    k_cache,
    v_cache,
    block_tables,
    block_table_stride,
    query_start_loc,
    seq_lens,
    num_heads,
    q_tile,
    scale,
    out,
):
    q_sh = cuda.shared.array((R_MAX, HD_PAD), float32)
    k_sh = cuda.shared.array((KT, HD_PAD), float32)
    v_sh = cuda.shared.array((KT, HD_MAX), float32)
    s_sh = cuda.shared.array((R_MAX, KT_PAD), float32)
    m_sh = cuda.shared.array(R_MAX, float32)
    l_sh = cuda.shared.array(R_MAX, float32)
    alpha_sh = cuda.shared.array(R_MAX, float32)
    row_token_sh = cuda.shared.array(R_MAX, int32)  # qkv / out row of each query row
    row_col_sh = cuda.shared.array(R_MAX, int32)  # first column of its head
    row_pos_sh = cuda.shared.array(R_MAX, int32)  # its position: the causal limit
    block_sh = cuda.shared.array(KT, int32)
    offset_sh = cuda.shared.array(KT, int32)
    acc = cuda.local.array(ACC, float32)

    b = cuda.blockIdx.x
    kvh = cuda.blockIdx.y
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    block_size = k_cache.shape[1]
    nkv = k_cache.shape[2]
    hd = k_cache.shape[3]
    group = num_heads // nkv
    q_start = query_start_loc[b]
    q_len = query_start_loc[b + 1] - q_start
    j0 = cuda.blockIdx.z * q_tile
    if j0 >= q_len:
        return  # the whole block leaves together: this sequence has fewer query tiles
    nq = min(q_tile, q_len - j0)
    rows = nq * group
    p0 = seq_lens[b] - q_len  # position of query 0 of this sequence's chunk
    kv_end = p0 + j0 + nq  # tokens this tile's last query sees
    table = b * block_table_stride[0]

    # Fixed (row, dimension) ownership, as in attention_decode: no division in the loops.
    if nt >= hd:
        row_step = nt // hd
        lane_r = tid // hd if tid < row_step * hd else R_MAX + KT  # spare threads idle
        lane_d = tid % hd
        d_step = hd
    else:
        row_step = 1
        lane_r = 0
        lane_d = tid
        d_step = nt

    # Row r is query token j0 + r // group, query head kvh * group + r % group.
    for r in range(tid, rows, nt):
        j = r // group
        row_token_sh[r] = q_start + j0 + j
        row_col_sh[r] = (kvh * group + r - j * group) * hd
        row_pos_sh[r] = p0 + j0 + j
        m_sh[r] = NEG_INF
        l_sh[r] = float32(0.0)
    for k in range(ACC):
        acc[k] = float32(0.0)
    cuda.syncthreads()
    for r in range(lane_r, rows, row_step):
        for d in range(lane_d, hd, d_step):
            q_sh[r, d] = qkv[row_token_sh[r], row_col_sh[r] + d] * float32(scale)

    for t0 in range(0, kv_end, KT):
        n = min(KT, kv_end - t0)
        if tid < n:
            pos = t0 + tid
            block_sh[tid] = block_tables[table + pos // block_size]
            offset_sh[tid] = pos % block_size
        cuda.syncthreads()
        for t in range(lane_r, KT, row_step):
            for d in range(lane_d, hd, d_step):
                if t < n:
                    k_sh[t, d] = bf16_to_f32(k_cache[block_sh[t], offset_sh[t], kvh, d])
                    v_sh[t, d] = bf16_to_f32(v_cache[block_sh[t], offset_sh[t], kvh, d])
                else:
                    v_sh[t, d] = float32(0.0)
        cuda.syncthreads()
        for e in range(tid, rows * KT, nt):
            r = e // KT
            t = e - r * KT
            s = NEG_INF
            if t < n and t0 + t <= row_pos_sh[r]:  # causal
                s = float32(0.0)
                for d in range(hd):
                    s += q_sh[r, d] * k_sh[t, d]
            s_sh[r, t] = s
        cuda.syncthreads()
        for r in range(tid, rows, nt):
            m_old = m_sh[r]
            m_new = m_old
            for t in range(n):
                m_new = max(m_new, s_sh[r, t])
            # A row whose keys in this tile are all masked keeps its state (alpha = 1).
            alpha_sh[r] = math.exp(m_old - m_new) if m_new != NEG_INF else float32(1.0)
            m_sh[r] = m_new
        cuda.syncthreads()
        for e in range(tid, rows * KT, nt):
            r = e // KT
            t = e - r * KT
            s = s_sh[r, t]
            s_sh[r, t] = math.exp(s - m_sh[r]) if s != NEG_INF else float32(0.0)
        cuda.syncthreads()
        for r in range(tid, rows, nt):
            total = l_sh[r] * alpha_sh[r]
            for t in range(n):
                total += s_sh[r, t]
            l_sh[r] = total
        k = 0
        for r in range(lane_r, rows, row_step):
            for d in range(lane_d, hd, d_step):
                a = acc[k] * alpha_sh[r]
                for t in range(n):
                    a += s_sh[r, t] * v_sh[t, d]
                acc[k] = a
                k += 1
        cuda.syncthreads()

    k = 0
    for r in range(lane_r, rows, row_step):
        for d in range(lane_d, hd, d_step):
            value = float32(0.0)
            if l_sh[r] > 0:
                value = acc[k] / l_sh[r]
            out[row_token_sh[r], row_col_sh[r] + d] = f32_to_bf16(value)
            k += 1


def query_tile(num_heads: int, num_kv_heads: int) -> int:
    """Query tokens per block: as many as fit R_MAX rows of (token, head)."""
    return max(1, R_MAX // (num_heads // num_kv_heads))


def prefill_attention(
    qkv,
    k_cache,
    v_cache,
    block_tables,
    block_table_stride,
    query_start_loc,
    seq_lens,
    num_seqs: int,
    max_query_len: int,
    num_heads: int,
    scale: float,
    out,
    stream=0,
) -> None:
    """out [T, nh * hd] bf16: causal attention of every query row over its sequence's cache."""
    if num_seqs == 0 or max_query_len == 0:
        return
    nkv, hd = k_cache.shape[2], k_cache.shape[3]
    group = num_heads // nkv
    block = threads(128)
    qt = query_tile(num_heads, nkv)
    if group > R_MAX or hd > HD_MAX or block < 32:
        raise ValueError(f"prefill attention supports group <= {R_MAX}, head_dim <= {HD_MAX}")
    grid = (num_seqs, nkv, cdiv(max_query_len, qt))
    prefill_attention_kernel[grid, block, stream](
        qkv, k_cache, v_cache, block_tables, block_table_stride, query_start_loc, seq_lens,
        num_heads, qt, float(scale), out,
    )  # fmt: skip
