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
logits), and the thresholds are found by radix select in 3 passes each.

The passes, each a kernel (always the same seven, shapes from n and V only: no host sync, one
CUDA graph; THREADS threads a block, which the histogram loops assume):

1. scores_kernel: bans and penalties from the state (spec step 1), greedy argmax or x / T.
   Greedy rows and temperature-only rows finish here: each block offers its best (value,
   index) packed into one int64 (ordered key << 31 | (2**31 - 1 - index), so the max is the
   largest value at the smallest index) by atomic max to the row's slot, and the row's last
   block (below) writes out / ring and counts the token in the state (step 4). Truncating rows
   (min_p, top_k or top_p) offer their max; the last block stores the max and the min_p bound
   (score >= max + log(min_p), float32). Later passes read the scores as logits / scale: rows
   with a token state write their penalised, scaled scores back (scale 1: one 4-byte write
   instead of a 2-byte state read in every later pass), the others leave the logits as they
   are and divide again (scale = T, the same float32 division: the same scores; at batch 256
   the write-back would cost a full pass of HBM bandwidth, ~45 us for 131 MB). Top-k rows
   count their first radix digit here (below).
2. radix_count_kernel x 2 (digits 1 and 2 of 11, 11, 10 bits): top-k. The k-th largest kept
   score is found over the order-preserving integer keys of the scaled scores
   (bf16.ordered_key): each pass counts the kept keys whose higher digits match the prefix
   found so far into a shared 2048-bin histogram, adds it into the row's global histogram,
   and the last block picks the bin where the count from the top reaches k. The first digit
   (the key's top 11 bits) is counted in pass 1, over every finite score, before the min_p
   bound is known: that is exact all the same (see scores_kernel), and saves a pass over the
   row. After the third digit the key is exact: kth.
3. radix_mass_kernel x 3: top-p, the same search with masses exp(s - max) of the scores kept
   by min_p and top_k, in fixed point (int64, MASS_SCALE units: exact and order-independent
   sums, so every run decides the same way). The first digit's total is the kept mass (the
   twin's normaliser); the bin where the mass from the top reaches top_p of it holds the cut
   key K. The probability is monotone in the score, so {p >= t} is an upper set of scores:
   with t = p(s_K) = float32(exp(s_K - max)) / Z, the final pass keeps every score whose p >= t,
   ties included, exactly the twin's rule.
4. gumbel_kernel: Gumbel-max over what the thresholds keep, the last block finishes the row.

Candidates: after the first digit of either search picks bin B, nothing below B can be kept
(top-k keeps a subset of bins >= B_k, top-p after it a subset of those, and the draw a subset
of what both keep; top-p's bins >= B_p hold its whole nucleus, and its normaliser Z was summed
over the whole row in the first digit). So the second digit's pass also copies every kept
score of bins >= B (score as stored and token id, through a per-row atomic counter) into the
row's candidate buffer; if they fit (CANDIDATES, 8,192 a row), the row turns compact and every
later pass (the last digit, the other search, the draw) reads the copy instead of the row:
top-k + top-p reads the full row in 2 passes instead of 8, top-p alone in 3 instead of 5
(~45 us each at batch 256 x 128,256, from HBM). A row whose bins >= B overflow the buffer (a
flat distribution, a vocabulary of equal logits) keeps reading the logits: the same results.

Rows a pass has nothing to do for (an inactive phase) return at once: a temperature-only step
still launches all seven kernels, the last six of them empty blocks.

Cross-block results use the "last block done" pattern: a block adds its histogram (or offers
its max) with device atomics, fences, and takes a ticket from the row's counter; the block
that takes the last ticket reads the row's result with atomic exchanges (which reset the
histogram and slot for the next pass, and never see a stale L1 line), resets the ticket and
writes the row's threshold state for the next kernel.

Scratch (SamplerScratch, allocated once by sampler_scratch, ~80 KB a row: 20 MB at 256 rows):
the tickets, the packed-max slots and the [rows, 2048] int64 histogram, all left zeroed (or
-1) by the last blocks, the per-row thresholds (rowf: max, min_p bound, kth, top-p t, Z,
scale; rowi: mode, prefix, remaining count or mass, candidates), and the candidate buffers
(64 KB a row).

