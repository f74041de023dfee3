"""Greedy sampling fast path: the argmax of each row of logits, in two small kernels.

The general sampler (sampling.py) gives each row one 1024-thread block; for a greedy row that
block reads 128,256 fp32 logits (Llama 3) alone, one SM out of 132: 40 us at batch 1 on the
H200. When every row of a step is greedy with no bans and no penalties, the executor can use
this instead:

1. argmax_chunks_kernel, grid (rows, chunks): each block takes CHUNK consecutive logits of a
   row (PER_THREAD coalesced loads per thread, all in flight at once), keeps the first maximum
   of each thread (strict >, indices increasing), reduces the block with
   block_reduce.block_argmax (warp shuffles on the GPU, a shared-memory tree in the simulator)
   and writes the chunk's (max, first index) to scratch. At batch 1 that is 126 blocks reading
   4 KB each: the whole GPU, one memory round trip.
2. argmax_final_kernel, one block per row: the same reduction over the row's chunk results.

The chunk grows with the batch. At batch 64 the 4 KB chunks are 8,064 blocks that each do one
round trip of loads and a block reduction: measured 33 us for 32 MB of logits (1 TB/s), the
blocks' start-up and reduction, not the bytes, being the cost. From WIDE_ROWS rows on, each
thread loads WIDE_PER_THREAD logits (16 KB a block, a quarter of the blocks, the same one round
trip: all loads are issued before any is compared). Batch 1 keeps the small chunks: its 126
blocks are what spreads one row over the whole GPU.

The ids go to two places: `out` in device memory, where the next step's embedding reads the
tokens it feeds back, and row `ring_slot[0]` of `ring`, a host buffer mapped into the device's
address space (cuda.mapped_array), where the host reads them with no copy on the stream: a
step's ids reach the host as the kernel's own stores, and the next step's input upload follows
the graph directly instead of queueing behind a device-to-host copy (gpu/backends/cuda/sampler.py).
The slot is read from device memory, so a captured graph writes whichever slot the step staged.

Ties go to the lowest index everywhere (as np.argmax), so the result is exactly np.argmax of
the row for NaN-free input (a row of -inf gives 0, as np.argmax does). The launcher allocates
nothing: the (value, index) scratch is passed in, sized by argmax_scratch_size, so both kernels
can be captured into a CUDA graph.

numpy twin: np.argmax(logits, axis=1) (greedy rows of gpu/sampling/numpy_sampler.py).
"""

from __future__ import annotations

import math

from numba import cuda, float32, int32

from gpu.kernels.block_reduce import better, block_argmax
from gpu.kernels.launch import MAX_THREADS, cdiv, no_ring, threads
from gpu.kernels.pdl import grid_dependency_sync

NEG_INF = float32(-math.inf)
PER_THREAD = 4  # logits per thread in stage 1
WIDE_PER_THREAD = 16  # ... from WIDE_ROWS rows on
WIDE_ROWS = 8
CHUNK_THREADS = threads(256)
CHUNK = CHUNK_THREADS * PER_THREAD  # logits per stage-1 block
WIDE_CHUNK = CHUNK_THREADS * WIDE_PER_THREAD
FINAL_THREADS = threads(128)
# block_argmax's scratch: a slot per warp on the GPU, per thread in the simulator (32 there).
SLOTS = MAX_THREADS // 32

SIGNATURES = {
    "argmax_chunks_kernel": ["void(float32[:, ::1], float32[::1], int32[::1])"],
    "argmax_chunks_kernel_wide": ["void(float32[:, ::1], float32[::1], int32[::1])"],
    "argmax_final_kernel": [
        "void(float32[::1], int32[::1], int64, int32[::1], int32[:, ::1], int32[::1])"
    ],
}


