"""The sampler on the device: each row spread over many blocks, a fixed sequence of passes.

It reproduces gpu/sampling/numpy_sampler.py (the numpy twin) row by row: bans and penalties
from the row's token state (gpu/sampling/token_state.py: uint16 cells, PROMPT_BIT, BAN_BIT and
an output count), greedy argmax, temperature, min_p, top_k, top_p, Gumbel-max with the
counter-based uniforms of gpu/sampling/rng.py, and the state's count of the sampled token.

Why many blocks and few passes: a decode step of Llama-3.2-1B at batch 1 takes ~1.1 ms on an
H100, so sampling at 0.95x greedy speed has ~50 us (batch 1 and 8), ~75 us at batch 64 (1.5 ms
steps) and ~100 us at batch 256 (2.15 ms steps). One block per row uses 1 SM of 132 at batch
1, and a binary search of 32 + 32 passes over a 512 KB row (128,256 logits) halved batch-1
speed with top-p. So every kernel here runs on a grid (rows, chunks) (`chunking`: ~264 blocks
in all for small batches, down to one or two a row at batch 256, chunks of >= MIN_CHUNK
logits), and the thresholds are found by radix select in 3 passes each, over a copy of the
row's candidates once they fit in a buffer.

The passes, each a kernel (always the same ten, shapes from n and V only: no host sync, one
CUDA graph; THREADS threads a block, which the histogram loops assume):

1. scores_kernel (sampling_scores.py): bans and penalties from the state (spec step 1, in
   place on the ids the state's bit mask names), greedy argmax or x / T. Greedy and
   temperature-only rows finish here; truncating rows store their max and min_p bound, and
   top-k rows count their first radix digit. Top-p rows without top-k also take their three
   best noisy scores over every finite score (R_WINNER, R_SECOND, R_THIRD): the first of them
   the thresholds keep is the token (the early exits of passes 3 and 5).
2. radix_count_kernel x 2 (sampling_radix.py, digits 1 and 2 of 11, 11, 10 bits): top-k, the
   k-th largest kept score by radix select over the scores' order-preserving integer keys.
   The second digit copies the row's candidates (every score that can still be kept) into a
   buffer, and later passes read the copy where it fits.
3. linear_mass_kernel, linear_hist_kernel, linear_split_kernel (sampling_linear.py): Z and
   the mass above each of pass 1's three, running sums: where the nucleus keeps one of them
   the row is done with top-p (all but about one row in a thousand at top_p 0.9: each is a
   draw from the whole row). The others: top-p's cut bin on a linear scale of the scores, the
   Gumbel-max above it, which is the token unless a score of the cut's bins beats it, and the
   bins copied out for that case.
4. radix_mass_kernel x 3 (sampling_radix.py): top-p's exact cut by radix select with masses
   exp(s - max) in fixed point, over the copy (or, where the copy overflowed, the row). A
   compact row's three digits run in the first launch, in one block (compact_mass_select:
   no cross-block merge between digits); the other two launches return at once for it.
5. gumbel_kernel (sampling_draw.py): the pass-1 winner if the thresholds keep it (no read of
   the row), else the Gumbel-max over what they keep; the last block finishes the row.

Every Gumbel-max (temperature rows in pass 1, top-p's scores above the cut bin in pass 3, the
draw in pass 5) takes the noise only where a score can still beat the block's best noisy scores
so far (sampling_common.noisy_offer, insert_best; the split, which runs for few rows, its
warp's): the same token, without two logarithms for most of the row.

What they share (sampling_common.py): the row layouts below, the packed (value, index) max, the
"last block done" merge across a row's blocks, the counter-based uniforms; the radix
histogram's block-wide steps are in sampling_histogram.py.

Rows a pass has nothing to do for (an inactive phase) return at once: a temperature-only step
still launches all ten kernels, the last nine of them empty blocks.

Scratch (SamplerScratch, allocated once by sampler_scratch, ~80 KB a row: 20 MB at 256 rows):
the tickets, the packed-max slots and the [rows, 2048] int64 histogram, all left zeroed (or
-1) by the last blocks, the per-row thresholds (rowf: max, min_p bound, kth, top-p t, Z,
scale; rowi: mode, prefix, remaining count or mass, candidates, digit, linear cut bin, the
pass-1 winner), the candidate buffers (64 KB a row) and the work lists of the two spread linear
passes (hist_rows, linear_rows).

Ties: argmax and Gumbel-max take the smallest index among equal values (np.argmax); top-k and
top-p keep every score tied at the edge. Results may differ from numpy only where float
rounding decides a tie at a threshold (GPU expf / logf vs numpy's, the fixed-point masses).

Row parameters: fparams [6, rows+1] f32 (F_*), iparams [3, rows+1] i32 (I_*), uparams [2, rows]
u64 (U_*); state [max_rows, vocab] uint16.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import cuda

from gpu.kernels.launch import cdiv, no_ring
from gpu.kernels.sampling_common import (
    BAN_BIT,
    BINS,
    BINS_PER_THREAD,
    CANDIDATES,
    COUNT_MASK,
    F_FREQUENCY,
    F_MIN_P,
    F_PRESENCE,
    F_REPETITION,
    F_TEMPERATURE,
    F_TOP_P,
    I_BAN_ACTIVE,
    I_STATE_ROW,
    I_TOP_K,
    MASS_SCALE,
    MIN_CHUNK,
    MODE_COMPACT,
    MODE_EARLY,
    MODE_LINEAR,
    MODE_TOP_K,
    MODE_TOP_P,
    MODE_TRUNCATE,
    MODE_WON,
    NEG_INF,
    NONE,
    PROMPT_BIT,
    R_COUNT,
    R_DIGIT,
    R_KTH,
    R_LINEAR_BIN,
    R_MAX,
    R_MIN_BOUND,
    R_MODE,
    R_P_T,
    R_PREFIX,
    R_REMAIN,
    R_SCALE,
    R_SECOND,
    R_THIRD,
    R_WINNER,
    R_Z,
    SLOTS,
    TARGET_BLOCKS,
    THREADS,
    U_SEED,
    U_STEP,
    UNROLL,
    row_key,
    uniform,
)
from gpu.kernels.sampling_draw import gumbel_kernel
from gpu.kernels.sampling_linear import (
    linear_hist_kernel,
    linear_mass_kernel,
    linear_split_kernel,
)
from gpu.kernels.sampling_radix import radix_count_kernel, radix_mass_kernel
from gpu.kernels.sampling_scores import scores_kernel

__all__ = [
    "BAN_BIT",
    "BINS",
    "BINS_PER_THREAD",
    "CANDIDATES",
    "COUNT_MASK",
    "F_FREQUENCY",
    "F_MIN_P",
    "F_PRESENCE",
    "F_REPETITION",
    "F_TEMPERATURE",
    "F_TOP_P",
    "I_BAN_ACTIVE",
    "I_STATE_ROW",
    "I_TOP_K",
    "MASS_SCALE",
    "MIN_CHUNK",
    "MODE_COMPACT",
    "MODE_EARLY",
    "MODE_LINEAR",
    "MODE_TOP_K",
    "MODE_TOP_P",
    "MODE_TRUNCATE",
    "MODE_WON",
    "NEG_INF",
    "NONE",
    "PROMPT_BIT",
    "R_COUNT",
    "R_DIGIT",
    "R_KTH",
    "R_LINEAR_BIN",
    "R_MAX",
    "R_MIN_BOUND",
    "R_MODE",
    "R_PREFIX",
    "R_P_T",
    "R_REMAIN",
    "R_SCALE",
    "R_SECOND",
    "R_THIRD",
    "R_WINNER",
    "R_Z",
    "SIGNATURES",
    "SLOTS",
    "THREADS",
    "UNROLL",
    "U_SEED",
    "U_STEP",
    "SamplerScratch",
    "chunking",
    "gumbel_kernel",
    "linear_hist_kernel",
    "linear_mass_kernel",
    "linear_split_kernel",
    "radix_count_kernel",
    "radix_mass_kernel",
    "row_key",
    "sample",
    "sampler_scratch",
    "scores_kernel",
    "uniform",
]

_STATE = "uint16[:, ::1], uint32[:, ::1]"  # the token state and its bit mask
_SCRATCH = "int32[::1], int64[::1], float32[:, ::1], int64[:, ::1]"
_CANDIDATES = "float32[:, ::1], int32[:, ::1]"
SIGNATURES = {
    "scores_kernel": [
        "void(float32[:, ::1], int64, float32[:, ::1], int32[:, ::1], uint64[:, ::1],"
        f" {_STATE}, int32[::1], int64[::1], int64[::1], int64[:, ::1], float32[:, ::1],"
        " int64[:, ::1], int64[:, ::1], int32[::1], int32[:, ::1], int32[::1])"
    ],
    "radix_count_kernel": [
        "void(float32[:, ::1], int64, int64, int32[:, ::1], float32[:, ::1],"
        f" int32[::1], int64[:, ::1], float32[:, ::1], int64[:, ::1], {_CANDIDATES})"
    ],
    "radix_mass_kernel": [
        "void(float32[:, ::1], int64, int64, int32[:, ::1], float32[:, ::1],"
        f" int32[::1], int64[:, ::1], float32[:, ::1], int64[:, ::1], {_CANDIDATES})"
    ],
    "linear_mass_kernel": [
        "void(float32[:, ::1], int64, float32[:, ::1], int32[::1], int64[:, ::1],"
        " float32[:, ::1], int64[:, ::1], int32[::1], int32[::1])"
    ],
    "linear_hist_kernel": [
        "void(float32[:, ::1], float32[:, ::1], int32[::1], int64[:, ::1],"
        " float32[:, ::1], int64[:, ::1], int32[::1], int32[::1])"
    ],
    "linear_split_kernel": [
        "void(float32[:, ::1], uint64[:, ::1], int32[::1], int64[::1], int64[::1],"
        f" float32[:, ::1], int64[:, ::1], {_CANDIDATES}, int32[::1])"
    ],
    "gumbel_kernel": [
        "void(float32[:, ::1], int64, int32[:, ::1], uint64[:, ::1],"
        f" {_STATE}, {_SCRATCH}, {_CANDIDATES}, int32[::1], int32[:, ::1], int32[::1])"
    ],
}


@dataclass
class SamplerScratch:
    """Every device buffer the sampler's passes need (see the module docstring)."""

    ticket: object  # int32 [max_rows]: blocks of the row done with the current pass
    best: object  # int64 [max_rows]: the packed max of the current pass (NONE when idle)
    winner: object  # int64 [max_rows]: pass 1's full-row Gumbel-max (NONE when idle)
    runners: object  # int64 [2, max_rows]: ... and the next two (NONE when idle)
    rowf: object  # float32 [6, max_rows]: R_MAX, R_MIN_BOUND, R_KTH, R_P_T, R_Z, R_SCALE
    rowi: object  # int64 [9, max_rows]: R_MODE, R_PREFIX, R_REMAIN, R_COUNT, R_DIGIT,
    # R_LINEAR_BIN, R_WINNER, R_SECOND, R_THIRD
    hist: object  # int64 [max_rows, BINS]: the row's radix histogram (zero when idle)
    cand_val: object  # float32 [max_rows, candidates]: a compact row's scores (as stored)
    cand_idx: object  # int32 [max_rows, candidates]: ... and their token ids
    linear_rows: object  # int32 [max_rows + 2]: the rows top-p's split pass reads (a count,
    # the pass's ticket, the rows: sampling_linear.py), zero when idle
    hist_rows: object  # int32 [max_rows + 2]: the rows whose pass-1 winner the accept test
    # turned down, for the linear histogram pass (the same layout), zero when idle
    max_rows: int
    vocab: int