Ties: argmax and Gumbel-max take the smallest index among equal values (np.argmax); top-k and
top-p keep every score tied at the edge. Results may differ from numpy only where float
rounding decides a tie at a threshold (GPU expf / logf vs numpy's, the fixed-point masses).

Row parameters: fparams [6, rows+1] f32 (F_*), iparams [3, rows+1] i32 (I_*), uparams [2, rows]
u64 (U_*); state [max_rows, vocab] uint16.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import cuda, float32, float64, int32, int64, uint16, uint64

from gpu.kernels.bf16 import key_to_f32, ordered_key
from gpu.kernels.block_reduce import block_max
from gpu.kernels.launch import MAX_THREADS, SIMULATOR, cdiv, device_function, no_ring, threads
from gpu.kernels.pdl import grid_dependency_sync
from gpu.sampling.rng import MIX1, MIX2, SEED_MUL, STEP_MUL, TOKEN_MUL

NEG_INF = float32(-math.inf)
# The token state's cells (gpu/sampling/token_state.py).
PROMPT_BIT = 0x8000
BAN_BIT = 0x4000
COUNT_MASK = 0x3FFF
F_TEMPERATURE, F_TOP_P, F_MIN_P, F_REPETITION, F_PRESENCE, F_FREQUENCY = range(6)
I_TOP_K, I_STATE_ROW, I_BAN_ACTIVE = range(3)
U_SEED, U_STEP = range(2)

THREADS = threads(256)
MIN_CHUNK = 4 * THREADS  # logits a block at least
TARGET_BLOCKS = 264  # two blocks per SM of an H100 for small batches
BINS = 2048  # the first two digits have 11 bits, the last 10
BINS_PER_THREAD = BINS // THREADS  # (the kernels run THREADS threads a block)
UNROLL = 4  # logits a thread loads at once (a chunk of MIN_CHUNK: one group)
MASS_SCALE = float64(2.0**44)  # fixed-point unit of top-p masses (sums < 2**63 for V < 2**19)
SLOTS = MAX_THREADS // 32  # block_max's scratch (a slot per warp; 32 threads in the simulator)
# rowf rows
R_MAX, R_MIN_BOUND, R_KTH, R_P_T, R_Z, R_SCALE = range(6)
# rowi rows
R_MODE, R_PREFIX, R_REMAIN, R_COUNT, R_DIGIT = range(5)
# mode bits
MODE_TRUNCATE, MODE_TOP_K, MODE_TOP_P, MODE_COMPACT = 1, 2, 4, 8
CANDIDATES = 8192  # scores a row's copy holds (SamplerScratch.cand_val)
NONE = -1  # the packed-max slot's empty value

_STATE = "uint16[:, ::1]"
_SCRATCH = "int32[::1], int64[::1], float32[:, ::1], int64[:, ::1]"
_CANDIDATES = "float32[:, ::1], int32[:, ::1]"
SIGNATURES = {
    "scores_kernel": [
        "void(float32[:, ::1], int64, float32[:, ::1], int32[:, ::1], uint64[:, ::1],"
        f" {_STATE}, {_SCRATCH}, int64[:, ::1], int32[::1], int32[:, ::1], int32[::1])"
    ],
    "radix_count_kernel": [
        "void(float32[:, ::1], int64, int64, int32[:, ::1], float32[:, ::1],"
        f" int32[::1], int64[:, ::1], float32[:, ::1], int64[:, ::1], {_CANDIDATES})"
    ],
    "radix_mass_kernel": [
        "void(float32[:, ::1], int64, int64, int32[:, ::1], float32[:, ::1],"
        f" int32[::1], int64[:, ::1], float32[:, ::1], int64[:, ::1], {_CANDIDATES})"
    ],
    "gumbel_kernel": [
        "void(float32[:, ::1], int64, int32[:, ::1], uint64[:, ::1],"
        f" {_STATE}, {_SCRATCH}, {_CANDIDATES}, int32[::1], int32[:, ::1], int32[::1])"
    ],
}

if SIMULATOR:
    _MASK64 = (1 << 64) - 1

    def uniform(seed, step, token):
        """rng.uniform_from_counter for one token, in Python integers (no overflow warnings)."""
        x = int(seed) * int(SEED_MUL) + int(step) * int(STEP_MUL) + int(token) * int(TOKEN_MUL)
        x &= _MASK64
        x ^= x >> 30
        x = (x * int(MIX1)) & _MASK64
        x ^= x >> 27
        x = (x * int(MIX2)) & _MASK64
        x ^= x >> 31
        return (np.float32(x >> 41) + np.float32(0.5)) / np.float32(2**23)

else:

    @device_function
    def uniform(seed, step, token):
        """rng.uniform_from_counter for one token: uint64 arithmetic wraps as numpy's does; 23
        bits plus one half over 2**23, exact in float32, so never 0 or 1."""
        x = seed * SEED_MUL + step * STEP_MUL + uint64(token) * TOKEN_MUL
        x ^= x >> uint64(30)
        x *= MIX1
        x ^= x >> uint64(27)
        x *= MIX2
        x ^= x >> uint64(31)
        return (float32(x >> uint64(41)) + float32(0.5)) / float32(8388608.0)


@device_function
def gumbel(seed, step, token):
    """Gumbel(0, 1) noise of one token: -log(-log(u)), float32."""
    return -math.log(-math.log(float32(uniform(seed, step, token))))


@device_function
def finite(x):
    return x > NEG_INF and x < -NEG_INF


@device_function
def kept(x, min_bound, kth):
    """A finite score above the min_p bound and the top-k threshold."""
    return finite(x) and x >= min_bound and x >= kth


@device_function
def pack(x, v):
    """(value, index) as one non-negative int64 whose max is the largest value at the smallest
    index (index < 2**31)."""
    return (int64(ordered_key(x)) << 31) | int64(0x7FFFFFFF - v)


@device_function
def packed_index(packed):
    """The index of a packed max; 0 for an empty slot (np.argmax of nothing kept)."""
    if packed < 0:
        return int32(0)
    return int32(0x7FFFFFFF - (packed & 0x7FFFFFFF))


@device_function
def apply_state(x, cell, ban, repetition, presence, frequency):
    """Spec step 1 on one logit with its state cell (an int32 of the uint16)."""
    if ban and (cell & BAN_BIT) != 0:
        x = NEG_INF
    c = cell & COUNT_MASK
    if repetition != 1 and ((cell & PROMPT_BIT) != 0 or c > 0):
        x = x / repetition if x > 0 else x * repetition
    n = float32(c)
    return x - (frequency * n + presence * (float32(1.0) if c > 0 else float32(0.0)))


@device_function
def last_block(ticket, row, flag):
    """Take the row's ticket after this block's results are out (every thread calls it);
    True in the block that takes the last ticket, which then resets the counter."""
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        cuda.threadfence()
        flag[0] = int32(cuda.atomic.add(ticket, row, int32(1)) == cuda.gridDim.y - 1)
        if flag[0]:
            ticket[row] = 0
            cuda.threadfence()
    cuda.syncthreads()
    return flag[0] != 0


@device_function
def finish_row(row, packed, state_row, state, out, ring, ring_slot):
    """The row's token (from its packed max) to out and the host ring; spec step 4."""
    tok = packed_index(packed)
    out[row] = tok
    ring[ring_slot[0], row] = tok
    if state_row >= 0:
        cell = int32(state[state_row, tok])
        if (cell & COUNT_MASK) < COUNT_MASK:
            state[state_row, tok] = uint16(cell + 1)


@device_function
def score_candidate(logits, row, v, x, greedy, truncate, prescale, temperature, seed, step):
    """Pass 1 after the state: a greedy row's logit, a temperature row's noisy score, or a
    truncating row's scaled score (written back where the state changed it), packed; NONE for
    a non-finite score."""
    if not greedy:
        x = x / temperature
        if truncate:
            if prescale:
                logits[row, v] = x
        elif finite(x):
            x = x + gumbel(seed, step, v)
    if greedy or finite(x):
        return pack(x, v)
    return int64(NONE)


@cuda.jit(cache=True)
def scores_kernel(
    logits, chunk_len, fparams, iparams, uparams, state, ticket, best, rowf, rowi, hist, out,
    ring, ring_slot,
):  # fmt: skip
    grid_dependency_sync()
    buf = cuda.shared.array(SLOTS, int64)
    flag = cuda.shared.array(1, int32)
    hs = cuda.shared.array(BINS, int64)
    scan = cuda.shared.array(THREADS, int64)
    sel = cuda.shared.array(2, int64)
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    start = cuda.blockIdx.y * chunk_len
    end = min(start + chunk_len, logits.shape[1])
    temperature = fparams[F_TEMPERATURE, row]
    top_p = fparams[F_TOP_P, row]
    min_p = fparams[F_MIN_P, row]
    repetition = fparams[F_REPETITION, row]
    presence = fparams[F_PRESENCE, row]
    frequency = fparams[F_FREQUENCY, row]
    top_k = iparams[I_TOP_K, row]
    state_row = iparams[I_STATE_ROW, row]
    ban = iparams[I_BAN_ACTIVE, row] != 0
    seed = uparams[U_SEED, row]
    step = uparams[U_STEP, row]
    greedy = temperature == 0
    truncate = not greedy and (min_p > 0 or top_k > 0 or top_p < 1)
    fold = truncate and top_k > 0  # top-k's first digit, counted here (see the docstring)
    if fold:
        for b in range(tid, BINS, cuda.blockDim.x):
            hs[b] = 0
        cuda.syncthreads()

    cand = int64(NONE)
    xs = cuda.local.array(UNROLL, float32)
    cells = cuda.local.array(UNROLL, int32)
    nt = cuda.blockDim.x
    for base in range(start + tid, end, nt * UNROLL):
        for u in range(UNROLL):  # every load of the group in flight at once
            v = min(base + u * nt, end - 1)
            xs[u] = logits[row, v]
            if state_row >= 0:
                cells[u] = int32(state[state_row, v])
        for u in range(UNROLL):
            v = base + u * nt
            if v < end:
                x = xs[u]
                if state_row >= 0:
                    x = apply_state(x, cells[u], ban, repetition, presence, frequency)
                c = score_candidate(
                    logits, row, v, x, greedy, truncate, state_row >= 0, temperature, seed, step
                )
                cand = max(cand, c)
                if fold and c >= 0:  # a finite scaled score: its key's top 11 bits
                    cuda.atomic.add(hs, c >> 52, int64(1))
    cand = block_max(buf, cand)
    if tid == 0 and cand >= 0:
        cuda.atomic.max(best, row, cand)
    if fold:
        for b in range(tid, BINS, cuda.blockDim.x):
            if hs[b] != 0:
                cuda.atomic.add(hist, (row, b), hs[b])
    if not last_block(ticket, row, flag):
        return
    if tid == 0:
        packed = cuda.atomic.exch(best, row, int64(NONE))
        if not truncate:
            rowi[R_MODE, row] = 0
            finish_row(row, packed, state_row, state, out, ring, ring_slot)
        else:
            top = key_to_f32(packed >> 31) if packed >= 0 else NEG_INF
            rowf[R_MAX, row] = top
            rowf[R_MIN_BOUND, row] = top + float32(math.log(min_p)) if min_p > 0 else NEG_INF
            rowf[R_KTH, row] = NEG_INF
            rowf[R_P_T, row] = 0
            rowf[R_Z, row] = 1
            rowf[R_SCALE, row] = 1 if state_row >= 0 else temperature
            mode = MODE_TRUNCATE
            if top_k > 0:
                mode |= MODE_TOP_K
            if top_p < 1:
                mode |= MODE_TOP_P
            rowi[R_MODE, row] = mode
            rowi[R_PREFIX, row] = 0
            rowi[R_REMAIN, row] = 0
            rowi[R_COUNT, row] = 0
            rowi[R_DIGIT, row] = 0
    if not fold:
        return
    # Top-k's first digit, over every finite score (the min_p bound is not known yet). Exact
    # for the kept scores all the same: they are an upper set of the finite ones, so if at
    # least k are kept the k-th largest is the same score; if fewer are, no kept score lies in
    # the chosen bin or below it (or every finite score above the bin would be kept, k of
    # them), and the next digit, which counts kept scores only, finds no k-th: nothing is cut.
    total = read_histogram(hist, row, BINS, hs, scan)
    find_bin(hs, BINS, scan, int64(top_k), sel)
    if tid == 0:
        if total <= top_k:  # no more finite scores than k: nothing to cut
            rowi[R_MODE, row] = rowi[R_MODE, row] & ~MODE_TOP_K
        else:
            rowi[R_PREFIX, row] = sel[0] << 21
            rowi[R_REMAIN, row] = top_k - sel[1]
            rowi[R_DIGIT, row] = 1


@device_function
def block_share(rowi, row, compact, chunk_len, vocab):
    """[start, end) of this block's part of the row: its chunk of the logits, or an equal slice
    of the row's copied candidates once the row is compact."""
    if compact:
        n = rowi[R_COUNT, row]
        per = (n + cuda.gridDim.y - 1) // cuda.gridDim.y
        start = cuda.blockIdx.y * per
        return start, min(start + per, n)
    start = cuda.blockIdx.y * chunk_len
    return start, min(start + chunk_len, vocab)


@device_function
def load(logits, cand_val, cand_idx, row, j, compact, xs, vs, u):
    """Element j of the block's share into xs[u] (score as stored) and vs[u] (its token id)."""
    if compact:
        xs[u] = cand_val[row, j]
        vs[u] = cand_idx[row, j]
    else:
        xs[u] = logits[row, j]
        vs[u] = j


@device_function
def read_histogram(hist, row, bins, hs, scan):
    """The row's global histogram into hs (and zeroed for the next pass: all of a thread's
    atomic exchanges issued before any result is stored, one round trip to L2); then scan[t]
    holds the sum of the bins of threads 0..t, thread t taking bins//nt bins from the top
    down. Returns the total. Every thread of the block calls it."""
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    got = cuda.local.array(BINS_PER_THREAD, int64)
    for k in range(BINS_PER_THREAD):
        b = tid + k * nt
        if b < bins:
            got[k] = cuda.atomic.exch(hist, (row, b), int64(0))
    for k in range(BINS_PER_THREAD):
        b = tid + k * nt
        if b < bins:
            hs[b] = got[k]
    cuda.syncthreads()
    per = bins // nt
    mine = int64(0)
    for j in range(tid * per, tid * per + per):
        mine += hs[bins - 1 - j]
    inclusive_scan(scan, mine)
    return scan[nt - 1]


@device_function
def find_bin(hs, bins, scan, remain, sel):
    """sel[0] = the bin where the sum from the top reaches remain (-1: never), sel[1] = the
    sum of the bins above it (after read_histogram; every thread calls it)."""
    tid = cuda.threadIdx.x
    per = bins // cuda.blockDim.x
    upto = scan[tid]
    below = scan[tid - 1] if tid > 0 else int64(0)
    if tid == 0:
        sel[0] = -1
    cuda.syncthreads()
    if below < remain and remain <= upto:
        run = below
        for j in range(tid * per, tid * per + per):
            weight = hs[bins - 1 - j]
            if run + weight >= remain:
                sel[0] = bins - 1 - j
                sel[1] = run
                break
            run += weight
    cuda.syncthreads()


@device_function
def inclusive_scan(scan, value):
    """Hillis-Steele inclusive prefix sum over the block (scan: shared, blockDim.x slots)."""
    tid = cuda.threadIdx.x
    scan[tid] = value
    cuda.syncthreads()
    offset = 1
    while offset < cuda.blockDim.x:
        other = scan[tid - offset] if tid >= offset else int64(0)
        cuda.syncthreads()
        scan[tid] += other
        cuda.syncthreads()
        offset *= 2
    return scan[tid]


def _radix_kernel(use_mass: bool):
    """One digit of the top-k (counts) or top-p (masses) radix select; see the docstring."""
    phase = MODE_TOP_P if use_mass else MODE_TOP_K

    def kernel(
        logits, chunk_len, digit, iparams, fparams, ticket, hist, rowf, rowi, cand_val, cand_idx
    ):
        grid_dependency_sync()
        row = cuda.blockIdx.x
        mode = rowi[R_MODE, row]
        if (mode & phase) == 0 or rowi[R_DIGIT, row] != digit:
            return
        compact = (mode & MODE_COMPACT) != 0
        compacting = digit == 1 and not compact  # copy the candidates out in this pass
        hs = cuda.shared.array(BINS, int64)
        scan = cuda.shared.array(THREADS, int64)
        sel = cuda.shared.array(2, int64)
        flag = cuda.shared.array(1, int32)
        tid = cuda.threadIdx.x
        nt = cuda.blockDim.x
        high = 32 - 11 * digit  # the digit is bits [shift, high) of the key
        shift = max(high - 11, 0)
        bins = 1 << (high - shift)
        high_mask = ((0xFFFFFFFF >> high) << high) if high < 32 else 0
        prefix = rowi[R_PREFIX, row] if digit > 0 else int64(0)
        top = rowf[R_MAX, row]
        min_bound = rowf[R_MIN_BOUND, row]
        kth = rowf[R_KTH, row]
        scale = rowf[R_SCALE, row]
        for b in range(tid, bins, nt):
            hs[b] = 0
        cuda.syncthreads()
        start, end = block_share(rowi, row, compact, chunk_len, logits.shape[1])
        capacity = cand_val.shape[1]
        xs = cuda.local.array(UNROLL, float32)
        vs = cuda.local.array(UNROLL, int32)
        for base in range(start + tid, end, nt * UNROLL):
            for u in range(UNROLL):
                load(
                    logits, cand_val, cand_idx, row, min(base + u * nt, end - 1), compact, xs, vs, u
                )
            for u in range(UNROLL):
                x = xs[u] / scale
                if base + u * nt < end and kept(x, min_bound, kth):
                    key = int64(ordered_key(x))
                    if compacting and (key >> 21) >= (prefix >> 21):
                        slot = cuda.atomic.add(rowi, (R_COUNT, row), 1)
                        if slot < capacity:
                            cand_val[row, slot] = xs[u]  # as stored: read / scale again
                            cand_idx[row, slot] = vs[u]
                    if (key & high_mask) == prefix:
                        if use_mass:
                            e = float32(math.exp(x - top))
                            weight = int64(float64(e) * MASS_SCALE + 0.5)
                        else:
                            weight = int64(1)
                        cuda.atomic.add(hs, (key >> shift) & (bins - 1), weight)
        cuda.syncthreads()
        for b in range(tid, bins, nt):
            if hs[b] != 0:
                cuda.atomic.add(hist, (row, b), hs[b])
        if not last_block(ticket, row, flag):
            return
        total = read_histogram(hist, row, bins, hs, scan)
        if digit == 0:  # top-p only: top-k's first digit is counted in pass 1
            remain = max(int64(math.ceil(float64(fparams[F_TOP_P, row]) * total)), 1)
        else:
            remain = rowi[R_REMAIN, row]
        find_bin(hs, bins, scan, remain, sel)
        if tid != 0:
            return
        if digit == 0:
            rowf[R_Z, row] = float32(float64(total) / MASS_SCALE)
        done = sel[0] < 0
        if compacting:
            # Every score this phase can keep (and the next phases and the draw: they keep
            # fewer) is in the copied bins; from now on the row's passes read the copy.
            if not done and cuda.atomic.add(rowi, (R_COUNT, row), 0) <= capacity:
                mode |= MODE_COMPACT
            else:
                rowi[R_COUNT, row] = 0  # too many: the row stays on the logits
        if done:  # nothing to cut: all the kept scores stay
            rowi[R_MODE, row] = mode & ~phase
            rowi[R_DIGIT, row] = 0
            return
        prefix |= sel[0] << shift
        rowi[R_PREFIX, row] = prefix
        rowi[R_REMAIN, row] = remain - sel[1]
        rowi[R_MODE, row] = mode
        rowi[R_DIGIT, row] = digit + 1
        if shift == 0:
            rowi[R_MODE, row] = mode & ~phase
            rowi[R_DIGIT, row] = 0
            cut = key_to_f32(prefix)
            if use_mass:
                rowf[R_P_T, row] = float32(math.exp(cut - top)) / rowf[R_Z, row]
            else:
                rowf[R_KTH, row] = cut

    kernel.__name__ = kernel.__qualname__ = (
        "radix_mass_kernel" if use_mass else "radix_count_kernel"
    )
    return cuda.jit(cache=True)(kernel)


radix_count_kernel = _radix_kernel(False)
radix_mass_kernel = _radix_kernel(True)


@cuda.jit(cache=True)
def gumbel_kernel(
    logits, chunk_len, iparams, uparams, state, ticket, best, rowf, rowi, cand_val, cand_idx, out,
    ring, ring_slot,
):  # fmt: skip
    grid_dependency_sync()
    row = cuda.blockIdx.x
    mode = rowi[R_MODE, row]
    if (mode & MODE_TRUNCATE) == 0:
        return
    compact = (mode & MODE_COMPACT) != 0
    buf = cuda.shared.array(SLOTS, int64)
    flag = cuda.shared.array(1, int32)
    tid = cuda.threadIdx.x
    seed = uparams[U_SEED, row]
    step = uparams[U_STEP, row]
    top = rowf[R_MAX, row]
    min_bound = rowf[R_MIN_BOUND, row]
    kth = rowf[R_KTH, row]
    p_t = rowf[R_P_T, row]
    z = rowf[R_Z, row]
    scale = rowf[R_SCALE, row]
    start, end = block_share(rowi, row, compact, chunk_len, logits.shape[1])
    cand = int64(NONE)
    xs = cuda.local.array(UNROLL, float32)
    vs = cuda.local.array(UNROLL, int32)
    nt = cuda.blockDim.x
    for base in range(start + tid, end, nt * UNROLL):
        for u in range(UNROLL):
            load(logits, cand_val, cand_idx, row, min(base + u * nt, end - 1), compact, xs, vs, u)
        for u in range(UNROLL):
            x = xs[u] / scale
            v = vs[u]
            if base + u * nt < end and kept(x, min_bound, kth):
                if p_t == 0 or float32(math.exp(x - top)) / z >= p_t:
                    cand = max(cand, pack(x + gumbel(seed, step, v), v))
    cand = block_max(buf, cand)
    if tid == 0 and cand >= 0:
        cuda.atomic.max(best, row, cand)
    if last_block(ticket, row, flag) and tid == 0:
        packed = cuda.atomic.exch(best, row, int64(NONE))
        finish_row(row, packed, iparams[I_STATE_ROW, row], state, out, ring, ring_slot)


@dataclass
class SamplerScratch:
    """Every device buffer the sampler's passes need (see the module docstring)."""

    ticket: object  # int32 [max_rows]: blocks of the row done with the current pass
    best: object  # int64 [max_rows]: the packed max of the current pass (NONE when idle)
    rowf: object  # float32 [6, max_rows]: R_MAX, R_MIN_BOUND, R_KTH, R_P_T, R_Z, R_SCALE
    rowi: object  # int64 [5, max_rows]: R_MODE, R_PREFIX, R_REMAIN, R_COUNT, R_DIGIT
    hist: object  # int64 [max_rows, BINS]: the row's radix histogram (zero when idle)
    cand_val: object  # float32 [max_rows, candidates]: a compact row's scores (as stored)
    cand_idx: object  # int32 [max_rows, candidates]: ... and their token ids
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
        rowf=cuda.to_device(np.zeros((6, rows), np.float32), stream=stream),
        rowi=cuda.to_device(np.zeros((5, rows), np.int64), stream=stream),
        hist=cuda.to_device(np.zeros((rows, BINS), np.int64), stream=stream),
        cand_val=cuda.device_array((rows, candidates), np.float32, stream=stream),
        cand_idx=cuda.device_array((rows, candidates), np.int32, stream=stream),
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
    logits, fparams, iparams, uparams, state, scratch: SamplerScratch, out, stream=0, ring=None,
    ring_slot=None,
) -> None:  # fmt: skip
    """out[r] = the token sampled from logits[r] (float32 [n, V], modified in place) with row
    r's parameters, the same ids into ring[ring_slot[0]] where a ring is given (the host's
    mapped copy, as in argmax.py), and each sampled token counted in its state row. Seven
    launches, no allocation, no sync: capturable into a CUDA graph."""
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
        logits, chunk_len, fparams, iparams, uparams, state, s.ticket, s.best, s.rowf, s.rowi,
        s.hist, out, ring, ring_slot,
    )  # fmt: skip
    for kernel, digits in ((radix_count_kernel, (1, 2)), (radix_mass_kernel, (0, 1, 2))):
        for digit in digits:
            kernel[grid, THREADS, stream](
                logits, chunk_len, digit, iparams, fparams, s.ticket, s.hist, s.rowf, s.rowi,
                s.cand_val, s.cand_idx,
            )  # fmt: skip
    gumbel_kernel[grid, THREADS, stream](
        logits, chunk_len, iparams, uparams, state, s.ticket, s.best, s.rowf, s.rowi, s.cand_val,
        s.cand_idx, out, ring, ring_slot,
    )  # fmt: skip
