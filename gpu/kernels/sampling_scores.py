"""Pass 1 of the sampler (sampling.py): bans and penalties, then greedy argmax or x * (1 / T).

scores_kernel applies the row's token state (spec step 1: bans, repetition, presence and
frequency penalties), then takes the greedy argmax or scales by the temperature: x * (1 / T),
1 / T rounded once a row, as the twin does (a multiply a score, not an IEEE division's ~10
instructions and slow-path check). Temperature-only rows draw their Gumbel-max here, the noise
only where a score can still win (sampling_common.noisy_offer), and so do top-p rows without
top-k, keeping their three best noisy scores: the first of them the thresholds keep is the token
(sampling_linear.py, sampling_draw.py). It costs the noise of a temperature row in this pass
(106.6 -> 154.3 us at batch 256 on an H100, with the noise bound of ~65 instructions a score
that noisy_offer has cut to ~27) and saves the split, the select and the draw's read of the row
for all but about one row in a thousand.

Each kind of row has a loop of its own (scan_scores, inlined with constant flags: a loop that
carried all the paths kept their registers and branches in every group), and the groups that
lie wholly in a block's share load at constant offsets from one address.
Greedy rows and temperature-only rows finish here: each block offers its best (value,
index) packed into one int64 (ordered key << 31 | (2**31 - 1 - index), so the max is the
largest value at the smallest index) by atomic max to the row's slot, and the row's last
block (sampling_common.last_block) writes out / ring and counts the token in the state (step
4). Truncating rows (min_p, top_k or top_p) offer their max; the last block stores the max and
the min_p bound (score >= max + log(min_p), float32). Later passes read the scores as logits *
scale (scale = 1 / T, the same float32 multiply: the same scores; writing the scaled scores back
would cost a full pass of HBM bandwidth at batch 256, ~45 us for 131 MB).

Penalties and bans are applied in place, before the loop: a row with a token state has seen a
few hundred ids, and the state's bit mask (a bit a nonzero cell, gpu/sampling/token_state.py)
names them, so each block patches its chunk's seen ids (patch_chunk: a 4-byte mask word for 32
logits, a cell read only where a bit is set) and every logit the loop reads is already its
penalised score. Reading the uint16 state beside every logit cost 2 bytes a logit here, and
the truncating rows then wrote their scaled scores back for the later passes (4 more): on an
H100 this pass took 228.5 us that way for penalties + top-p at batch 256, 136.8 patched (and
on 32-bit offsets, measured together).

Top-k rows count their first radix digit here (the key's top 11 bits, over every finite
score, before the min_p bound is known): exact all the same (see scores_kernel), and it saves
a pass over the row.
"""

from __future__ import annotations

import math

from numba import cuda, float32, int32, int64, uint32

