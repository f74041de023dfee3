"""What the sampler's passes share: row layouts, the scratch's constants, and device helpers.

The row parameters (F_*, I_*, U_*: rows of fparams, iparams, uparams), the per-row thresholds
(R_*: rows of the scratch's rowf and rowi) and the mode bits are the contract between the
launcher (sampling.py) and the kernels (sampling_scores.py, sampling_radix.py,
sampling_draw.py); the constants and uniform are importable from gpu.kernels.sampling too.

Cross-block results use the "last block done" pattern (last_block): a block adds its histogram
(or offers its max) with device atomics, fences, and takes a ticket from the row's counter; the
block that takes the last ticket reads the row's result with atomic exchanges (which reset the
histogram and slot for the next pass, and never see a stale L1 line), resets the ticket and
writes the row's threshold state for the next kernel.

A row's best (value, index) travels as one int64 (pack): ordered key << 31 | (2**31 - 1 -
index), so the max is the largest value at the smallest index (np.argmax's tie rule), and one
atomic max merges the blocks. The Gumbel noise comes from gpu/sampling/rng.py's counter-based
uniforms (uniform), the same bits as the numpy twin's.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, float64, int32, int64, uint16, uint32, uint64

from gpu.kernels.bf16 import bits_f32, key_to_f32, ordered_key
from gpu.kernels.block_reduce import warp_max
from gpu.kernels.launch import MAX_THREADS, SIMULATOR, device_function, threads
from gpu.sampling.rng import LOW1, LOW2, MIX1, MIX2, SEED_MUL, STEP_MUL, TOKEN_MUL

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
# Blocks of THREADS an SM must hold (launch_bounds: 64 registers a thread): at batch 256 a pass
# is 512 blocks, 3.9 an SM of an H100. The radix passes need the bound (72 and 80 registers
# without it: 3 blocks an SM, the last 117 blocks a second wave, top-k's first count 149 ->
# 183 us, ncu); the others stay under 64 without it (and use more with it, unmeasured).
BLOCKS_PER_SM = 4
BINS = 2048  # the first two digits have 11 bits, the last 10
BINS_PER_THREAD = BINS // THREADS  # (the kernels run THREADS threads a block)
UNROLL = 4  # logits a thread loads at once (a chunk of MIN_CHUNK: one group)
MASS_SCALE = float64(2.0**44)  # fixed-point unit of top-p masses (sums < 2**63 for V < 2**19)
MASS_UNIT = float32(MASS_SCALE)  # (the same, for fixed_mass's float32 product)
SLOTS = MAX_THREADS // 32  # block_max's scratch (a slot per warp; 32 threads in the simulator)
# rowf rows
R_MAX, R_MIN_BOUND, R_KTH, R_P_T, R_Z, R_SCALE = range(6)
# rowi rows (R_WINNER, R_SECOND, R_THIRD: pass 1's three best noisy scores over the row, packed;
# see sampling_draw.py and sampling_linear.py)
R_MODE, R_PREFIX, R_REMAIN, R_COUNT, R_DIGIT, R_LINEAR_BIN, R_WINNER, R_SECOND, R_THIRD = range(9)
# mode bits (MODE_LINEAR: top-p's cut bin found on the linear scale, sampling_linear.py;
# MODE_EARLY: R_WINNER holds the row's full-row Gumbel-max, sampling_draw.py; MODE_WON: the
# top-p phase ended on it, with no exact cut, sampling_linear.py)
MODE_TRUNCATE, MODE_TOP_K, MODE_TOP_P, MODE_COMPACT, MODE_LINEAR = 1, 2, 4, 8, 16
MODE_EARLY, MODE_WON = 32, 64
CANDIDATES = 8192  # scores a row's copy holds (SamplerScratch.cand_val)
NONE = -1  # the packed-max slot's empty value
NOISE_CAP = float32(16.7)  # above any Gumbel noise: -log(-log(1 - 2**-24)) = 16.64

if SIMULATOR:
    _MASK64 = (1 << 64) - 1
    _MASK32 = (1 << 32) - 1

    def row_key(seed, step):
        """rng.row_key for one row, in Python integers (no overflow warnings)."""
        x = (int(seed) * int(SEED_MUL) + int(step) * int(STEP_MUL)) & _MASK64
        x ^= x >> 30
        x = (x * int(MIX1)) & _MASK64
        x ^= x >> 27
        x = (x * int(MIX2)) & _MASK64
        return x ^ (x >> 31)

    def noise_bits(key, token):
        """The top 23 bits of rng.token_hash, in Python integers."""
        x = ((int(token) * int(TOKEN_MUL)) & _MASK32) ^ (int(key) & _MASK32)
        x ^= x >> 16
        x = (x * int(LOW1)) & _MASK32
        x ^= x >> 15
        x = (x * int(LOW2)) & _MASK32
        x ^= x >> 16
        return ((x + (int(key) >> 32)) & _MASK32) >> 9

    def ex2_approx(x):
        """2**x in float32 (the device's ex2.approx.ftz: -inf -> 0, +inf -> inf)."""
        with np.errstate(over="ignore"):
            return np.exp2(np.float32(x))

else:
    from llvmlite import ir
    from numba.core import types
    from numba.cuda.extending import intrinsic

    @device_function
    def row_key(seed, step):
        """rng.row_key: the row's 64-bit key, once per row (uint64 wraps as numpy's does)."""
        x = seed * SEED_MUL + step * STEP_MUL
        x ^= x >> uint64(30)
        x *= MIX1
        x ^= x >> uint64(27)
        x *= MIX2
        return x ^ (x >> uint64(31))

    @device_function
    def noise_bits(key, token):
        """The top 23 bits of rng.token_hash: 32-bit arithmetic a token (the 64-bit mixing is
        the row's, once)."""
        x = uint32(uint32(uint32(token) * TOKEN_MUL) ^ uint32(key & uint64(0xFFFFFFFF)))
        x = uint32(x ^ (x >> uint32(16)))  # (Numba widens uint32 arithmetic to 64 bits:
        x = uint32(x * LOW1)  # every step is cut back to 32, so the SASS stays 32-bit)
        x = uint32(x ^ (x >> uint32(15)))
        x = uint32(x * LOW2)
        x = uint32(x ^ (x >> uint32(16)))
        return uint32(uint32(x + uint32(key >> uint64(32))) >> uint32(9))

    @intrinsic
    def ex2_approx(typingctx, x):
        """2**x by one ex2.approx.ftz.f32 (relative error ~2**-22; subnormal results 0):
        noisy_offer's bound, where libdevice's exp2f adds a range fix of three instructions."""
        sig = types.float32(types.float32)

        def codegen(context, builder, signature, args):
            fnty = ir.FunctionType(ir.FloatType(), [ir.FloatType()])
            return builder.asm(fnty, "ex2.approx.ftz.f32 $0, $1;", "=f,f", list(args), False)

        return sig, codegen


@device_function
def uniform_of(bits):
    """rng.uniform_from_counter from the 23 bits: one half over 2**23 added, exact in float32,
    so never 0 or 1."""
    return (float32(bits) + float32(0.5)) / float32(8388608.0)


@device_function
def uniform(key, token):
    """rng.uniform_from_counter for one token of a keyed row."""
    return uniform_of(noise_bits(key, token))


@device_function
def gumbel_of(bits):
    """Gumbel(0, 1) noise from a token's 23 hash bits: -log(-log(u)), float32."""
    return -math.log(-math.log(float32(uniform_of(bits))))


@device_function
def gumbel(key, token):
    """Gumbel(0, 1) noise of one token of a keyed row: what noisy_offer adds where it draws."""
    return gumbel_of(noise_bits(key, token))


L2E = float32(1.0 / math.log(2.0))  # exp(y) = 2**(y * L2E)
LOG2_MARGIN = float32(math.log2(1.001))  # noisy_offer's bound, 1.001 times the exact one
SKIP_CAP = float32(math.exp(-NOISE_CAP))  # a bound this low: more than NOISE_CAP under the bar


@device_function
def noise_offset(cand):
    """noisy_offer's offset for the warp's best noisy score so far (bar_offset of the max over
    the warp of the packed cands; every lane of the warp in step: a block-uniform loop). In the
    simulator, which has no shuffles, each thread's own."""
    bar = key_to_f32(cand >> 31) if cand >= 0 else NEG_INF
    if not SIMULATOR:
        bar = warp_max(bar, 32)
    return bar_offset(bar)


@device_function
def bar_offset(bar):
    """(slack - bar) * L2E + log2(1.001): noisy_offer's offset for a bar (+inf for -inf: every
    score offered in full). slack = 1e-3 + 1e-5 * (2 |bar| + 20) covers the float32 rounding
    of x + g and of noisy_offer's bound for every x within 20 of the bar (|x| <= |bar| + 20); a
    score further under the bar is more than 3 under it with the largest noise, far above that
    rounding."""
    slack = float32(1e-3) + float32(1e-5) * (float32(2.0) * abs(bar) + float32(20.0))
    return (slack - bar) * L2E + LOG2_MARGIN


@device_function
def noisy_offer(c1, c2, c3, x, v, key, offset, n):
    """Offer pack(x + gumbel(key, v), v) for a finite x to the best `n` so far (n, a constant:
    1, c1 the max; or 3, c1 >= c2 >= c3 the three best), returned as (c1, c2, c3); unchanged
    where x + noise provably stays under the bar that offset was made from (noise_offset or
    shared_offset: a noisy score the row has already reached n times, so x cannot be among
    the row's best n), or x is not finite.

    Most scores of a row cannot win, and the two logarithms are most of a draw's cost. Let
    need = bar - x - slack: g > need <=> E = -log(u) < c = exp(-need) <=> 1 - u < 1 - exp(-c),
    which is at most c. A lower bound d of 1 - u comes from the 23 bits by a bit cast, and
    c' = 2**(x * L2E + offset) = 1.001 c (one FFMA and one ex2.approx, whose error the 1.001
    covers a thousand times over): d >= c' means g <= need, so x + g stays under the bar and
    the max, and the token drawn, are the exact computation's. c' >= 1 > d wherever need <= 0,
    c' = 0 for x = -inf (NaN before any bar, offset +inf: no comparison holds for NaN), so only
    +inf needs a test of its own. Where c' < SKIP_CAP, need exceeds NOISE_CAP, above any noise:
    no hash at all (the far tail of a peaked row). A flat row's common path is then one FFMA,
    one ex2, the hash and two compares a score (sass_count: ~27 instructions a score with the
    load, against ~65 with the bound's exp and slack per score and the packed max on every
    path); the offer itself, branch-free maxes, only where a score passes."""
    c = ex2_approx(x * L2E + offset)
    if c >= SKIP_CAP:
        bits = noise_bits(key, v)
        # 1 - u = (m + 1/2) / 2**23 with m = 2**23 - 1 - bits: at least m / 2**23, which is
        # 1.m - 1 exactly, the float with m as its mantissa (a bit cast, no conversion).
        d = bits_f32(uint32(0x3F800000) | (uint32(0x7FFFFF) - uint32(bits))) - float32(1.0)
        if d < c and x < -NEG_INF:
            c1, c2, c3 = bubble(c1, c2, c3, pack(x + gumbel_of(bits), v), n)
    return c1, c2, c3


@device_function
def bubble(c1, c2, c3, p, n):
    """p into the best n (c1 >= c2 >= c3; n a constant, 1 or 3), bubbled down without a
    branch (no register copies)."""
    if n == 3:
        lose = min(c1, p)
        c1 = max(c1, p)
        c3 = max(c3, min(c2, lose))
        c2 = max(c2, lose)
    else:
        c1 = max(c1, p)
    return c1, c2, c3


@device_function
def noisy_insert(slots, x, v, key, offset, n):
    """noisy_offer into the block's best n in shared memory (insert_best), not the thread's."""
    p, _, _ = noisy_offer(int64(NONE), int64(NONE), int64(NONE), x, v, key, offset, 1)
    if p >= 0:
        insert_best(slots, p, n)


@device_function
def insert_best(slots, p, n):
    """p into the block's best n (n a constant, 1 or 3; slots[0] >= slots[1] >= slots[2], int64
    in shared memory, NONE when empty) by atomic max, each max passing its loser down: every
    value but the largest reaches slots[1], every value but the largest two slots[2], whatever
    the order the threads come in. At any moment slots[n - 1] holds a value with n - 1 other
    values inserted at least as large (it lost to them on its way down), so it is a bar: a
    score under it is not among the row's best n."""
    lose = min(cuda.atomic.max(slots, 0, p), p)
    if n == 3:
        lose = min(cuda.atomic.max(slots, 1, lose), lose)
        cuda.atomic.max(slots, 2, lose)


@device_function
def shared_offset(slots, n):
    """noisy_offer's offset for the block's n-th best noisy score so far (slots[n - 1]). The
    block's best n, not each warp's, make the bar: with the warp's max of its lanes' third
    best, 24% of the warp steps over a flat row (a block's 64k logits of std 1.3, 256
    threads) had a lane whose score passed, and the whole warp took the noise; with the
    block's third best, 3% (docs/examples/noise_bar.py, a numpy model of the loop)."""
    cand = slots[n - 1]
    return bar_offset(key_to_f32(cand >> 31) if cand >= 0 else NEG_INF)


if SIMULATOR:

    @device_function
    def warp_best(c1, c2, c3, n):
        """The simulator's twin of warp_best below: the thread's own (no shuffles)."""
        return c1, c2, c3

else:

    @device_function
    def warp_best(c1, c2, c3, n):
        """The warp's best n of its lanes' (c1 >= c2 >= c3), in every lane: a butterfly of
        shuffles, each lane bubbling its partner's values into its own (the two sets are of
        disjoint lanes at every step). Every lane of the warp calls it."""
        m = 16
        while m > 0:
            p1 = cuda.shfl_xor_sync(0xFFFFFFFF, c1, m)
            if n == 3:
                p2 = cuda.shfl_xor_sync(0xFFFFFFFF, c2, m)
                p3 = cuda.shfl_xor_sync(0xFFFFFFFF, c3, m)
            c1, c2, c3 = bubble(c1, c2, c3, p1, n)
            if n == 3:
                c1, c2, c3 = bubble(c1, c2, c3, p2, n)
                c1, c2, c3 = bubble(c1, c2, c3, p3, n)
            m //= 2
        return c1, c2, c3


@device_function
def seed_block_best(slots, w1, w2, w3, n):
    """After each thread's first group, offered whole to its own best n (no bar yet): the
    warp's best n of those (warp_best) into the block's (insert_best), whose n-th is the bar
    from then on (shared_offset). Every thread of the block calls it (a syncthreads, so that
    the first bar is the whole block's)."""
    w1, w2, w3 = warp_best(w1, w2, w3, n)
    if SIMULATOR or cuda.laneid == 0:  # (no shuffles in the simulator: every thread's own)
        insert_best(slots, w1, n)
        if n == 3:
            insert_best(slots, w2, n)
            insert_best(slots, w3, n)
    cuda.syncthreads()


@device_function
def finite(x):
    return x > NEG_INF and x < -NEG_INF


@device_function
def kept(x, min_bound, kth):
    """A finite score above the min_p bound and the top-k threshold."""
    return finite(x) and x >= min_bound and x >= kth


@device_function
def fixed_mass(x, top_l2e):
    """A kept score's mass exp(x - top) in fixed point (MASS_SCALE units, truncated), as
    2**(x * L2E - top_l2e) by one FFMA and one ex2.approx (mass_origin: top_l2e): every top-p
    pass sums these same integers, so its sums are exact and in any order the same. The float32
    result times 2**44 is exact (a power of two), so one conversion makes the integer. A score
    of -inf has no mass (ex2 of -inf is 0). libdevice's expf took 9 instructions for its range
    reduction where this takes 2 (sass_count). The relative error, within 3e-6 for |top| <= 30
    (test_fixed_mass_is_exp_in_fixed_point), is mostly the origin's rounding, one factor for
    the whole row, which moves no cut; the rest, the argument's, is the order of the float32
    probabilities the twin sums."""
    return int64(ex2_approx(x * L2E - top_l2e) * MASS_UNIT)


@device_function
def mass_origin(top):
    """top * L2E, fixed_mass's origin for a row whose max is top (0 for a row with no finite
    score: its scores are all -inf, and -inf - -inf would be NaN)."""
    return top * L2E if finite(top) else float32(0.0)


@device_function
def listed_share(listed_rows, listed, vocab):
    """(row, start, end, blocks) for this block where the whole grid spreads over the `listed`
    rows of a work list (a count, a ticket, the rows): blocks // listed blocks a row, each an
    equal slice; row -1 for a block left over. Block-uniform."""
    blocks = cuda.gridDim.x * cuda.gridDim.y
    per = blocks // listed
    here = cuda.blockIdx.x * cuda.gridDim.y + cuda.blockIdx.y
    if here >= per * listed:
        return int32(-1), int32(0), int32(0), per
    nt = cuda.blockDim.x
    span = ((vocab + per - 1) // per + nt - 1) // nt * nt
    start = (here % per) * span
    return int32(listed_rows[2 + here // per]), start, min(start + span, vocab), per


GROUP = UNROLL * THREADS  # scores a block loads at once: UNROLL a thread, THREADS apart


@device_function
def whole_groups_end(start, end):
    """The end of the whole GROUPs from start in [start, end) (uint32; start itself for an
    empty share, which block_share gives a compact row's spare blocks with end < start): a pass
    over a block's share loads those with load_group, and the rest, if any, with load_tail."""
    return uint32(start + max(end - start, 0) // GROUP * GROUP)


@device_function
def load_group(scores, base, xs):
    """xs[u] = scores[base + u * THREADS], every load of the group in flight at once, at
    constant offsets from one address: a uint64 index lets the 64-bit address arithmetic fold
    u * THREADS into each load (LDG [R+0x400]); a uint32 one, wrapping, cannot."""
    b = uint64(base)
    for u in range(UNROLL):
        xs[u] = scores[b + uint64(u * THREADS)]


@device_function
def whole_pairs_end(start, end):
    """The end of the whole pairs of GROUPs from start in [start, end) (uint32): a group loop
    takes two groups a turn, two arrays in turn, each one's loads issued while the other is
    scanned (load_ahead); an odd whole group after the pairs, and the partial one, follow."""
    return uint32(start + max(end - start, 0) // (2 * GROUP) * (2 * GROUP))


@device_function
def load_ahead(scores, base, whole, xs):
    """load_group for the group at base if it is whole (base < whole), else again for the one
    before it (a valid address; no branch around the loads). A group loop loads the next
    group into one array while it scans the other, so a warp always has loads in flight under
    its arithmetic. It takes two groups a turn (whole_pairs_end) because a loop of one group
    and a conditional second lets LLVM sink the next group's loads into the branch that uses
    them, after the scan they should overlap."""
    load_group(scores, base if base < whole else uint32(base - uint32(GROUP)), xs)


def group_loop(step):
    """The loop every pass over a block's share runs, around `step`, the pass's own work on one
    loaded group: state = step(xs, base, stop, args, state, tail), xs[u] the score at base +
    u * THREADS (`args`: the pass's constants, a tuple; `state`: what it carries from group to
    group, a tuple). The whole groups of scores[first:end] load at constant offsets from one
    address, two arrays in turn, the next group's loads in flight while one is scanned
    (load_ahead, whole_pairs_end); then an odd whole group, then the partial one (load_tail,
    tail True: its loads past stop are clamped, the step sets them aside). Returns the last
    state. Every thread of the block runs it (block-uniform: a step may sync the warp)."""

    @device_function
    def loop(scores, first, end, args, state):
        xa = cuda.local.array(UNROLL, float32)
        xb = cuda.local.array(UNROLL, float32)
        whole = whole_groups_end(first, end)
        pairs = whole_pairs_end(first, end)
        stop = uint32(end)
        base = uint32(first) + uint32(cuda.threadIdx.x)
        if base < whole:
            load_group(scores, base, xa)
        while base < pairs:
            load_group(scores, uint32(base + uint32(GROUP)), xb)
            state = step(xa, base, stop, args, state, False)
            load_ahead(scores, uint32(base + uint32(2 * GROUP)), whole, xa)
            state = step(xb, uint32(base + uint32(GROUP)), stop, args, state, False)
            base = uint32(base + uint32(2 * GROUP))
        if base < whole:  # an odd whole group, loaded
            state = step(xa, base, stop, args, state, False)
            base = uint32(base + uint32(GROUP))
        if whole < stop:  # the last, partial group
            load_tail(scores, base, stop, xa)
            state = step(xa, base, stop, args, state, True)
        return state

    return loop


@device_function
def load_tail(scores, base, stop, xs):
    """load_group for the share's last, partial group: loads past stop clamped to its last
    score (the caller sets them aside by their index)."""
    last = uint32(stop - uint32(1))  # (uint32 - uint32 widens to 64 bits in Numba)
    for u in range(UNROLL):
        xs[u] = scores[min(uint32(base + uint32(u * THREADS)), last)]


@device_function
def row_bounds(rowf, row):
    """The row's (max, min_p bound, top-k threshold, scale), what every pass after the scores
    reads: a kept score is kept(x * scale, min_bound, kth), its mass exp(x * scale - max)."""
    return rowf[R_MAX, row], rowf[R_MIN_BOUND, row], rowf[R_KTH, row], rowf[R_SCALE, row]


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
def last_block(ticket, row, flag):
    """Take the row's ticket after this block's results are out (every thread calls it);
    True in the block that takes the last ticket, which then resets the counter."""
    return last_of(ticket, row, flag, cuda.gridDim.y)


@device_function
def last_of(ticket, row, flag, blocks):
    """last_block where the row has `blocks` blocks, not one row of the grid."""
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        cuda.threadfence()
        flag[0] = int32(cuda.atomic.add(ticket, row, int32(1)) == blocks - 1)
        if flag[0]:
            ticket[row] = 0
            cuda.threadfence()
    cuda.syncthreads()
    return flag[0] != 0


@device_function
def finish_row(row, packed, state_row, state, mask, out, ring, ring_slot):
    """The row's token (from its packed max) to out and the host ring; spec step 4, its bit
    set in the state's mask."""
    tok = packed_index(packed)
    out[row] = tok
    ring[ring_slot[0], row] = tok
    if state_row >= 0:
        cell = int32(state[state_row, tok])
        if (cell & COUNT_MASK) < COUNT_MASK:
            state[state_row, tok] = uint16(cell + 1)
        mask[state_row, tok >> 5] |= uint32(1) << uint32(tok & 31)


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


if SIMULATOR:

    @device_function
    def warp_any(flag):
        """The simulator's twin of warp_any below: the thread's own flag (no votes)."""
        return flag

    @device_function
    def claim_slot(rowi, row, want, capacity, full):
        """The simulator's twin of the warp-aggregated claim below: one atomic per score."""
        if not want:
            return int64(-1)
        slot = cuda.atomic.add(rowi, (R_COUNT, row), int64(1))
        if slot + 1 > capacity:
            full[0] = 1
        return slot

else:

    @device_function
    def warp_any(flag):
        """Whether any active lane of the warp has `flag` (one vote): a loop asks it once a
        group before a rare per-score step that every lane must take together."""
        return cuda.any_sync(cuda.activemask(), flag)

    @device_function
    def claim_slot(rowi, row, want, capacity, full):
        """A slot in the row's candidate buffer for each lane that `want`s one (-1 for the
        others): one atomic add to the row's counter per warp (the lanes' ballot), not per
        score: a flat row's copy sent ~128k atomics to one address. Sets full[0] once the
        count passes capacity (the row stays on its logits; the block stops copying)."""
        mask = cuda.activemask()
        ballot = uint32(cuda.ballot_sync(mask, want))
        if ballot == 0:
            return int64(-1)
        leader = 31 - cuda.clz(ballot)
        first = int64(0)
        if cuda.laneid == leader:
            n = int64(cuda.popc(ballot))
            first = cuda.atomic.add(rowi, (R_COUNT, row), n)
            if first + n > capacity:
                full[0] = 1
        first = cuda.shfl_sync(mask, first, leader)
        if not want:
            return int64(-1)
        return first + int64(cuda.popc(ballot & uint32(cuda.lanemask_lt())))
