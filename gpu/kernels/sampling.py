"""The sampler on the device: one block per row of logits, per-row parameters, no sort.

It reproduces gpu/sampling/numpy_sampler.py (the numpy twin, `sample`), in vLLM's order:

1. banned ids (min_tokens: EOS and stop ids) -> -inf;
2. penalties on the raw logits, for tokens of the row's history: repetition (seen in prompt or
   output: positive logits divided, negative multiplied), then frequency * count + presence *
   (count > 0) subtracted for output tokens. The history is counted first by a small kernel
   (penalty_counts_kernel: atomics into a [rows, vocab] int32 scratch, prompt tokens flagged by
   bit 30); the sampler reads each count once and zeroes it again, so the scratch is clean for
   the next step without a memset;
3. greedy rows (temperature 0) take the argmax (first index of the maximum);
4. the rest divide by the temperature, keep finite scores and, with min_p, those with
   score >= max + log(min_p) (float32, as numpy computes it);
5. top_k keeps every score >= the k-th largest kept score (ties at the edge all stay). The k-th
   largest is found without sorting: a binary search over the 2**32 order-preserving integer
   keys of float32 (bf16.ordered_key) for the largest key with at least k kept scores at or
   above it — 32 counting passes, exact;
6. top_p keeps every probability >= t, for the largest t whose kept mass reaches top_p of the
   total (probabilities renormalised over what steps 4-5 kept, in float32 as numpy does; mass in
   float64). Again a binary search, over the bits of the positive float32 probabilities: each
   pass sums the mass at or above a candidate;
7. Gumbel-max: argmax(score + g) over what is kept, g = -log(-log(u)) with u from the same
   counter-based integer hash as gpu/sampling/rng.py (splitmix64's finaliser of seed, step and
   token id), so the CPU and the GPU draw identical uniforms for a request whatever its batch.

Rows that are greedy, or that only have a temperature, read their logits once (steps 1-3 or
1, 2 and 7 fused in one pass). Truncating rows write their scaled scores back in place and
re-read them for each search pass (L2-resident: 0.5 MB a row at Llama-3's vocabulary).
Results may differ from numpy only where float rounding decides a tie at a threshold.
The logits rows are modified in place (bans, penalties, scaling).

Row parameters live in three device arrays (the executor fills them from pinned staging):
fparams [6, rows+1] f32: temperature, top_p, min_p, repetition, presence, frequency;
iparams [4, rows+1] i32: top_k, banned offsets, history offsets, prompt lengths;
uparams [2, rows] u64: seed, step.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, float64, int32, uint64

from gpu.kernels.bf16 import f32_bits, key_to_f32, ordered_key
from gpu.kernels.block_reduce import block_argmax, block_sum
from gpu.kernels.launch import MAX_THREADS, SIMULATOR, device_function, no_ring, threads
from gpu.kernels.pdl import grid_dependency_sync
from gpu.sampling.rng import MIX1, MIX2, SEED_MUL, STEP_MUL, TOKEN_MUL

NEG_INF = float32(-math.inf)
PROMPT_BIT = np.int32(1 << 30)
COUNT_MASK = np.int32((1 << 30) - 1)
F_TEMPERATURE, F_TOP_P, F_MIN_P, F_REPETITION, F_PRESENCE, F_FREQUENCY = range(6)
I_TOP_K, I_BANNED, I_HISTORY, I_PROMPT_LEN = range(4)
U_SEED, U_STEP = range(2)

SIGNATURES = {
    "sample_kernel": [
        "void(float32[:, ::1], float32[:, ::1], int32[:, ::1], uint64[:, ::1], int32[::1],"
        " int32[:, ::1], int32[::1], int32[:, ::1], int32[::1])"
    ],
    "penalty_counts_kernel": ["void(int32[::1], int32[:, ::1], int32[:, ::1])"],
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
        return (np.float32(x >> 40) + np.float32(0.5)) / np.float32(2**24)

else:

    @device_function
    def uniform(seed, step, token):
        """rng.uniform_from_counter for one token: uint64 arithmetic wraps as numpy's does."""
        x = seed * SEED_MUL + step * STEP_MUL + uint64(token) * TOKEN_MUL
        x ^= x >> uint64(30)
        x *= MIX1
        x ^= x >> uint64(27)
        x *= MIX2
        x ^= x >> uint64(31)
        return (float32(x >> uint64(40)) + float32(0.5)) / float32(16777216.0)