from gpu.kernels.bf16 import key_to_f32, ordered_key
from gpu.kernels.block_reduce import block_max
from gpu.kernels.launch import device_function
from gpu.kernels.pdl import grid_dependency_sync
from gpu.kernels.sampling_common import (
    BAN_BIT,
    BINS,
    COUNT_MASK,
    F_FREQUENCY,
    F_MIN_P,
    F_PRESENCE,
    F_REPETITION,
    F_TEMPERATURE,
    F_TOP_P,
    GROUP,
    I_BAN_ACTIVE,
    I_STATE_ROW,
    I_TOP_K,
    MODE_EARLY,
    MODE_TOP_K,
    MODE_TOP_P,
    MODE_TRUNCATE,
    NEG_INF,
    NONE,
    PROMPT_BIT,
    R_COUNT,
    R_DIGIT,
    R_KTH,
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
    THREADS,
    U_SEED,
    U_STEP,
    UNROLL,
    finish_row,
    finite,
    group_loop,
    last_block,
    load_group,
    noisy_insert,
    noisy_offer,
    pack,
    row_key,
    seed_block_best,
    shared_offset,
    whole_groups_end,
)
from gpu.kernels.sampling_histogram import clear_bins, find_bin, flush_bins, read_histogram


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
def patch_chunk(logits, row, start, end, state, mask, state_row, ban, repetition, presence,
                frequency):  # fmt: skip
    """Spec step 1, in place, on the ids of logits[row, start:end] whose state cell is nonzero
    (their bits in the row's mask; start a multiple of 32): a word of the mask a thread at a
    time, and only its set bits read a cell. Every other logit is its own penalised score."""
    for w in range(start // 32 + cuda.threadIdx.x, (end + 31) // 32, cuda.blockDim.x):
        bits = mask[state_row, w]
        while bits != 0:
            v = w * 32 + (cuda.ffs(bits) - 1)  # the lowest set bit
            bits &= bits - uint32(1)
            cell = int32(state[state_row, v])
            logits[row, v] = apply_state(logits[row, v], cell, ban, repetition, presence, frequency)


@device_function
def take_group(xs, base, stop, inv_t, key, lo, noisy, cand, top, w1, w2, w3, offset, greedy,
               draws, truncate, fold, first, tail):  # fmt: skip
    """Pass 1 on one group of loaded scores, xs[u] at base + u * THREADS: the greedy argmax
    (cand), the max of the finite scaled scores (top, for truncating rows), the Gumbel-max
    (drawing rows; with the next two best where they truncate) and top-k's first digit
    (`fold`), as the constant flags ask. A drawing row's noisy scores go to the block's best
    in shared memory (`noisy`, sampling_common.noisy_insert), except in the `first` group,
    which has no bar yet: every score is offered to the thread's own (w1, w2, w3). Only the
    row's last group (`tail`) has loads past `stop`, set to -inf here."""
    n = 3 if truncate else 1
    for u in range(UNROLL):
        v = uint32(base + uint32(u * THREADS))
        x = xs[u]
        if tail:
            x = x if v < stop else NEG_INF  # (a select: every load used before a branch)
        if greedy:
            if not tail or v < stop:
                cand = max(cand, pack(x, v))
        else:
            x = x * inv_t
            if draws:
                if first:
                    w1, w2, w3 = noisy_offer(w1, w2, w3, x, v, key, offset, n)
                else:
                    noisy_insert(noisy, x, v, key, offset, n)
                if truncate and x < -NEG_INF:  # (-inf leaves the max as it is; not NaN)
                    top = max(top, x)
            elif finite(x):
                top = max(top, x)
                if fold:  # a finite scaled score: its key's top 11 bits
                    cuda.atomic.add(lo, ordered_key(x) >> 21, uint32(1))
    return cand, top, w1, w2, w3


@device_function
def scores_step(xs, base, stop, args, state, tail):
    """take_group on one group after the first, then the bar for the next: the block's best
    noisy score so far, or its third best (sampling_common.shared_offset)."""
    inv_t, key, lo, noisy, greedy, draws, truncate, fold = args
    cand, top, offset = state
    cand, top, _, _, _ = take_group(
        xs, base, stop, inv_t, key, lo, noisy, cand, top, NONE, NONE, NONE, offset, greedy, draws,
        truncate, fold, False, tail,
    )  # fmt: skip
    if draws:
        offset = shared_offset(noisy, 3 if truncate else 1)
    return cand, top, offset


_scores_loop = group_loop(scores_step)


@device_function
def scan_scores(scores, start, end, inv_t, key, lo, noisy, greedy, draws, truncate, fold):
    """One block's share of pass 1 over scores[start:end] (take_group on each group), as the
    constant flags ask: (cand, top); a drawing row's best noisy scores land in `noisy`. The
    groups go through every pass's loop (sampling_common.group_loop: loads ahead).

    A drawing row's first group offers every score to its thread's best n (no bar yet); the
    warp's best n of those (warp_best) go to the block's, whose n-th is the bar from then
    on: every later score that passes it is inserted there (a few dozen a block)."""
    tid = cuda.threadIdx.x
    cand = int64(NONE)  # greedy rows' argmax
    top = NEG_INF  # truncating rows' max: a float max, one instruction a score
    n = 3 if truncate else 1
    offset = -NEG_INF  # noisy_offer's: every score offered in full until the block has a bar
    first = start
    if draws and uint32(start) + uint32(tid) < whole_groups_end(start, end):  # (block-uniform)
        xs = cuda.local.array(UNROLL, float32)
        base = uint32(start) + uint32(tid)
        load_group(scores, base, xs)
        cand, top, w1, w2, w3 = take_group(
            xs, base, uint32(end), inv_t, key, lo, noisy, cand, top, int64(NONE), int64(NONE),
            int64(NONE), offset, greedy, draws, truncate, fold, True, False,
        )  # fmt: skip
        seed_block_best(noisy, w1, w2, w3, n)
        first = start + GROUP
        offset = shared_offset(noisy, n)
    args = (inv_t, key, lo, noisy, greedy, draws, truncate, fold)
    cand, top, _ = _scores_loop(scores, first, end, args, (cand, top, offset))
    return cand, top


@device_function
def offer_three(winner, runners, row, b1, b2, b3):
    """A block's three best (b1 > b2 > b3) into the row's three slots (winner, runners[0],
    runners[1]) by atomic max: each max passes its loser down to the next slot, so every value
    but the row's best reaches the second, every value but the best two the third, whatever the
    order the blocks come in. b2 and b3 enter lower down (b1 beats them: they would be passed
    down anyway), with the loser they meet there: three atomics a block."""
    lose = min(cuda.atomic.max(winner, row, b1), b1)
    down = min(lose, b2)  # (two above it already: at most third)
    up = max(lose, b2)
    lose = min(cuda.atomic.max(runners, (0, row), up), up)
    cuda.atomic.max(runners, (1, row), max(max(lose, down), b3))


@cuda.jit(cache=True)
def scores_kernel(
    logits, chunk_len, fparams, iparams, uparams, state, mask, ticket, best, winner, runners,
    rowf, rowi, hist, out, ring, ring_slot,
):  # fmt: skip
    grid_dependency_sync()
    buf = cuda.shared.array(SLOTS, int64)
    flag = cuda.shared.array(1, int32)
    hs = cuda.shared.array(BINS, int64)  # the row's histogram, in the last block
    lo = cuda.shared.array(BINS, uint32)  # this block's counts (sampling_histogram.py)
    hi = cuda.shared.array(BINS, uint32)  # (unused by counts: flush_bins reads it as zeros)
    scan = cuda.shared.array(THREADS, int64)
    sel = cuda.shared.array(2, int64)
    noisy = cuda.shared.array(3, int64)  # the block's best noisy scores (scan_scores)
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
    key = row_key(uparams[U_SEED, row], uparams[U_STEP, row])
    greedy = temperature == 0
    inv_t = float32(1.0) / temperature if not greedy else float32(1.0)  # the twin's 1 / T
    truncate = not greedy and (min_p > 0 or top_k > 0 or top_p < 1)
    fold = truncate and top_k > 0  # top-k's first digit, counted here (see the docstring)
    if fold:
        clear_bins(lo, hi, BINS)
    if tid < 3:
        noisy[tid] = NONE
    if state_row >= 0:  # the chunk's penalties and bans, before any of its logits is read
        patch_chunk(
            logits, row, start, end, state, mask, state_row, ban, repetition, presence, frequency
        )  # fmt: skip
    cuda.syncthreads()

    # draws: the row's full-row Gumbel-max is taken here, into noisy[0]. Temperature-only rows
    # finish with it; top-p rows without top-k keep it for the early exits (sampling_draw.py:
    # it is their token whenever the thresholds keep it, at least top_p of the time, as the
    # nucleus holds top_p of the mass), and the next two noisy scores (noisy[1:]: the first of the
    # three the nucleus keeps is the token, which leaves about one row in a thousand to the
    # exact cut instead of one in ten; sampling_linear.py). Not min-p alone: a flat row keeps
    # a sliver of its mass (~10% at min_p 0.1 on random weights), and its noise here would
    # cost more than it saves.
    draws = not greedy and (not truncate or (top_k == 0 and top_p < 1))
    scores = logits[row]  # one row's view: 32-bit offsets from its start, not [row, v]
    # One loop for each kind of row, the flags constants at each call (scan_scores is inlined):
    # a loop that carried all three paths kept their registers and branches in every group.
    if greedy:
        cand, top = scan_scores(
            scores, start, end, inv_t, key, lo, noisy, True, False, False, False
        )  # fmt: skip
    elif draws and truncate:  # top-p: the three best and the max
        cand, top = scan_scores(
            scores, start, end, inv_t, key, lo, noisy, False, True, True, False
        )  # fmt: skip
    elif draws:  # temperature alone: the token
        cand, top = scan_scores(
            scores, start, end, inv_t, key, lo, noisy, False, True, False, False
        )  # fmt: skip
    else:
        cand, top = scan_scores(
            scores, start, end, inv_t, key, lo, noisy, False, False, True, fold
        )  # fmt: skip
    if truncate and top > NEG_INF:
        cand = pack(top, 0)
    if greedy or truncate:  # (block-uniform; temperature-only rows have only their draw)
        cand = block_max(buf, cand)
        if tid == 0 and cand >= 0:
            cuda.atomic.max(best, row, cand)
    if draws:  # the block's best noisy scores, to the row's
        cuda.syncthreads()
        if tid == 0 and noisy[0] >= 0:
            if truncate:
                offer_three(winner, runners, row, noisy[0], noisy[1], noisy[2])
            else:
                cuda.atomic.max(winner, row, noisy[0])
    if fold:
        cuda.syncthreads()
        flush_bins(lo, hi, hist, row, BINS)
    if not last_block(ticket, row, flag):
        return
    if tid == 0:
        packed = cuda.atomic.exch(best, row, int64(NONE))
        won = cuda.atomic.exch(winner, row, int64(NONE))
        w2 = cuda.atomic.exch(runners, (0, row), int64(NONE))
        w3 = cuda.atomic.exch(runners, (1, row), int64(NONE))
        if not truncate:
            rowi[R_MODE, row] = 0
            finish_row(row, packed if greedy else won, state_row, state, mask, out, ring, ring_slot)
        else:
            top = key_to_f32(packed >> 31) if packed >= 0 else NEG_INF
            rowf[R_MAX, row] = top
            rowf[R_MIN_BOUND, row] = top + float32(math.log(min_p)) if min_p > 0 else NEG_INF
            rowf[R_KTH, row] = NEG_INF
            rowf[R_P_T, row] = 0
            rowf[R_Z, row] = 1
            rowf[R_SCALE, row] = inv_t
            mode = MODE_TRUNCATE
            if top_k > 0:
                mode |= MODE_TOP_K
            if top_p < 1:
                mode |= MODE_TOP_P
            if draws:
                mode |= MODE_EARLY
            rowi[R_WINNER, row] = won
            rowi[R_SECOND, row] = w2
            rowi[R_THIRD, row] = w3
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