def _chunks_kernel(per_thread: int):
    """Stage 1 with per_thread logits a thread (a chunk of CHUNK_THREADS * per_thread)."""
    chunk_size = CHUNK_THREADS * per_thread

    def kernel(logits, scratch_val, scratch_idx):
        grid_dependency_sync()
        vbuf = cuda.shared.array(SLOTS, float32)
        ibuf = cuda.shared.array(SLOTS, int32)
        row = cuda.blockIdx.x
        chunk = cuda.blockIdx.y
        num_chunks = cuda.gridDim.y
        vocab = logits.shape[1]
        tid = cuda.threadIdx.x
        xs = cuda.local.array(per_thread, float32)
        first = chunk * chunk_size + tid
        # Constant trip count, no branch (indices past the row are clamped, then skipped): the
        # loads are issued together.
        for k in range(per_thread):
            xs[k] = logits[row, min(first + k * CHUNK_THREADS, vocab - 1)]
        best = NEG_INF
        best_i = int32(-1)
        for k in range(per_thread):
            v = first + k * CHUNK_THREADS
            if v < vocab and (best_i < 0 or xs[k] > best):
                best = xs[k]
                best_i = int32(v)
        best, best_i = block_argmax(vbuf, ibuf, best, best_i)
        if tid == 0:
            scratch_val[row * num_chunks + chunk] = best
            scratch_idx[row * num_chunks + chunk] = best_i

    return cuda.jit(cache=True)(kernel)


argmax_chunks_kernel = _chunks_kernel(PER_THREAD)
argmax_chunks_kernel_wide = _chunks_kernel(WIDE_PER_THREAD)


@cuda.jit(cache=True)
def argmax_final_kernel(scratch_val, scratch_idx, num_chunks, out, ring, ring_slot):
    grid_dependency_sync()
    vbuf = cuda.shared.array(SLOTS, float32)
    ibuf = cuda.shared.array(SLOTS, int32)
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    best = NEG_INF
    best_i = int32(-1)
    for c in range(tid, num_chunks, FINAL_THREADS):
        x = scratch_val[row * num_chunks + c]
        i = scratch_idx[row * num_chunks + c]
        if better(best, best_i, x, i):
            best = x
            best_i = i
    best, best_i = block_argmax(vbuf, ibuf, best, best_i)
    if tid == 0:
        out[row] = best_i
        ring[ring_slot[0], row] = best_i


def argmax_scratch_size(max_rows: int, vocab: int) -> int:
    """Elements of each scratch array (float32 values, int32 indices) for up to max_rows
    (sized for the small chunks, which need the most)."""
    return max_rows * cdiv(vocab, CHUNK)


def argmax_rows(logits, out, scratch_val, scratch_idx, stream=0, ring=None, ring_slot=None) -> None:
    """out[r] = np.argmax(logits[r]) (first index of the maximum) for every row of logits
    [rows, vocab] float32; out: int32 [>= rows]; scratch_val float32 / scratch_idx int32 of at
    least argmax_scratch_size(rows, vocab) elements; the same ids into ring[ring_slot[0], :rows]
    where a ring is given (see above). Two launches, no allocation (without a ring, the first
    call makes a one-element zero slot), no sync."""
    rows, vocab = logits.shape
    if ring is None:
        ring, ring_slot = no_ring(out)
    if rows == 0:
        return
    wide = rows >= WIDE_ROWS
    num_chunks = cdiv(vocab, WIDE_CHUNK if wide else CHUNK)
    if scratch_val.shape[0] < rows * num_chunks or scratch_idx.shape[0] < rows * num_chunks:
        raise ValueError(f"argmax scratch holds fewer than {rows * num_chunks} elements")
    chunks_kernel = argmax_chunks_kernel_wide if wide else argmax_chunks_kernel
    chunks_kernel[(rows, num_chunks), CHUNK_THREADS, stream](logits, scratch_val, scratch_idx)
    argmax_final_kernel[rows, FINAL_THREADS, stream](
        scratch_val, scratch_idx, num_chunks, out, ring, ring_slot
    )
