"""Paged attention for decode: one query token per sequence, split-KV (flash-decoding).

A decode step asks, for every sequence b and query head h: softmax(q . K^T * scale) @ V over
the sequence's whole context, whose K and V live in scattered cache blocks (the block table maps
logical block j of b to a physical block). There is almost no arithmetic per byte (2 * group
FMAs per bf16 of K or V), so the kernel is judged by two numbers: the GB/s of KV it reads at
large batches, and the microseconds of one launch at batch 1, where it is latency-bound.

The design, from the top:

* One thread block per (sequence, KV head, split), 128 threads. GQA: the `group` query heads
  that share a KV head are handled together, so each K/V byte is read once and used `group`
  times (Llama-3.2-1B: group 4).
* Thread-group-per-token. A token's K row of one KV head is head_dim bf16 = 128 contiguous bytes
  (head_dim 64). `lanes = head_dim / 8` consecutive threads own one token: each lane reads two
  8-byte words of the row (four bf16 each: the cache is viewed as uint64 on the host side,
  DeviceNDArray.view, and unpacked with shifts), so every load instruction of a warp covers
  whole 32-byte sectors. A block has 128 / lanes token slots (16 at head_dim 64) and each slot
  takes UNROLL = 4 tokens per iteration: one iteration = a tile of 64 tokens, 16 KB of K and V,
  whose loads (16 x 8 bytes per thread) are all issued before any is used.
* Scores without shared memory: each lane holds its 8 dimensions of q for every head of the
  group in registers (pre-scaled by scale * log2(e), so the softmax uses exp2), computes 8-long
  partial dot products and sums them over the lanes of its token with warp shuffles
  (log2(lanes) xor-shuffles per score, no barrier).
* Online softmax per token slot. Every slot keeps its own running max m, sum l and accumulator
  (group x 8 values per lane, registers) and rescales them once per tile. Slots never talk to
  each other inside the loop: the main loop has no barrier and no shared memory at all. At the
  end of the split the slots are merged through shared memory (the same merge as split-KV:
  weights 2^(m_slot - M)), once per block.
* Compile-time specialisation. The kernel is built by a factory (decode_kernel) for each
  (head_dim, group, block_size, threads): every small loop has a constant trip count, LLVM
  unrolls it, and the per-thread arrays (q, accumulators, scores, loaded words) are indexed by
  constants only, so they live in registers, not local memory (`cuda.local.array` indexed at
  run time would). `t // block_size` is a shift.
* Split-KV: with few sequences, (sequences x KV heads) blocks would leave most of the 132 SMs
  idle (batch 1 of Llama-3.2-1B is 8 blocks). So the context is cut into `num_splits` chunks,
  whole tiles each, computed on the device from seq_lens. num_splits depends only on the batch
  size (choose_num_splits: about SPLIT_BLOCKS_PER_SM = 4 blocks per SM, at most MAX_SPLITS =
  32), so a captured graph per batch-size bucket stays valid for any context. A short context
  therefore leaves the last splits empty rather than making tiny ones: context 128 at 32 splits
  is 2 busy splits of one 64-token tile and 30 empty ones. Every block computes the number of
  busy splits, `busy`, from seq_lens; an empty split (split >= busy) returns before any K or V
  load, writes nothing and is not counted, so surplus splits cost only their scheduling. That
  is why choose_num_splits did not change when the merge moved into this kernel: fewer splits
  would save nothing at short contexts and lose parallelism at long ones (batch 1, context
  4,096: 32 splits of two tiles). A busy split is at least MIN_SPLIT_TILES = 2 tiles
  ($TINYCHAT_DECODE_MIN_SPLIT_TILES): a block walking a second tile is cheaper than the merge's
  fence, counter and re-read. Measured on the H200 (cold KV, `bench_kernels.py`, fifth
  session), 1 -> 2 -> 4 tiles: batch 1 context 128 15.3 -> 11.3 -> 10.9 us, context 1,024 21.5
  -> 19.8 -> 22.2, context 4,096 31.8 -> 31.5 -> 27.6, batch 8 context 1,024 26.2 -> 26.1 ->
  27.6; batches 64 and 256 (one split) unchanged. With programmatic launch (pdl.py, sixth
  session) 1 tile was still slower end to end: `tinychat bench latency` at batch 1, 975
  against 1,034 tok/s (Llama-3.2-1B), 1,326 against 1,447 (SmolLM2-135M).
* The merge, in the same kernel ("last block done", the CUDA threadFenceReduction sample).
  With busy == 1 (one split, a context of at most one chunk, or a padding row) the block
  normalises and writes bf16 itself. Otherwise each busy split writes its unnormalised
  accumulator and (m, l) (m in log2 units) to part_acc / part_ml, every thread fences
  (cuda.threadfence: its partials are visible GPU-wide), a barrier, and thread 0 adds 1 to the
  int32 counter of its (sequence, KV head) with cuda.atomic.add and fences again (acquire). The
  block that saw busy - 1 (the last of its sequence's splits to finish) learns so through shared
  memory, resets the counter to 0 (all busy splits have counted: the next launch, or graph
  replay, finds it zero without a memset) and merges: out = sum_s 2^(m_s - M) acc_s / sum_s
  2^(m_s - M) l_s, over s = 0, 1, ... busy - 1 in that order whichever block is last, so the
  result is deterministic and the same arithmetic as the former separate reduce kernel. Its
  loops over splits have a constant trip count (MAX_SPLITS, guarded), so all their loads are in
  flight at once. The counters (one per sequence x KV head, zeroed once when allocated) belong
  to the caller, like part_acc / part_ml: CudaBackend owns all three. This saves the second
  launch (about 1.3 us of graph replay and a dependent kernel boundary) and the reduce's 8
  blocks re-reading partials behind a full grid drain.

Programmatic dependent launch (pdl.py): seq_lens, query_start_loc and the first tile's block
table entries are staged inputs that no kernel writes, so a block reads them, and an empty split
exits, before grid_dependency_sync; q and the KV cache (written by the kernel before) after it.
Both walks then look each next tile's blocks up one tile ahead. The tensor-core walk first
looked every tile's block up after the wait, right before its loads; moving the first before
the wait and the rest a tile ahead took batch 1 from 1,068 to 1,081 tok/s (H200, seventh
session, `tinychat bench latency`; batches 8-256 unchanged).

All shapes come from device buffers (query_start_loc, seq_lens, the block table and its row
stride in a one-element device array): no host value of the step is baked into the launch but
the number of sequences.

Mixed steps. The kernel also serves the decode rows of a step that carries prompt chunks: a
sequence with more or fewer than one query row this step exits at once, and the prefill kernel
(run with decode_rows=False) takes exactly those. Without this a decode row in a mixed step
walked its whole context in one prefill block (no split-KV): with 7 chats streaming and an
8th's new turn arriving, that serial walk over each layer was most of the step.

A sequence with seq_len 0 (graph padding) writes zeros from split 0 and reads nothing.

In the CUDA simulator (no warp shuffles) the lane sums go through shared memory with two
barriers per tile; one `if SIMULATOR` picks the path and the GPU build drops the other. The
simulator runs blocks one after another and supports cuda.atomic.add (threadfence is a no-op
there), so the counting runs, but the memory ordering is only exercised on a GPU.

Registers. launch_bounds asks ptxas to fit BLOCKS_PER_SM blocks of 128 threads on an SM, i.e.
at most 65536 / (128 * BLOCKS_PER_SM) registers a thread: 128 at the default 4, where ptxas
reported a 40-byte spill until the index arithmetic below went unsigned (127, no spill).
BLOCKS_PER_SM is read once, at import, from the environment variable
TINYCHAT_DECODE_BLOCKS_PER_SM (default 4; 3 allows 168 registers, 2 allows 255), to try the
trade of fewer resident blocks for no spill on the bandwidth-bound cases (batch 64 / 256);
TINYCHAT_DECODE_UNROLL (default 4) the other way round: 2 tokens a slot halves the loads and
registers of a tile, so more blocks fit and hide each other's waits. It
changes only the code generation, not choose_num_splits (SPLIT_BLOCKS_PER_SM), so the grids,
graph buckets and numerics stay the same. Numba's on-disk cache key ignores launch bounds, so
only the default build is cached. Measured on the H200 (fifth session, cold KV, us, UNROLL 4 /
2 / 8 with BLOCKS_PER_SM 2): batch 64 context 1,024 71.8 / 74.8 / 81.0, batch 256 context 512
144.9 / 148.3 / 171.3, batch 1 context 32 9.5 / 8.2 / 10.0: the default stays.

Expected on the H200 (4.25 TB/s copy rate; KV bytes = 2 * context * nkv * head_dim * 2 per
sequence, 256 KB per 1,024 tokens for Llama-3.2-1B): batch 64 / context 1024 reads 128 MB, one
split, 512 blocks resident in one wave, each with 16 KB of loads in flight per tile: ~35-40 us
(~3.5 TB/s). Batch 256 / context 512: 256 MB, ~70 us. Batch 1 is latency, not bandwidth: 2 MB
at context 1024 over 32 splits (16 of them busy, one tile each) is one round trip for the
block table, one for the tile, the slot merge, the partials' fence and atomic, and the last
block's merge (one more round trip, from L2): ~4-6 us, about the same at contexts 32-200 (a
context of at most 64 tokens is one busy split and skips the partials altogether).
tests/device/bench_kernels.py measures it.

Measured on the H200 (issue 5, cold KV): batch 64 / context 1024 in 76.7 us (1.75 TB/s of KV,
11x the first version), batch 256 / context 512 in 154 us (1.74 TB/s): half the expected rate,
so the 128-register cap (4 blocks per SM, a 40-byte spill) is the next thing to try
(TINYCHAT_DECODE_BLOCKS_PER_SM, not yet measured). With the separate reduce kernel, batch 1
took 15.6 us at context 128 and 21.7 us at 1,024 (was 48): latency-bound, the launch of 256
blocks and the reduce kernel dominated. With the merge fused and the empty splits exiting at
once (third session): 9.65 us at context 32, 15.4 at 128, 21.7 at 1,024 — no faster, one
launch fewer. Batch 1 is a chain of dependent round trips (seq_lens, the block table, K / V,
the partials' fence and counter, the merge's reads), ~10 us whatever the context.

Instructions, not bytes (sixth session). nvdisasm of the sm_90 build counted 1,249
instructions per tile in a thread's main loop, of which only 256 are the FFMAs of the scores and
P @ V: about 600 were integer work, because Numba indexes arrays with signed int64 (Python's
negative-index wrap, floor division and modulo, 64-bit products by run-time strides, for each of
the 16 loads). The cache is now passed as flat uint64 words and indexed with unsigned 64-bit
arithmetic whose factors are constants of the build (block size, words per row; the number of
KV heads is an argument): one product per token, the same word index for K and V. The loop is
901 instructions (FFMA 256, FADD 84, FMUL 76, SHFL 48, MUFU 20, LDG 20; the bf16 unpacking is
~64 of the rest), and the 40-byte spill is gone. Measured on the H200 (seventh session, cold
KV, `bench_kernels.py`): batch 64 / context 1,024 55.3 us (was 74-77: 2.43 TB/s of KV), batch
256 / context 512 111.5 us (was 145-154); batch 1 unchanged (8.6 us at context 32).

The tensor-core walk (sixth session; the default since the seventh, where the shape fits;
$TINYCHAT_DECODE_TENSOR_CORES=0 falls back to the FFMA walk). With the indexing fixed, the FFMA walk
is still ~900 instructions per warp and 16 tokens, 256 of them FFMAs: 4 per KV bf16 and query head
at GQA 4. tensor_core_walk (head_dim 64, group <= 8) gives the products to the tensor cores through
mma.py: per warp and 16 tokens, 8 mma for S = Q K^T (A = Q: the group's heads in rows 0-7 of 16) and
8 for O += P V, whose A operand is S's accumulator fragment as it comes out: no shuffle, no shared
memory between the two products. The row max takes 2 xor shuffles, the exponentials 4 MUFU. The
fragments come straight from global memory: for K, 32 contiguous bytes of the row per lane (the k
index of the product is permuted, the same way for Q, so a lane's four k slots are four adjacent
dimensions); for V, 16 contiguous bytes of four tokens, paired bf16 by bf16 into the B fragments.

Precision: a bf16 q would cost ~2^-9 of every score, a bf16 P as much of every weight (outputs
off by up to ~1e-2 on the tests' data). Both are split into two bf16, hi + lo, and the lo parts
ride in rows 8-15 of the A operand, which GQA leaves empty: rows g and g + 8 of the result add
up to fp32-accurate products at no extra mma, and the walk meets the FFMA walk's tolerance.
ptxas, sm_90: 358 loop instructions per 16 tokens (16 HMMA, 17 LDG; 352 before the block
lookahead) against the FFMA walk's 905, 112 registers, no spill. The simulator runs it through
mma.py's twin of the instruction.
Measured on the H200 (seventh session, same call, FFMA walk -> tensor cores, cold KV): batch 64
/ context 1,024 55.3 -> 45.5 us (2.95 TB/s), batch 256 / context 512 111.5 -> 96.4 us, batch 8
/ context 1,024 23.5 -> 22.3, batch 1 the same within 0.4 us (latency-bound); `tinychat bench
decode`: batch 1 1,056 -> 1,071 tok/s, batch 64 47,475 -> 48,603, batch 256 107,978 -> 111,392.
The FFMA walk stays for every other shape (head_dim 128, groups above 8).

Tried and dropped (seventh session): the tensor-core walk issuing the next tile's K and V loads
before computing the current tile (two tiles in flight a warp; 128 registers, no spill, 422 loop
instructions against 356). Measured on the H200 in one call, cold KV: batch 64 / context 1,024
45.2 -> 45.9 us, batch 256 / context 512 96.7 -> 96.0, batch 1 within 0.2 us; with 3 blocks an
SM (168 registers) 57.1 and 103.8, worse. `tinychat bench`: batch 64 48,754 -> 48,321 tok/s,
throughput 36,922 -> 37,149: noise. More bytes in flight a warp buys nothing here; the walk is
not waiting on one tile's latency (`bench_kernels_prefetch_ab.log`).

Tried and dropped (issue 5, third session): issuing the next tile's K loads during this tile's
softmax and P @ V, and its V loads during the next scores, in the same registers. ptxas then
spilled 248 bytes a thread instead of 60 at the 128-register bound, and the H200 measured it
slower: batch 64 / context 1024 in 85.9 us against 74.2, batch 256 / context 512 in 180.4
against 153.0 (`bench_kernels_pipelined.json`). More bytes in flight needs registers or shared
memory this design does not have to spare (cp.async stages are not reachable from Numba).

History. The first version (issue 4) gathered 32-token tiles into shared memory as fp32, had one
thread per (head, token) score with 64-long shared-memory dot products, serial per-head max and
sum, 6 barriers per tile and accumulators in `cuda.local.array`. Measured on the H200: correct
everywhere, but 48 us at batch 1 / context 1024 (32 splits) and 849 us at batch 64 / context
1024, i.e. 90-140 GB/s of KV against the 4.3 TB/s copy rate. Removing 64-bit divisions from the
inner loops gained only 6%: the time went to barriers, shared-memory traffic and local memory.
Issue 5 rewrote it as above, with a separate reduce kernel for the splits; the merge then moved
into this kernel (last block done) and empty splits stopped writing anything.

A warp per head at large batch (eighth session; choose_warp_heads_ctx). At batch 256 the grid is
2,048 blocks, about 4 waves of 528 resident ones, and at the decode bench's contexts (~100) each
block walks two 64-token tiles between its 4 warps and then merges them: set-up and merge cost
as much as the walk, every wave. When a launch has at least WARP_HEADS_MIN_BLOCKS (4) blocks an
SM, a sequence of at most WARP_HEADS_MAX_CTX tokens is walked a warp per KV head instead: the
first quarter of its blocks take 4 heads each, every warp walks its head's whole context 16
tokens a step (the same walk, step 16 instead of 64) and writes the normalised output from its
registers; no shared memory, no barrier, and the grid's 2,048 warps are resident at once.
Measured on the H200 (`bench_kernels.py`, cold KV, us, off -> on): batch 256 context 128 43.8
-> 28.4, context 512 97.1 -> 79.0, context 1,024 165.8 -> 147.1 (3.65 TB/s); batch 64 is left as
it was (its 512 blocks fit in one wave; a warp per head there: context 128 14.5 -> 19.1, context
1,024 45.4 -> 96.0). `tinychat bench decode`, batch 256: 113,714 -> 126,670 tok/s. The limit on
the context is for mixed lengths: one warp walking a long context alone becomes the launch's
tail. The throughput workload (lengths up to 2,048) measured, limit 0 / 512 / 1,024 / 2,048:
37,115 / 37,139 / 36,619 / 35,340 output tok/s, so 512; with uniform contexts (batch 256 at
1,024) the warp per head is faster at any length. The launch threshold, 8 -> 4 blocks an SM
(a launch of more than one wave; batch 64 of Llama-3.2-1B, 512 blocks, stays below it), same
call: Llama-3.2-1B batch 128 78,394 -> 81,344 tok/s (batches 192 and 256 the same within 0.3%),
SmolLM2-135M (3 KV heads) batch 256 168,649 -> 174,991 (2 blocks an SM: 177,067, but that would
take Llama's batch 64, which loses: 48,420 -> 46,169), so 4.

numpy twin: CpuBackend.attention (gpu/backends/cpu.py), with one query row per sequence.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import cuda, float32, int32, uint16, uint32, uint64

from gpu.kernels import launch, mma
from gpu.kernels.bf16 import bf16_of_word, bf16_to_f32, f32_to_bf16
from gpu.kernels.launch import SIMULATOR, cdiv, device_function, env_choice, threads
from gpu.kernels.pdl import grid_dependency_sync

DIMS = 8  # head dimensions per lane: two 8-byte words of four bf16
DEFAULT_UNROLL = 4  # tokens per token slot per tile
UNROLL_ENV = "TINYCHAT_DECODE_UNROLL"
MAX_GROUP = 8  # query heads per KV head
MAX_SPLITS = 32
SPLIT_BLOCKS_PER_SM = 4  # choose_num_splits aims at this many busy blocks per SM
DEFAULT_BLOCKS_PER_SM = 4  # launch_bounds: blocks an SM must fit (128 threads: 128 registers)
BLOCKS_PER_SM_ENV = "TINYCHAT_DECODE_BLOCKS_PER_SM"
MIN_SPLIT_TILES_ENV = "TINYCHAT_DECODE_MIN_SPLIT_TILES"
LOG2E = 1.4426950408889634
NEG_INF = float32(-math.inf)
FULL_MASK = 0xFFFFFFFF
LOW32, HIGH_SHIFT, LOW16 = np.uint64(0xFFFFFFFF), np.uint64(32), np.uint64(0xFFFF)
TENSOR_CORES_ENV = "TINYCHAT_DECODE_TENSOR_CORES"
NTHREADS = threads(128)  # per block


def _blocks_per_sm() -> int:
    """The launch_bounds minimum of blocks per SM: $TINYCHAT_DECODE_BLOCKS_PER_SM or 4."""
    return env_choice(BLOCKS_PER_SM_ENV, DEFAULT_BLOCKS_PER_SM, range(1, 17))


def _unroll() -> int:
    """Tokens per token slot per tile: $TINYCHAT_DECODE_UNROLL or 4. Fewer means fewer
    registers (more resident blocks to hide each one's load latency), more means more bytes in
    flight per block; tests/device/ab.sh sweeps it with BLOCKS_PER_SM."""
    return env_choice(UNROLL_ENV, DEFAULT_UNROLL, (1, 2, 4, 8))


BLOCKS_PER_SM = _blocks_per_sm()  # read once, at import
UNROLL = _unroll()
# The smallest busy split, in tiles: a context of at most this many tiles is one block's walk
# (no partials, no merge), $TINYCHAT_DECODE_MIN_SPLIT_TILES or 2.
DEFAULT_MIN_SPLIT_TILES = 2
MIN_SPLIT_TILES = env_choice(MIN_SPLIT_TILES_ENV, DEFAULT_MIN_SPLIT_TILES, range(1, 65))
# The tensor-core walk (tensor_core_walk, mma.py) where the shape fits, unless
# $TINYCHAT_DECODE_TENSOR_CORES = 0 (measured faster on the H200, seventh session).
TENSOR_CORES = env_choice(TENSOR_CORES_ENV, 1, (0, 1)) == 1
# A warp per (sequence, KV head) for contexts up to WARP_HEADS_MAX_CTX tokens, in launches of
# at least WARP_HEADS_MIN_BLOCKS blocks an SM (choose_warp_heads_ctx); 0 turns either off.
WARP_HEADS_MAX_CTX_ENV = "TINYCHAT_DECODE_WARP_HEADS_MAX_CTX"
WARP_HEADS_MIN_BLOCKS_ENV = "TINYCHAT_DECODE_WARP_HEADS_MIN_BLOCKS"
WARP_HEADS_MAX_CTX = env_choice(WARP_HEADS_MAX_CTX_ENV, 512, (0, *(1 << k for k in range(4, 21))))
WARP_HEADS_MIN_BLOCKS = env_choice(WARP_HEADS_MIN_BLOCKS_ENV, 4, range(33))

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
    """The split-KV decode kernel (merge included) specialised for (head_dim, group,
    block_size, min_split_tiles; 0: MIN_SPLIT_TILES, tensor_cores; None: TENSOR_CORES where
    the shape allows, except in the simulator unless a test runs the GPU code path there),
    built once per configuration."""
    if tensor_cores is None:  # the walk needs warp shuffles, which the bare simulator lacks
        tensor_cores = TENSOR_CORES and tensor_cores_fit(head_dim, group) and not SIMULATOR
    if tensor_cores and not tensor_cores_fit(head_dim, group):
        raise ValueError(f"the tensor-core decode needs head_dim 64, group <= 8: {head_dim}")
    return _build(head_dim, group, block_size, min_split_tiles or MIN_SPLIT_TILES, tensor_cores)


def tensor_cores_fit(head_dim: int, group: int) -> bool:
    """Shapes the tensor-core walk is written for: head_dim 64 (4 lanes x 16 dimensions of a K
    row, 8 output tiles of 8), at most 8 query heads a KV head (the 16-row A operand)."""
    return head_dim == 64 and group <= 8 and UNROLL == 4


@functools.cache
def _build(head_dim: int, group: int, block_size: int, min_split_tiles: int, tensor_cores: bool):
    check_shape(head_dim, group)
    # launch.SIMULATOR, not this module's SIMULATOR: the tests turn the latter off to run the
    # GPU code path in the simulator, which still cannot compile a real kernel.
    simulated = launch.SIMULATOR
    nthreads = NTHREADS
    lanes = head_dim // DIMS  # threads per token
    log_lanes = lanes.bit_length() - 1
    slots = nthreads // lanes  # tokens in flight per step
    tile = tile_tokens(head_dim)  # slots * UNROLL tokens per iteration; splits are whole tiles
    min_chunk = min_split_tiles * tile
    nq = group * DIMS  # q values (and accumulators) per lane
    ns = group * UNROLL  # scores per lane per tile
    nw = 2 * UNROLL  # 8-byte words per lane per tile, of K and of V
    out_dims = group * head_dim
    red_shape = (ns, nthreads) if simulated else (1, 1)
    # The cache's word index, in unsigned 64-bit arithmetic with constants of that type: with
    # Numba's signed int64 indexing every load paid Python's negative-index wrap, floor
    # division and modulo, and 64-bit products by the arrays' run-time strides (ptxas: ~600
    # integer instructions a tile against 256 FFMA).
    u_block_size = np.uint64(block_size)
    u_words = np.uint64(head_dim // 4)  # 8-byte words of one head's K (or V) row
    u_lanes = np.uint64(lanes)
    m_shape = (slots, group)
    acc_shape = (slots, out_dims)
    # The tensor-core walk (tensor_cores): a warp takes 16 tokens of each 64-token tile (the
    # simulator's 32-thread block: one warp, 16-token tiles, as tile_tokens says).
    nwarps = nthreads // 32
    nslots = nwarps if tensor_cores else slots  # the partial results merged at the end
    one_block = block_size % 16 == 0  # a warp's 16 tokens lie in one cache block
    fa_shape, fb_shape, fc_shape = mma.scratch_shapes(simulated)

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
        last_sh = cuda.shared.array(1, int32)
        blk = cuda.local.array(UNROLL, int32)
        ms = cuda.local.array(MAX_SPLITS, float32)
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
        if busy == 1:
            return

        # Last block done: the busy splits of (b, kvh) count themselves in; the one that finds
        # busy - 1 others there merges them all. Release: every thread's partials are visible
        # GPU-wide before the count; acquire: thread 0 fences after it, the barrier passes it on.
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

    if simulated:
        return cuda.jit(cache=True)(kernel)
    # At most 65536 / (128 * BLOCKS_PER_SM) registers a thread (4: 128; ptxas uses 127, no
    # spill). The on-disk cache key ignores launch bounds and module globals: cache the
    # default build only (the tensor-core walk wherever it fits), the one whose start-up
    # matters.
    default = BLOCKS_PER_SM == DEFAULT_BLOCKS_PER_SM and UNROLL == DEFAULT_UNROLL
    default = default and min_split_tiles == DEFAULT_MIN_SPLIT_TILES
    default = default and tensor_cores == tensor_cores_fit(head_dim, group)
    return cuda.jit(cache=default, launch_bounds=(nthreads, BLOCKS_PER_SM))(kernel)


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


def choose_warp_heads_ctx(
    num_seqs: int, num_kv_heads: int, num_sms: int, num_splits: int, head_dim: int, group: int
) -> int:
    """The longest context that a launch walks a warp per (sequence, KV head); 0: none.

    A block of 4 warps on one head splits each 64-token tile between its warps and merges
    their partial results through shared memory at the end. When the grid is many waves of
    such blocks (batch 256: 2,048 blocks, 528 resident) and the contexts are short, the set-up
    and merge of every wave cost more than its walk: 32.6 us a layer at batch 256 / context
    ~112 (H200, seventh session), against 13.8 at the copy rate. With a warp per head, the
    first quarter of a sequence's blocks walk 4 heads each, a warp a head, and write each output
    straight from its registers: the same tokens per warp, the same number of warps, now all
    resident in one wave, no barrier and no merge. A long context would make one warp's walk
    the launch's tail, so above WARP_HEADS_MAX_CTX tokens a sequence's blocks walk as before
    (decided per sequence, on the device, from seq_lens); and a launch of fewer than
    WARP_HEADS_MIN_BLOCKS blocks an SM keeps 4 warps a head, which it needs to fill the GPU.
    Tensor-core walk only (the FFMA walk's token slots are not warps)."""
    blocks = num_seqs * num_kv_heads
    if num_splits != 1 or not tensor_cores_fit(head_dim, group) or not TENSOR_CORES:
        return 0
    return WARP_HEADS_MAX_CTX if blocks >= WARP_HEADS_MIN_BLOCKS * num_sms else 0


def busy_splits(seq_len: int, num_splits: int, head_dim: int, min_split_tiles: int = 0) -> int:
    """Host twin of the kernel's `busy`: the splits that hold tokens of a seq_len context (1 for
    seq_len 0, whose split 0 writes the zeros); the others exit at once."""
    tile = tile_tokens(head_dim)
    chunk = max(cdiv(cdiv(seq_len, num_splits), tile), min_split_tiles or MIN_SPLIT_TILES) * tile
    return cdiv(seq_len, chunk) if seq_len else 1


def partial_sizes(num_seqs: int, num_heads: int, head_dim: int, num_splits: int) -> tuple:
    """Elements of the (accumulator, (m, l)) scratch that a split launch needs."""
    if num_splits == 1:
        return 0, 0
    return num_seqs * num_heads * num_splits * head_dim, num_seqs * num_heads * num_splits * 2


def counter_size(num_seqs: int, num_kv_heads: int, num_splits: int) -> int:
    """int32 split counters a launch needs: one per (sequence, KV head) when it splits."""
    return 0 if num_splits == 1 else num_seqs * num_kv_heads


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