def sampler_scratch(
    max_rows: int, vocab: int, stream=0, candidates: int = CANDIDATES
) -> SamplerScratch:
    """The sampler's scratch for up to max_rows rows of vocab logits (80 KB a row with the
    default 8,192 candidates: 20 MB at 256 rows)."""
    if vocab >= 2**19:
        raise ValueError("the fixed-point top-p masses hold vocabularies under 2**19")
    rows = max(max_rows, 1)
    return SamplerScratch(
        ticket=cuda.to_device(np.zeros(rows, np.int32), stream=stream),
        best=cuda.to_device(np.full(rows, NONE, np.int64), stream=stream),
        winner=cuda.to_device(np.full(rows, NONE, np.int64), stream=stream),
        runners=cuda.to_device(np.full((2, rows), NONE, np.int64), stream=stream),
        rowf=cuda.to_device(np.zeros((6, rows), np.float32), stream=stream),
        rowi=cuda.to_device(np.zeros((9, rows), np.int64), stream=stream),
        hist=cuda.to_device(np.zeros((rows, BINS), np.int64), stream=stream),
        cand_val=cuda.device_array((rows, candidates), np.float32, stream=stream),
        cand_idx=cuda.device_array((rows, candidates), np.int32, stream=stream),
        linear_rows=cuda.to_device(np.zeros(rows + 2, np.int32), stream=stream),
        hist_rows=cuda.to_device(np.zeros(rows + 2, np.int32), stream=stream),
        max_rows=max_rows,
        vocab=vocab,
    )