@device_function
def gumbel(seed, step, token):
    """Gumbel(0, 1) noise of one token: -log(-log(u)), float32."""
    return -math.log(-math.log(float32(uniform(seed, step, token))))


@device_function
def kept(x, min_bound, kth):
    """Steps 4-5: a finite score above the min_p bound and the top-k threshold."""
    return x > NEG_INF and x < -NEG_INF and x >= min_bound and x >= kth


@cuda.jit(cache=True)
def penalty_counts_kernel(history, iparams, counts):
    """counts[row, tok] += 1 per output occurrence; |= PROMPT_BIT for prompt tokens."""
    grid_dependency_sync()
    row = cuda.blockIdx.x
    vocab = counts.shape[1]
    start = iparams[I_HISTORY, row]
    end = iparams[I_HISTORY, row + 1]
    prompt_len = iparams[I_PROMPT_LEN, row]
    for i in range(start + cuda.threadIdx.x, end, cuda.blockDim.x):
        tok = history[i]
        if tok >= 0 and tok < vocab:
            if i - start < prompt_len:
                cuda.atomic.or_(counts, (row, tok), PROMPT_BIT)
            else:
                cuda.atomic.add(counts, (row, tok), int32(1))


@cuda.jit(cache=True)
def sample_kernel(logits, fparams, iparams, uparams, banned, counts, out, ring, ring_slot):
    grid_dependency_sync()
    fbuf = cuda.shared.array(MAX_THREADS, float32)
    ibuf = cuda.shared.array(MAX_THREADS, int32)
    dbuf = cuda.shared.array(MAX_THREADS, float64)
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    vocab = logits.shape[1]
    temperature = fparams[F_TEMPERATURE, row]
    top_p = fparams[F_TOP_P, row]
    min_p = fparams[F_MIN_P, row]
    repetition = fparams[F_REPETITION, row]
    presence = fparams[F_PRESENCE, row]
    frequency = fparams[F_FREQUENCY, row]
    top_k = iparams[I_TOP_K, row]
    seed = uparams[U_SEED, row]
    step = uparams[U_STEP, row]

    # 1. banned ids
    for i in range(iparams[I_BANNED, row] + tid, iparams[I_BANNED, row + 1], nt):
        tok = banned[i]
        if tok >= 0 and tok < vocab:
            logits[row, tok] = NEG_INF
    cuda.syncthreads()

    use_counts = iparams[I_HISTORY, row + 1] > iparams[I_HISTORY, row]
    greedy = temperature == 0
    truncate = min_p > 0 or top_k > 0 or top_p < 1
    one_pass = greedy or not truncate

    # 2-3 (and 7 for temperature-only rows): one pass over the row.
    best = NEG_INF
    best_i = -1
    for v in range(tid, vocab, nt):
        x = logits[row, v]
        if use_counts:
            c = counts[row, v]
            if c != 0:
                counts[row, v] = 0
                if repetition != 1:
                    x = x / repetition if x > 0 else x * repetition
                n = float32(c & COUNT_MASK)
                x = x - (frequency * n + presence * (float32(1.0) if n > 0 else float32(0.0)))
        if not greedy:
            x = x / temperature
            if truncate:
                logits[row, v] = x
            elif kept(x, NEG_INF, NEG_INF):
                x = x + gumbel(seed, step, v)
            else:
                x = NEG_INF
        if best_i < 0 or x > best:
            best = x
            best_i = v
    best, best_i = block_argmax(fbuf, ibuf, best, best_i)
    if one_pass:
        if tid == 0:
            out[row] = best_i
            ring[ring_slot[0], row] = best_i
        return

    top = best
    # 4. min_p: p >= min_p * p_max  <=>  score >= max + log(min_p)
    min_bound = NEG_INF
    if min_p > 0:
        min_bound = top + float32(math.log(min_p))
    # 5. top_k: the k-th largest kept score, by binary search over order-preserving keys.
    kth = NEG_INF
    if top_k > 0:
        count = 0
        for v in range(tid, vocab, nt):
            if kept(logits[row, v], min_bound, NEG_INF):
                count += 1
        num_kept = block_sum(ibuf, count)
        if top_k < num_kept:
            lo = 0  # invariant: >= top_k kept keys at or above lo, fewer at or above hi
            hi = 1 << 32
            while hi - lo > 1:
                mid = (lo + hi) // 2
                count = 0
                for v in range(tid, vocab, nt):
                    x = logits[row, v]
                    if kept(x, min_bound, NEG_INF) and ordered_key(x) >= mid:
                        count += 1
                if block_sum(ibuf, count) >= top_k:
                    lo = mid
                else:
                    hi = mid
            kth = key_to_f32(lo)
    # 6. top_p: the largest probability t whose kept mass {p >= t} reaches top_p.
    p_key = 0
    z = float32(1.0)
    if top_p < 1:
        part = float32(0.0)
        for v in range(tid, vocab, nt):
            x = logits[row, v]
            if kept(x, min_bound, kth):
                part += math.exp(x - top)
        z = block_sum(fbuf, part)
        mass = float64(0.0)
        for v in range(tid, vocab, nt):
            x = logits[row, v]
            if kept(x, min_bound, kth):
                mass += float64(float32(math.exp(x - top)) / z)
        target = max(float64(top_p) * block_sum(dbuf, mass), 1e-300)
        lo = 0  # invariant: mass at or above key lo >= target, at or above hi < target
        hi = 0x7F800000
        while hi - lo > 1:
            mid = (lo + hi) // 2
            mass = float64(0.0)
            for v in range(tid, vocab, nt):
                x = logits[row, v]
                if kept(x, min_bound, kth):
                    p = float32(math.exp(x - top)) / z
                    if f32_bits(p) >= mid:
                        mass += float64(p)
            if block_sum(dbuf, mass) >= target:
                lo = mid
            else:
                hi = mid
        p_key = lo
    # 7. Gumbel-max over what is kept.
    best = NEG_INF
    best_i = -1
    for v in range(tid, vocab, nt):
        x = logits[row, v]
        if kept(x, min_bound, kth) and (
            top_p >= 1 or f32_bits(float32(math.exp(x - top)) / z) >= p_key
        ):
            x = x + gumbel(seed, step, v)
            if best_i < 0 or x > best:
                best = x
                best_i = v
    best, best_i = block_argmax(fbuf, ibuf, best, best_i)
    if tid == 0:
        out[row] = best_i
        ring[ring_slot[0], row] = best_i


def penalty_counts(history, iparams, counts, num_rows: int, stream=0) -> None:
    """Count each row's token history into counts [rows, V] (which must start zeroed)."""
    if num_rows:
        penalty_counts_kernel[num_rows, threads(256), stream](history, iparams, counts)


def sample(
    logits, fparams, iparams, uparams, banned, counts, out, stream=0, ring=None, ring_slot=None
) -> None:
    """out[r] = the token sampled from logits[r] (modified in place) with row r's parameters;
    the same ids into ring[ring_slot[0]] where a ring is given (the host's mapped copy, as in
    argmax.py)."""
    if ring is None:
        ring, ring_slot = no_ring(out)
    if logits.shape[0]:
        sample_kernel[logits.shape[0], threads(1024), stream](
            logits, fparams, iparams, uparams, banned, counts, out, ring, ring_slot
        )
