"""Attention for prefill chunks (and mixed batches): many query tokens per sequence over the
paged cache, causal, flash-attention style (tiles in shared memory, register tiles of scores,
online softmax, P @ V accumulated in registers).

What it computes. Sequence b owns query rows [qsl[b], qsl[b+1]) of this step; they are the last
q_len tokens of its context of seq_lens[b] tokens, so query j sits at position p0 + j with
p0 = seq_len - q_len (p0 > 0 when the chunk starts mid-sequence: an earlier chunk or a cached
prefix is already in the cache, and rope_kv has just written this chunk's K and V behind it).
Query j attends to context positions 0..p0 + j. A sequence with 0 rows has nothing to do; one
with 1 row is a decode row riding in a prefill step.

The design (a GEMM-shaped kernel, flash-attention v2 without tensor cores):

* One thread block per (query tile, KV head, sequence). A query tile is BQ consecutive query
  tokens times the `group` query heads that share the KV head (GQA): ROWS = BQ * group query
  rows (rounded up to the tile; the spare rows idle). Llama-3.2-1B: 16 tokens x 4 heads = 64.
  The tile shapes are in attention_prefill_tiles.py.
* The block walks the context in KV tiles of BK tokens, only up to its last query's position:
  tiles beyond the diagonal are never touched, and only the tiles that cross it pay for the
  mask. Each KV tile is gathered through the block table into shared memory, converted from
  bf16 once, four values per 64-bit load (the caches are read through a uint64 view).
* The gather: a thread owns one 8-byte word index of evenly spaced rows (128 registers, no
  spill; per-word indexing took 168), clamps positions past the last key instead of branching,
  issues all of a tile's loads at once and reads the block table a tile ahead (a chat's new
  turn, 48 rows over 530 cached tokens: 108 -> 73 us a layer on the H200).
* Threads form a NTY x NTX grid (NTX = BK / TN lanes of a warp share rows). Thread (ty, tx)
  owns TM rows (ty + i * NTY) and, of each KV tile, TN keys (tx + j * NTX): it computes a TM x TN
  register tile of S = Q K^T out of shared memory, reading 4 dimensions of each of its rows and
  keys with one 128-bit load: (TM + TN) / 4 loads per TM * TN FMAs. The row max of a tile is a
  3-step xor shuffle among the NTX lanes of the row; the row sum is kept per thread and reduced
  once, at the very end.
* Online softmax per row (running max m, sum l): P = exp(S - m_new) goes to shared memory, and
  the same thread owns the same TM rows of O = P V in registers (TM x HD/NTX of them), so the
  rescale by exp(m_old - m_new) needs no barrier: two barriers per KV tile in all.
* Every loop bound is a constant of a specialised kernel (`_build`, a closure per shape and
  tile configuration), so the register tiles are registers, not local memory.
* Two specialisations over the same grid of sequences: a "narrow" one (ROWS = 16, BQ =
  16 / group: 4 tokens at Llama-3.2-1B shapes) for the sequences with at most NARROW_TOKENS =
  128 rows this step, and the "wide" one for the others; a block of the wrong kind exits at
  once. Short chunks over a long history would get few wide blocks (3 query tiles x 8 KV heads
  = 24 blocks for 132 SMs), each walking the whole history serially; narrow tiles give 4x the
  blocks, each doing a quarter of the work per key (the 48-row turn 73 -> 49 us a layer, a
  128-row one 79 -> 69), and their launch may split each tile's keys (split-KV,
  attention_prefill_split.py). Long chunks keep the wide tiles, which read each K/V tile once
  per 16 query tokens instead of 4.
* Heaviest first: the last query tiles of a sequence see the most context, so blockIdx.x counts
  tiles from the end and the long blocks start in the first wave.

At Llama-3.2-1B shapes (wide tiles, 4 blocks an SM: BLOCKS_PER_SM) a warp does 2,048 FMAs per
KV tile against 224 shared loads, so shared memory does not bound it; ~600 other instructions
and two barriers share the issue slots. Measured on the H200 (tests/device/bench_prefill.py):
a 1,024-token chunk over a 3,024-token context in 0.86 ms (24.5 TFLOP/s of the ~60 the chip does
in fp32), 2,048 x 2,048 causal in 0.82 ms.

The grid's query-tile count, cdiv(max_query_len, BQ), is a host value of the step (one graph
per token bucket). In the CUDA simulator (no warp shuffles) the row reductions go through a
small shared array with barriers, and the tiles are smaller (one warp).

numpy twin: CpuBackend.attention (gpu/backends/cpu.py).
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
from numba import cuda, float32, int32, uint64

from gpu.kernels import launch
from gpu.kernels.attention_prefill_split import (
    SPLITS,
    merge_kernel,
    split_range_function,
    split_sizes,
)
from gpu.kernels.attention_prefill_tiles import Tiles, choose_tiles
from gpu.kernels.bf16 import bf16_of_word, f32_to_bf16
from gpu.kernels.launch import SIMULATOR, cdiv, device_function, threads
from gpu.kernels.pdl import grid_dependency_sync

NEG_INF = float32(-math.inf)
# Sequences with at most this many query rows in a step take the narrow tiles (at least the
# narrow kernel's BQ do, whatever the setting).
NARROW_TOKENS = 128
# launch_bounds: blocks an SM must fit, 4 = 128 registers a thread
BLOCKS_PER_SM = 4
# The narrow launch covers cdiv(NARROW_TOKENS, BQ) query tiles of every sequence, most of them
# empty (they exit at once); past this many blocks (a step of many sequences) it falls back to
# the decode-row width.
MAX_NARROW_BLOCKS = 4096
FULL_MASK = 0xFFFFFFFF


# --- row reductions among the NTX lanes that share a row -------------------------------------

if SIMULATOR:

    @device_function
    def lanes_max(value, scratch, row, lane, width):
        """The max of `value` over the `width` lanes of the row (simulator: shared memory)."""
        scratch[row, lane] = value
        cuda.syncthreads()
        best = scratch[row, 0]
        for k in range(1, width):
            best = max(best, scratch[row, k])
        cuda.syncthreads()
        return best

    @device_function
    def lanes_sum(value, scratch, row, lane, width):
        scratch[row, lane] = value
        cuda.syncthreads()
        total = float32(0.0)
        for k in range(width):
            total += scratch[row, k]
        cuda.syncthreads()
        return total

else:

    @device_function
    def lanes_max(value, scratch, row, lane, width):
        """The max of `value` over the `width` (a power of two) consecutive lanes of the row:
        an xor butterfly, no shared memory, no barrier. Every lane of the warp calls it."""
        offset = width // 2
        while offset > 0:
            value = max(value, cuda.shfl_xor_sync(FULL_MASK, value, offset))
            offset //= 2
        return value

    @device_function
    def lanes_sum(value, scratch, row, lane, width):
        offset = width // 2
        while offset > 0:
            value += cuda.shfl_xor_sync(FULL_MASK, value, offset)
            offset //= 2
        return value


# --- the kernel factory ----------------------------------------------------------------------


def _build(
    head_dim: int,
    group: int,
    block_size: int,
    tiles: Tiles,
    simulator: bool = SIMULATOR,
    splits: int = 1,
):
    """The kernel specialised for one shape and tile configuration (all loop bounds constant).

    Shared-memory loops index with unsigned integers (Numba adds a negative-index check to every
    signed index) and read 4 consecutive floats from 16-byte aligned rows, which the compiler
    turns into one 128-bit load: Q and K rows are padded to head_dim + 4 floats, P rows to
    BK + max(NTX, 4), so the lanes of a warp still hit different banks."""
    hd = head_dim
    hq = hd // 4  # 8-byte words (four bf16) per K/V row
    tpp = tiles.threads // hq  # tokens gathered per pass of the block
    per_thread = cdiv(tiles.bk, tpp)  # the gather's loads per thread, of K and of V
    ragged = per_thread * tpp != tiles.bk  # some threads have one word fewer
    rows, bk, tm, tn = tiles.rows, tiles.bk, tiles.tm, tiles.tn
    nty, ntx, nthreads = tiles.nty, tiles.ntx, tiles.threads
    dpt = hd // ntx  # output dimensions per thread, in groups of 4: (tx + c4 * NTX) * 4 + w
    dpt4 = dpt // 4
    bq = tiles.query_tokens(group)
    hd4 = hd + 4
    p_stride = bk + max(ntx, 4)
    red_rows, red_cols = (rows, ntx) if simulator else (1, 1)
    align = None if simulator else 16  # the simulator takes no alignment
    u4, u_nty, u_ntx = np.uint64(4), np.uint64(nty), np.uint64(ntx)
    u_hd4, u_bk4 = np.uint64(hd // 4), np.uint64(bk // 4)
    u_block_size = np.uint64(block_size)

    # The gather of a K/V tile. Thread `tid` owns 8-byte word w = tid % hq of the tokens
    # tq + g * tpp (tq = tid // hq): one word index and evenly spaced rows, so the loop-invariant
    # addressing is two values, not two per word. Positions past the block's last key are
    # clamped to it (a valid slot, masked like every key past the diagonal), so every load is
    # unconditional and a tile's loads are all in flight together; the physical blocks are
    # looked up a tile ahead. The cache is flat uint64 words, indexed in unsigned 64-bit
    # arithmetic with the build's constants (as in attention_decode.py: Numba's signed indexing
    # cost a negative-index wrap, floor division and run-time-stride products per load).

    split_range = split_range_function(bk, splits)

    @device_function
    def lookup_blocks(block_tables, table, base, last, bt, tq):
        """bt[g]: the physical block of row g's token in the tile starting at `base`."""
        for g in range(per_thread):
            bt[g] = block_tables[table + uint64(min(base + tq + g * tpp, last)) // u_block_size]

    @device_function
    def load_words(k_words, v_words, row_words, head_words, base, last, bt, kg, vg, tq):
        """Issue the loads of the tile starting at `base` (its blocks in bt) into kg, vg: word
        (block * block_size + offset) * row_words + head_words of the flat caches."""
        for g in range(per_thread):
            t = tq + g * tpp
            if not ragged or t < bk:
                off = uint64(min(base + t, last)) % u_block_size
                word = (uint64(bt[g]) * u_block_size + off) * row_words + head_words
                kg[g] = k_words[word]
                vg[g] = v_words[word]

    def kernel(
        qkv,
        k_words,
        v_words,
        block_tables,
        block_table_stride,
        query_start_loc,
        seq_lens,
        scale,
        num_kv_heads,
        q_min,
        q_max,
        out,
        part_o,
        part_ml,
    ):
        q_sh = cuda.shared.array((rows, hd4), float32, alignment=align)
        k_sh = cuda.shared.array((bk, hd4), float32, alignment=align)
        v_sh = cuda.shared.array((bk, hd), float32, alignment=align)
        p_sh = cuda.shared.array((rows, p_stride), float32, alignment=align)
        scratch = cuda.shared.array((red_rows, red_cols), float32)
        s = cuda.local.array((tm, tn), float32)
        o = cuda.local.array((tm, dpt), float32)
        m = cuda.local.array(tm, float32)
        ell = cuda.local.array(tm, float32)
        rpos = cuda.local.array(tm, int32)
        qa = cuda.local.array((tm, 4), float32)
        kb = cuda.local.array((tn, 4), float32)
        vb = cuda.local.array((dpt4, 4), float32)
        kg = cuda.local.array(per_thread, uint64)  # the gather's words in flight
        vg = cuda.local.array(per_thread, uint64)
        bt = cuda.local.array(per_thread, int32)  # their physical blocks, one tile ahead

        tid = cuda.threadIdx.x
        tx = tid % ntx
        ty = tid // ntx
        utx = uint64(tx)
        uty = uint64(ty)
        kvh = cuda.blockIdx.y // splits
        split = cuda.blockIdx.y - kvh * splits
        b = cuda.blockIdx.z
        q_start = query_start_loc[b]
        q_len = query_start_loc[b + 1] - q_start
        if q_len < q_min or q_len > q_max:
            return  # the other specialisation's sequence (or no rows at all)
        j0 = (cuda.gridDim.x - 1 - cuda.blockIdx.x) * bq  # the last tiles (most work) first
        if j0 >= q_len:
            return  # the whole block leaves together: this sequence has fewer query tiles
        nq = min(bq, q_len - j0)
        p0 = seq_lens[b] - q_len  # position of query 0 of the chunk
        first_pos = p0 + j0
        kv_end = first_pos + nq  # tokens this tile's last query sees
        table = uint64(b * block_table_stride[0])
        # Split-KV: this block walks keys [ks, ke), whole KV tiles, of the tile's kv_end.
        ks, ke, busy = 0, kv_end, 1
        if splits > 1:
            ks, ke, busy = split_range(kv_end, split)
            if split >= busy:
                return  # an empty split: no loads, no write

        # Everything above read only the step's staged inputs; q and the KV cache come from the
        # kernels before this one (pdl.py).
        grid_dependency_sync()
        if kv_end <= 0:  # a padding row of a captured decode graph (no context): zeros
            for e in range(tid, nq * group * hd, nthreads):
                j = e // (group * hd)
                col = kvh * group * hd + e - j * group * hd
                out[q_start + j0 + j, col] = f32_to_bf16(float32(0.0))
            return
        # Q tile, scaled: row r is query token j0 + r // group, head kvh * group + r % group.
        for e in range(tid, rows * hd, nthreads):
            r = e // hd
            d = e - r * hd
            j = r // group
            value = float32(0.0)
            if j < nq:
                col = (kvh * group + r - j * group) * hd + d
                value = qkv[q_start + j0 + j, col] * scale
            q_sh[r, d] = value
        for i in range(tm):
            j = (ty + i * nty) // group
            rpos[i] = first_pos + min(j, nq - 1)  # spare rows copy the last real one
            m[i] = NEG_INF
            ell[i] = float32(0.0)
            for c in range(dpt):
                o[i, c] = float32(0.0)

        last = ke - 1
        tq = tid // hq
        wq = tid - tq * hq
        uw4 = uint64(wq) * u4
        row_words = uint64(num_kv_heads) * u_hd4
        head_words = uint64(kvh) * u_hd4 + uint64(wq)
        lookup_blocks(block_tables, table, ks, last, bt, tq)

        for t0 in range(ks, ke, bk):
            load_words(k_words, v_words, row_words, head_words, t0, last, bt, kg, vg, tq)
            lookup_blocks(block_tables, table, t0 + bk, last, bt, tq)
            # This tile's words into shared memory, as fp32 (bf16 u of word w is dimension
            # 4w + u).
            for g in range(per_thread):
                t = tq + g * tpp
                if not ragged or t < bk:
                    for u in range(4):
                        k_sh[uint64(t), uw4 + uint64(u)] = bf16_of_word(kg[g], u)
                        v_sh[uint64(t), uw4 + uint64(u)] = bf16_of_word(vg[g], u)
            cuda.syncthreads()

            # S = Q K^T, a TM x TN register tile per thread, 4 dimensions per step.
            for i in range(tm):
                for c in range(tn):
                    s[i, c] = float32(0.0)
            for d4 in range(u_hd4):
                d0 = d4 * u4
                for i in range(tm):
                    row = uty + uint64(i) * u_nty
                    for u in range(4):
                        qa[i, u] = q_sh[row, d0 + uint64(u)]
                for c in range(tn):
                    key = utx + uint64(c) * u_ntx
                    for u in range(4):
                        kb[c, u] = k_sh[key, d0 + uint64(u)]
                for u in range(4):
                    for i in range(tm):
                        for c in range(tn):
                            s[i, c] += qa[i, u] * kb[c, u]

            # Online softmax; only tiles that cross the diagonal pay for the mask.
            masked = t0 + bk - 1 > first_pos
            for i in range(tm):
                row = ty + i * nty
                top = NEG_INF
                for c in range(tn):
                    if masked and t0 + tx + c * ntx > rpos[i]:
                        s[i, c] = NEG_INF
                    top = max(top, s[i, c])
                top = lanes_max(top, scratch, row, tx, ntx)
                m_new = max(m[i], top)  # finite in split 0: key 0 is in every row's first tile
                base = m_new
                if splits > 1 and m_new == NEG_INF:
                    base = float32(0.0)  # a later split, all of this row's keys masked so far
                alpha = math.exp(m[i] - base)
                m[i] = m_new
                total = float32(0.0)
                for c in range(tn):
                    p = math.exp(s[i, c] - base)
                    p_sh[row, tx + c * ntx] = p
                    total += p
                ell[i] = ell[i] * alpha + total  # this lane's share of the row sum
                for c in range(dpt):
                    o[i, c] *= alpha
            cuda.syncthreads()

            # O += P V: the same TM rows, 4 keys per step.
            for k4 in range(u_bk4):
                k0 = k4 * u4
                for i in range(tm):
                    row = uty + uint64(i) * u_nty
                    for u in range(4):
                        qa[i, u] = p_sh[row, k0 + uint64(u)]  # qa holds P here
                for u in range(4):
                    for c4 in range(dpt4):
                        col = (utx + uint64(c4) * u_ntx) * u4
                        for w in range(4):
                            vb[c4, w] = v_sh[k0 + uint64(u), col + uint64(w)]
                    for i in range(tm):
                        for c4 in range(dpt4):
                            for w in range(4):
                                o[i, c4 * 4 + w] += qa[i, u] * vb[c4, w]
            cuda.syncthreads()  # the next tile overwrites K, V and P

        for i in range(tm):
            row = ty + i * nty
            total = lanes_sum(ell[i], scratch, row, tx, ntx)
            j = row // group
            if j < nq:
                inv = float32(1.0)
                if busy == 1:  # (a split's row may have seen no key yet: total 0)
                    inv = float32(1.0) / total
                token = q_start + j0 + j
                head = kvh * group + row - j * group
                idx = (token * (num_kv_heads * group) + head) * splits + split
                for c4 in range(dpt4):
                    for w in range(4):
                        dim = (tx + c4 * ntx) * 4 + w
                        if busy == 1:
                            out[token, head * hd + dim] = f32_to_bf16(o[i, c4 * 4 + w] * inv)
                        else:  # unnormalised, with (m, l): prefill_merge_kernel's
                            part_o[idx * hd + dim] = o[i, c4 * 4 + w]
                if busy > 1 and tx == 0:
                    part_ml[2 * idx] = m[i]
                    part_ml[2 * idx + 1] = total

    # A name that says which specialisation a profiler is showing.
    kernel.__name__ = f"prefill_attention_hd{hd}_g{group}_r{rows}_k{bk}_t{tm}x{tn}"
    kernel.__name__ += f"_split{splits}" if splits > 1 else ""
    if launch.SIMULATOR:  # (not `simulator`: the GPU's shapes are built there for tests)
        return cuda.jit(cache=True)(kernel)
    return cuda.jit(cache=True, launch_bounds=(nthreads, BLOCKS_PER_SM))(kernel)


@cache
def get_kernel(head_dim: int, group: int, block_size: int, tiles: Tiles, splits: int = 1):
    return _build(head_dim, group, block_size, tiles, splits=splits)


# Representative specialisations, for tests/test_kernels_compile.py (sm_90, no GPU):
# Llama-3.2-1B (head_dim 64, group 4), wide and narrow, and SmolLM2-135M (group 3).
_LLAMA_WIDE, _LLAMA_NARROW = choose_tiles(64, 4, simulator=False)
prefill_attention_kernel = _build(64, 4, 16, _LLAMA_WIDE, simulator=False)
prefill_attention_narrow_kernel = _build(64, 4, 16, _LLAMA_NARROW, simulator=False)
prefill_attention_narrow_split_kernel = _build(64, 4, 16, _LLAMA_NARROW, False, splits=SPLITS)
prefill_attention_group3_kernel = _build(64, 3, 16, choose_tiles(64, 3, False)[0], False)
# The tests' tiny models: head_dim 16, block size 4 (4 lanes a row).
prefill_attention_hd16_kernel = _build(16, 2, 4, choose_tiles(16, 2, False)[0], False)
prefill_attention_hd16_narrow_kernel = _build(16, 2, 4, choose_tiles(16, 2, False)[1], False)
_SIG = (
    "void(float32[:, ::1], uint64[::1], uint64[::1], int32[::1], int32[::1], int32[::1],"
    " int32[::1], float32, int64, int64, int64, uint16[:, ::1], float32[::1], float32[::1])"
)
SIGNATURES = {
    "prefill_attention_kernel": [_SIG],
    "prefill_attention_narrow_kernel": [_SIG],
    "prefill_attention_narrow_split_kernel": [_SIG],
    "prefill_attention_group3_kernel": [_SIG],
    "prefill_attention_hd16_kernel": [_SIG],
    "prefill_attention_hd16_narrow_kernel": [_SIG],
}


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
    tiles: tuple[Tiles, Tiles] | None = None,
    decode_rows: bool = True,
    narrow_tokens: int | None = None,
    part_o=None,
    part_ml=None,
    splits: int | None = None,
    invariant: bool = False,
) -> None:
    """out [T, nh * hd] bf16: causal attention of every query row over its sequence's cache.

    tiles: (wide, narrow) configurations, choose_tiles' by default (tests and benchmarks pass
    others). decode_rows False: sequences with a single row this step are skipped (the cuda
    backend runs them through attention_decode's split-KV kernel). narrow_tokens: sequences
    with at most this many rows take the narrow tiles (NARROW_TOKENS by default).

    part_o / part_ml: float32 scratch of at least split_sizes(T, nh, hd, splits) elements: with
    them the narrow launch splits each query tile's keys `splits` ways (SPLITS by default) and a
    merge launch combines them; without (or too small for T rows), it does not split.

    invariant: every sequence's rows, decode rows included (decode_rows is then ignored), take
    the wide tiles, unsplit, in one launch. A row's arithmetic then depends on its position and
    its context only: its KV tiles start at position 0 whatever its chunk, and the tiles past
    its own position are masked whole (exp of -inf: they add exactly nothing). That is the
    batch-invariant mode's attention (gpu/backends/cuda/batch_invariant.py)."""
    if num_seqs == 0 or max_query_len == 0:
        return
    block_size, nkv, hd = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    group = num_heads // nkv
    wide, narrow = tiles if tiles is not None else choose_tiles(hd, group)
    for t in (wide, narrow):
        if not t.fits(hd, group):
            raise ValueError(f"prefill attention: {t} does not fit head_dim {hd}, group {group}")
    k_words = k_cache.view(np.uint64).reshape(-1)  # flat 8-byte words, no copy
    v_words = v_cache.view(np.uint64).reshape(-1)
    args = (
        qkv, k_words, v_words, block_tables, block_table_stride, query_start_loc, seq_lens,
        np.float32(scale), nkv,
    )  # fmt: skip
    if part_o is None or part_ml is None:  # (tests, benchmarks) no scratch: no split
        part_o = part_ml = cuda.device_array(1, np.float32, stream=stream)
    if invariant:
        kernel = get_kernel(hd, group, block_size, wide)
        grid = (cdiv(max_query_len, wide.query_tokens(group)), nkv, num_seqs)
        kernel[grid, wide.threads, stream](*args, 1, max_query_len, out, part_o, part_ml)
        return
    # Sequences with at most `small` rows go narrow.
    bq_narrow = narrow.query_tokens(group)
    small = NARROW_TOKENS if narrow_tokens is None else narrow_tokens
    small = min(small, max_query_len)
    if cdiv(small, bq_narrow) * nkv * num_seqs > MAX_NARROW_BLOCKS:
        small = bq_narrow
    small = max(small, bq_narrow)
    if max_query_len > small:
        kernel = get_kernel(hd, group, block_size, wide)
        grid = (cdiv(max_query_len, wide.query_tokens(group)), nkv, num_seqs)
        kernel[grid, wide.threads, stream](*args, small + 1, max_query_len, out, part_o, part_ml)
    # Always, even for one sequence: max_query_len may be a bound (a graph bucket's token
    # count), so a sequence of few rows can hide behind it; if none has few, these blocks exit.
    tiles_x = cdiv(min(max_query_len, small), bq_narrow)
    n_split = SPLITS if splits is None else splits
    o_size, ml_size = split_sizes(out.shape[0], num_heads, hd, n_split)
    if part_o.shape[0] < o_size or part_ml.shape[0] < ml_size:
        n_split = 1
    q_min = 1 if decode_rows else 2
    kernel = get_kernel(hd, group, block_size, narrow, n_split)
    kernel[(tiles_x, nkv * n_split, num_seqs), narrow.threads, stream](
        *args, q_min, small, out, part_o, part_ml
    )
    if n_split > 1:
        merge = merge_kernel(hd, group, bq_narrow, narrow.bk, n_split)
        merge[(tiles_x, nkv, num_seqs), threads(128), stream](
            query_start_loc, seq_lens, q_min, small, part_o, part_ml, out
        )
