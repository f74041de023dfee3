"""Paged attention for decode: one query token per sequence, over its paged KV cache.

A decode step asks, for every sequence b and query head h: softmax(q . K^T * scale) @ V over
the sequence's whole context, whose K and V live in scattered cache blocks (the block table maps
logical block j of b to a physical block). There is almost no arithmetic per byte (2 * group
FMAs per bf16 of K or V), so the kernel is judged by two numbers: the GB/s of KV it reads at
large batches, and the microseconds of one launch at batch 1, where it is latency-bound.

The kernel, from the top (read it with attention_decode_ffma.py, its plain walk):

* One thread block per (sequence, KV head, split), 128 threads. GQA: the `group` query heads
  that share a KV head are handled together, so each K/V byte is read once and used `group`
  times (Llama-3.2-1B: group 4).
* The walk over the context, online softmax: the FFMA walk (attention_decode_ffma.py: a thread
  group per token, every token slot its own running max, sum and accumulator, no barrier in the
  loop) or, where the shape fits, the tensor-core walk (attention_decode_tc.py: a warp per 16
  tokens, the products on mma.sync). Either leaves partial results per slot (or warp) in shared
  memory, which the block sums with weights 2^(m_slot - M).
* Split-KV (attention_decode_split.py): with few sequences the context is cut into chunks of
  whole tiles so that the GPU fills; the last busy split to finish merges them in the same
  launch. With one busy split the block normalises and writes bf16 itself.
* A warp per head (attention_decode_tc.py): at large batches and short contexts, each warp
  walks one head's whole context and writes it, no merge.
* Compile-time specialisation. The kernel is built by a factory (decode_kernel) for each
  (head_dim, group, block_size): every small loop has a constant trip count, LLVM unrolls it,
  and the per-thread arrays are indexed by constants only, so they live in registers.
* Registers: launch_bounds asks ptxas to fit BLOCKS_PER_SM = 4 blocks of 128 threads on an SM,
  at most 128 registers a thread (the FFMA walk uses 127, the tensor-core walk 112; no spill).

Programmatic dependent launch (pdl.py): seq_lens, query_start_loc and the first tile's block
table entries are staged inputs that no kernel writes, so a block reads them, and an empty split
exits, before grid_dependency_sync; q and the KV cache (written by the kernel before) after it.

All shapes come from device buffers (query_start_loc, seq_lens, the block table and its row
stride in a one-element device array): no host value of the step is baked into the launch but
the number of sequences, so one CUDA graph per batch-size bucket serves every context.

Mixed steps. The kernel also serves the decode rows of a step that carries prompt chunks: a
sequence with more or fewer than one query row this step exits at once, and the prefill kernel
(run with decode_rows=False) takes exactly those, so a decode row in a mixed step keeps its
split-KV instead of walking its whole context in one prefill block.

A sequence with seq_len 0 (graph padding) writes zeros from split 0 and reads nothing.

Measured on the H200 (cold KV, tests/device/bench_kernels.py, tensor-core walk): batch 64 /
context 1,024 in 45.5 us (2.95 TB/s of KV against the 4.25 TB/s copy rate), batch 256 /
context 512 in 79 us with a warp per head, batch 1 ~9 us at any context up to 1,024.

numpy twin: CpuBackend.attention (gpu/backends/cpu.py), with one query row per sequence.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, int32, uint32, uint64

from gpu.kernels import launch, mma
from gpu.kernels.attention_decode_ffma import DIMS, UNROLL, ffma_walk_function
from gpu.kernels.attention_decode_split import (
    MAX_SPLITS,
    MIN_SPLIT_TILES,
    choose_num_splits,
    counter_size,
    merge_splits_function,
    partial_sizes,
)
from gpu.kernels.attention_decode_tc import (
    WARP_HEADS_MAX_CTX,
    WARP_HEADS_MIN_BLOCKS,
    choose_warp_heads_ctx,
    tensor_core_functions,
    tensor_cores_fit,
)
from gpu.kernels.bf16 import f32_to_bf16
from gpu.kernels.launch import SIMULATOR, cdiv, threads
from gpu.kernels.pdl import grid_dependency_sync

__all__ = [
    "DIMS",
    "MAX_SPLITS",
    "UNROLL",
    "WARP_HEADS_MAX_CTX",
    "WARP_HEADS_MIN_BLOCKS",
    "busy_splits",
    "check_shape",
    "choose_num_splits",
    "choose_warp_heads_ctx",
    "counter_size",
    "decode_attention",
    "decode_kernel",
    "partial_sizes",
    "tensor_cores_fit",
    "tile_tokens",
]

MAX_GROUP = 8  # query heads per KV head
BLOCKS_PER_SM = 4  # launch_bounds: blocks an SM must fit (128 threads: 128 registers)
LOG2E = 1.4426950408889634
NEG_INF = float32(-math.inf)
NTHREADS = threads(128)  # per block

_ARGS = (
    "float32[:, ::1], uint64[::1], uint64[::1], int32[::1], int32[::1], int32[::1], int32[::1],"
    " float64, int64, int64, int64, uint16[:, ::1], float32[::1], float32[::1], int32[::1]"
)


def check_shape(head_dim: int, group: int) -> None:
    lanes = head_dim // DIMS
    if head_dim % DIMS or lanes & (lanes - 1) or lanes > 32 or not 1 <= group <= MAX_GROUP:
        raise ValueError(
            f"decode attention supports head_dim = 8 * 2^k <= 256 and group <= {MAX_GROUP},"
            f" not head_dim {head_dim}, group {group}"
        )


def tile_tokens(head_dim: int) -> int:
    """Tokens per iteration of a block (64 at head_dim 64 on the GPU): the granule of a split."""
    return NTHREADS // (head_dim // DIMS) * UNROLL


def decode_kernel(
    head_dim: int, group: int, block_size: int, min_split_tiles: int = 0,
    tensor_cores: bool | None = None,
):  # fmt: skip
    """The decode kernel (split-KV merge included) specialised for (head_dim, group,
    block_size, min_split_tiles; 0: MIN_SPLIT_TILES, tensor_cores; None: the tensor-core walk
    where the shape allows, except in the simulator unless a test runs the GPU code path
    there), built once per configuration."""
    if tensor_cores is None:  # the walk needs warp shuffles, which the bare simulator lacks
        tensor_cores = tensor_cores_fit(head_dim, group) and not SIMULATOR
    if tensor_cores and not tensor_cores_fit(head_dim, group):
        raise ValueError(f"the tensor-core decode needs head_dim 64, group <= 8: {head_dim}")
    return _build(head_dim, group, block_size, min_split_tiles or MIN_SPLIT_TILES, tensor_cores)


@functools.cache
def _build(head_dim: int, group: int, block_size: int, min_split_tiles: int, tensor_cores: bool):
    check_shape(head_dim, group)
    # launch.SIMULATOR, not this module's SIMULATOR: the tests turn the latter off to run the
    # GPU code path in the simulator, which still cannot compile a real kernel.
    simulated = launch.SIMULATOR
    nthreads = NTHREADS
    lanes = head_dim // DIMS  # threads per token (the FFMA walk)
    slots = nthreads // lanes  # its token slots
    tile = tile_tokens(head_dim)  # slots * UNROLL tokens per iteration; splits are whole tiles
    min_chunk = min_split_tiles * tile
    out_dims = group * head_dim
    u_block_size = np.uint64(block_size)
    m_shape = (slots, group)
    acc_shape = (slots, out_dims)
    # The tensor-core walk: a warp takes 16 tokens of each 64-token tile (the simulator's
    # 32-thread block: one warp, 16-token tiles, as tile_tokens says).
    nwarps = nthreads // 32
    nslots = nwarps if tensor_cores else slots  # the partial results merged at the end
    one_block = block_size % 16 == 0  # a warp's 16 tokens lie in one cache block
    fa_shape, fb_shape, fc_shape = mma.scratch_shapes(simulated)
    ffma_walk = ffma_walk_function(head_dim, group, block_size, nthreads, simulated)
    tensor_core_walk, tc_merge_warps, tc_write_head = tensor_core_functions(
        head_dim, group, block_size, nthreads
    )
    merge_splits = merge_splits_function(head_dim, group, nthreads)

    def kernel(
        qkv,
        k_cache,
        v_cache,
        block_tables,
        block_table_stride,
        query_start_loc,
        seq_lens,
        scale,
        num_splits,
        num_kv_heads,
        warp_heads_ctx,
        out,
        part_acc,
        part_ml,
        counters,
    ):
        m_sh = cuda.shared.array(m_shape, float32)
        l_sh = cuda.shared.array(m_shape, float32)
        acc_sh = cuda.shared.array(acc_shape, float32)
        blk = cuda.local.array(UNROLL, int32)
        oacc = cuda.local.array(16, float32)  # the tensor-core walk's output fragment
        fa = cuda.shared.array(fa_shape, uint32)  # the simulator's mma twin
        fb = cuda.shared.array(fb_shape, uint32)
        fc = cuda.shared.array(fc_shape, float32)

        b = cuda.blockIdx.x
        kvh = cuda.blockIdx.y
        split = cuda.blockIdx.z
        tid = cuda.threadIdx.x
        slot = tid // lanes
        # Three independent loads issued together (they are a dependent round trip each when
        # read where first needed, behind the branch on ctx).
        ctx = seq_lens[b]
        row = query_start_loc[b]
        rows = query_start_loc[b + 1] - row
        table = uint64(b * block_table_stride[0])
        if rows != 1:
            return  # a prompt chunk of a mixed step (or no row): the prefill kernel's
        # This split's share of the context: whole tiles, the last splits short or empty.
        # `busy` splits hold tokens (one for a padding row, ctx 0); the others exit at once.
        chunk = (ctx + num_splits - 1) // num_splits
        chunk = max((chunk + tile - 1) // tile * tile, min_chunk)
        busy = 1
        if ctx > 0:
            busy = (ctx + chunk - 1) // chunk
        if split >= busy:
            return  # an empty split: no more loads, no write, no counter
        start = split * chunk
        end = min(ctx, start + chunk)
        # A warp per head (see choose_warp_heads_ctx): block kvh walks heads nwarps * kvh ..
        # nwarps * kvh + nwarps - 1, one warp each, the whole context; the blocks past the
        # last head have nothing to do. The blocks that work come first in the grid's order
        # (blockIdx.x, the sequence, runs fastest): the longest-lived blocks start first.
        warp_heads = tensor_cores and 0 < ctx <= warp_heads_ctx and num_splits == 1
        if warp_heads and kvh * nwarps >= num_kv_heads:
            return
        # The physical block of each of this lane's tokens of the first tile. Token indices are
        # clamped to the last one (its row is read again, its score masked), so the loads need
        # no branch and are all issued back to back. Like seq_lens, the block table is a staged
        # input no kernel writes, so it is read before the wait for the previous kernel (pdl.py)
        last = end - 1
        if ctx > 0 and not tensor_cores:
            for u in range(UNROLL):
                t = uint64(min(start + u * slots + slot, last))
                blk[u] = block_tables[table + t // u_block_size]
        first = start  # the first of the warp's 16 tokens
        step = 16  # and the distance to its next 16
        if tensor_cores and not warp_heads:
            first = start + 16 * (tid // 32)
            step = tile
        if ctx > 0 and tensor_cores and one_block:
            blk[0] = block_tables[table + uint64(min(first, last)) // u_block_size]
        grid_dependency_sync()
        if ctx == 0:  # a padding row of a captured graph: zeros, nothing read
            for o in range(tid, out_dims, nthreads):
                out[row, kvh * out_dims + o] = f32_to_bf16(float32(0.0))
            return

        qscale = float32(scale * LOG2E)
        if tensor_cores:
            head_kv = kvh
            if warp_heads:
                head_kv = kvh * nwarps + tid // 32
                if head_kv >= num_kv_heads:
                    return  # a warp past the last KV head (their count is not a multiple)
            m, lpart = tensor_core_walk(
                qkv, k_cache, v_cache, block_tables, table, row, head_kv, first, end, step,
                qscale, num_kv_heads, oacc, fa, fb, fc, blk,
            )  # fmt: skip
            if warp_heads:
                tc_write_head(m, lpart, oacc, out, row, head_kv)
                return
            tc_merge_warps(m, lpart, oacc, m_sh, l_sh, acc_sh)
        else:
            ffma_walk(
                qkv, k_cache, v_cache, block_tables, table, row, kvh, start, end, qscale,
                num_kv_heads, m_sh, l_sh, acc_sh, blk,
            )  # fmt: skip
        num_heads = num_kv_heads * group
        for o in range(tid, out_dims, nthreads):
            h = o // head_dim
            d = o - h * head_dim
            total = float32(0.0)
            lsum = float32(0.0)
            top = NEG_INF
            for k in range(nslots):
                total += acc_sh[k, o]
                lsum += l_sh[k, h]
                top = max(top, m_sh[k, h])
            head = kvh * group + h
            if busy == 1:  # the whole context in this block: normalise, done
                value = float32(0.0)
                if lsum > 0:
                    value = total / lsum
                out[row, head * head_dim + d] = f32_to_bf16(value)
            else:
                idx = (b * num_heads + head) * num_splits + split
                part_acc[idx * head_dim + d] = total
                if d == 0:
                    part_ml[2 * idx] = top
                    part_ml[2 * idx + 1] = lsum
        if busy > 1:
            merge_splits(
                b, kvh, busy, num_splits, num_kv_heads, row, out, part_acc, part_ml, counters
            )

    if simulated:
        return cuda.jit(cache=True)(kernel)
    # At most 65536 / (128 * BLOCKS_PER_SM) registers a thread.
    return cuda.jit(cache=True, launch_bounds=(nthreads, BLOCKS_PER_SM))(kernel)


# The specialisations of the preset models (Llama-3.2-1B: head_dim 64, group 4; SmolLM2-135M:
# 64, 3), by name, for the sm_90 compile test; any other shape is built on first use.
decode_kernel_llama32 = decode_kernel(64, 4, 16, tensor_cores=False)
decode_kernel_smollm2 = decode_kernel(64, 3, 16, tensor_cores=False)
decode_kernel_llama32_tc = decode_kernel(64, 4, 16, tensor_cores=True)
SIGNATURES = {
    "decode_kernel_llama32": [f"void({_ARGS})"],
    "decode_kernel_smollm2": [f"void({_ARGS})"],
    "decode_kernel_llama32_tc": [f"void({_ARGS})"],
}


def busy_splits(seq_len: int, num_splits: int, head_dim: int, min_split_tiles: int = 0) -> int:
    """Host twin of the kernel's `busy`: the splits that hold tokens of a seq_len context (1 for
    seq_len 0, whose split 0 writes the zeros); the others exit at once."""
    tile = tile_tokens(head_dim)
    chunk = max(cdiv(cdiv(seq_len, num_splits), tile), min_split_tiles or MIN_SPLIT_TILES) * tile
    return cdiv(seq_len, chunk) if seq_len else 1


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
    *,
    counters=None,
    min_split_tiles: int = 0,
    tensor_cores: bool | None = None,
    warp_heads_ctx: int = 0,
) -> None:
    """out [T, nh * hd] bf16: attention of the query row of each of num_seqs sequences that
    has exactly one this step (the others are left to prefill_attention).

    k_cache / v_cache: [blocks, block_size, nkv, hd] bf16 bits (uint16). part_acc / part_ml:
    float32 scratch of at least partial_sizes(...) elements; counters: int32 of at least
    counter_size(...) elements, ZERO when first used (the kernel leaves it zero again, so the
    same array serves every later launch and graph replay). All three may be any array of their
    dtype when num_splits is 1. min_split_tiles: the smallest busy split (0: MIN_SPLIT_TILES).
    tensor_cores: the mma walk (None: TENSOR_CORES where the shape fits). warp_heads_ctx: a
    warp per (sequence, KV head) for contexts up to this long, with the tensor-core walk and
    one split (choose_warp_heads_ctx; 0: never).
    """
    if num_seqs == 0:
        return
    block_size, nkv, hd = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    group = num_heads // nkv
    check_shape(hd, group)
    if not 1 <= num_splits <= MAX_SPLITS:
        raise ValueError(f"num_splits must be in 1..{MAX_SPLITS}, not {num_splits}")
    if counters is None:
        if num_splits > 1:
            raise ValueError("a split launch needs counters: zeroed int32, counter_size(...)")
        counters = seq_lens  # any int32 array: a one-split launch never counts
    # Four bf16 per 8-byte load: the same bytes, viewed as flat uint64 words (no copy).
    k64, v64 = k_cache.view(np.uint64).reshape(-1), v_cache.view(np.uint64).reshape(-1)
    kernel = decode_kernel(hd, group, block_size, min_split_tiles, tensor_cores)
    kernel[(num_seqs, nkv, num_splits), NTHREADS, stream](
        qkv, k64, v64, block_tables, block_table_stride, query_start_loc, seq_lens,
        float(scale), num_splits, nkv, warp_heads_ctx, out, part_acc, part_ml, counters,
    )  # fmt: skip