def chunking(rows: int, vocab: int) -> tuple[int, int]:
    """(chunks a row, logits a chunk): about TARGET_BLOCKS blocks in all, at least one a row,
    chunks of at least MIN_CHUNK logits, a multiple of the block's threads."""
    chunks = max(1, min(cdiv(vocab, MIN_CHUNK), cdiv(TARGET_BLOCKS, rows)))
    chunk_len = cdiv(cdiv(vocab, chunks), THREADS) * THREADS
    return cdiv(vocab, chunk_len), chunk_len


def sample(
    logits, fparams, iparams, uparams, state, state_mask, scratch: SamplerScratch, out, stream=0,
    ring=None, ring_slot=None,
) -> None:  # fmt: skip
    """out[r] = the token sampled from logits[r] (float32 [n, V], modified in place: the
    penalties and bans land there) with row r's parameters, the same ids into
    ring[ring_slot[0]] where a ring is given (the host's mapped copy, as in argmax.py), and each
    sampled token counted in its state row (and its bit set in state_mask). Ten launches, no
    allocation, no sync: capturable into a CUDA graph."""
    rows, vocab = logits.shape
    if ring is None:
        ring, ring_slot = no_ring(out)
    if rows == 0:
        return
    if rows > scratch.max_rows or vocab != scratch.vocab:
        raise ValueError(f"scratch for {scratch.max_rows} x {scratch.vocab}, not {rows} x {vocab}")
    chunks, chunk_len = chunking(rows, vocab)
    grid = (rows, chunks)
    s = scratch
    scores_kernel[grid, THREADS, stream](
        logits, chunk_len, fparams, iparams, uparams, state, state_mask, s.ticket, s.best,
        s.winner, s.runners, s.rowf, s.rowi, s.hist, out, ring, ring_slot,
    )  # fmt: skip
    for digit in (1, 2):
        radix_count_kernel[grid, THREADS, stream](
            logits, chunk_len, digit, iparams, fparams, s.ticket, s.hist, s.rowf, s.rowi,
            s.cand_val, s.cand_idx,
        )  # fmt: skip
    linear_mass_kernel[grid, THREADS, stream](
        logits, chunk_len, fparams, s.ticket, s.hist, s.rowf, s.rowi, s.linear_rows, s.hist_rows
    )  # fmt: skip
    linear_hist_kernel[grid, THREADS, stream](
        logits, fparams, s.ticket, s.hist, s.rowf, s.rowi, s.linear_rows, s.hist_rows
    )  # fmt: skip
    linear_split_kernel[grid, THREADS, stream](
        logits, uparams, s.ticket, s.best, s.winner, s.rowf, s.rowi, s.cand_val, s.cand_idx,
        s.linear_rows,
    )  # fmt: skip
    for digit in (0, 1, 2):
        radix_mass_kernel[grid, THREADS, stream](
            logits, chunk_len, digit, iparams, fparams, s.ticket, s.hist, s.rowf, s.rowi,
            s.cand_val, s.cand_idx,
        )  # fmt: skip
    gumbel_kernel[grid, THREADS, stream](
        logits, chunk_len, iparams, uparams, state, state_mask, s.ticket, s.best, s.rowf, s.rowi,
        s.cand_val, s.cand_idx, out, ring, ring_slot,
    )  # fmt: skip
