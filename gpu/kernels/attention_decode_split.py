"""Split-KV for paged decode attention, with the merge in the same launch (flash-decoding).

With few sequences, (sequences x KV heads) blocks would leave most of the GPU's SMs idle (batch
1 of Llama-3.2-1B is 8 blocks for 132 SMs). So the context is cut into `num_splits` chunks,
whole tiles each, computed on the device from seq_lens. num_splits depends only on the batch
size (choose_num_splits: about SPLIT_BLOCKS_PER_SM = 4 blocks per SM, at most MAX_SPLITS = 32),
so a captured graph per batch-size bucket stays valid for any context. A short context therefore
leaves the last splits empty rather than making tiny ones: every block computes the number of
busy splits from seq_lens, and an empty split returns before any K or V load, writes nothing and
is not counted, so surplus splits cost only their scheduling.

A busy split is at least MIN_SPLIT_TILES = 2 tiles: a block walking a second tile is cheaper
than the merge's fence, counter and re-read. Measured on the H200 (cold KV,
tests/device/bench_kernels.py), 1 -> 2 -> 4 tiles: batch 1 context 128 15.3 -> 11.3 -> 10.9
us, context 1,024 21.5 -> 19.8 -> 22.2, context 4,096 31.8 -> 31.5 -> 27.6; end to end with
one tile, batch 1 was 975 against 1,034 tok/s (Llama-3.2-1B).

The merge runs in the same kernel ("last block done", the CUDA threadFenceReduction sample):
each busy split writes its unnormalised accumulator and (m, l) (m in log2 units) to part_acc /
part_ml, fences, and thread 0 adds 1 to the int32 counter of its (sequence, KV head). The block
that saw busy - 1 others there resets the counter to 0 (the next launch, or graph replay, finds
it zero without a memset) and merges: out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s
over s = 0, 1, ... busy - 1 in that order whichever block is last, so the result is
deterministic. This saves a second launch (~1.3 us of graph replay and a dependent kernel
boundary) and a reduce kernel re-reading the partials behind a full grid drain. Batch 1 stays a
chain of dependent round trips (seq_lens, the block table, K / V, the fence and counter, the
merge's reads): ~9-10 us a layer whatever the context. The partials and the counters (one per
sequence x KV head, zeroed once when allocated) belong to the caller: CudaBackend owns them.

The simulator runs blocks one after another and supports cuda.atomic.add (threadfence is a
no-op there), so the counting runs, but the memory ordering is only exercised on a GPU.
"""

from __future__ import annotations

import math

from numba import cuda, float32, int32

from gpu.kernels.bf16 import f32_to_bf16
from gpu.kernels.launch import cdiv, device_function

MAX_SPLITS = 32
SPLIT_BLOCKS_PER_SM = 4  # choose_num_splits aims at this many busy blocks per SM
MIN_SPLIT_TILES = 2  # the smallest busy split, in tiles
NEG_INF = float32(-math.inf)


def merge_splits_function(head_dim: int, group: int, nthreads: int):
    """The device function merge_splits(...) for one shape: called by every busy split of a
    sequence that has several, after it wrote its partials; the last one to finish merges."""
    out_dims = group * head_dim

    @device_function
    def merge_splits(b, kvh, busy, num_splits, num_kv_heads, row, out, part_acc, part_ml, counters):
        """Last block done: the busy splits of (b, kvh) count themselves in; the one that finds
        busy - 1 others there merges them all. Release: every thread's partials are visible
        GPU-wide before the count; acquire: thread 0 fences after it, the barrier passes it on."""
        last_sh = cuda.shared.array(1, int32)
        ms = cuda.local.array(MAX_SPLITS, float32)
        tid = cuda.threadIdx.x
        num_heads = num_kv_heads * group
        cuda.threadfence()
        cuda.syncthreads()
        if tid == 0:
            counter = b * num_kv_heads + kvh
            seen = cuda.atomic.add(counters, counter, int32(1))
            cuda.threadfence()
            last_sh[0] = int32(0)
            if seen == busy - 1:
                last_sh[0] = int32(1)
                counters[counter] = int32(0)  # every busy split has counted: ready for the next
        cuda.syncthreads()
        if last_sh[0] == 0:
            return
        # out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s, splits in order 0, 1, ...: the
        # same sums whichever block is last. Constant trip counts (MAX_SPLITS, guarded): every
        # load of a loop is issued before the first is used.
        for o in range(tid, out_dims, nthreads):
            h = o // head_dim
            d = o - h * head_dim
            head = kvh * group + h
            base = (b * num_heads + head) * num_splits
            top = NEG_INF
            for k in range(MAX_SPLITS):
                ms[k] = NEG_INF
                if k < busy:
                    ms[k] = part_ml[2 * (base + k)]
                top = max(top, ms[k])
            num = float32(0.0)
            lsum = float32(0.0)
            for k in range(MAX_SPLITS):
                if k < busy:
                    w = math.exp2(ms[k] - top)
                    num += w * part_acc[(base + k) * head_dim + d]
                    lsum += w * part_ml[2 * (base + k) + 1]
            value = float32(0.0)
            if lsum > 0:
                value = num / lsum
            out[row, head * head_dim + d] = f32_to_bf16(value)

    return merge_splits


def choose_num_splits(num_seqs: int, num_kv_heads: int, num_sms: int) -> int:
    """Splits per sequence so that about SPLIT_BLOCKS_PER_SM blocks per SM have work, 1 once
    the batch alone gives three (at most MAX_SPLITS).

    A function of the batch size alone, so every step of a graph bucket launches the same grid;
    for a short context the last splits are empty (they exit at once), never tiny.
    """
    blocks = num_seqs * num_kv_heads
    if blocks >= 3 * num_sms:
        return 1
    return max(1, min(MAX_SPLITS, cdiv(SPLIT_BLOCKS_PER_SM * num_sms, blocks)))


def partial_sizes(num_seqs: int, num_heads: int, head_dim: int, num_splits: int) -> tuple:
    """Elements of the (accumulator, (m, l)) scratch that a split launch needs."""
    if num_splits == 1:
        return 0, 0
    return num_seqs * num_heads * num_splits * head_dim, num_seqs * num_heads * num_splits * 2


def counter_size(num_seqs: int, num_kv_heads: int, num_splits: int) -> int:
    """int32 split counters a launch needs: one per (sequence, KV head) when it splits."""
    return 0 if num_splits == 1 else num_seqs * num_kv_heads
