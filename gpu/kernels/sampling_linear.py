"""Top-p after the scores pass: first a test of pass 1's best noisy scores, then the cut on a
linear scale of the scores for the rows it turns down.

A Gumbel-max over a set is the Gumbel-max over any subset that still holds it, so pass 1's
full-row winner w (R_WINNER, sampling_scores.py) is the token wherever the nucleus keeps it:
at least top_p of the time, as the nucleus holds top_p of the mass. Where the nucleus cuts it,
the next best noisy score is the token if the nucleus keeps that one, and so on: pass 1 keeps
the three best (R_WINNER, R_SECOND, R_THIRD), and the first of them that the nucleus keeps is
the token; all three are cut about one row in a thousand at top_p 0.9 (one in ten with the
winner alone, and each such row costs the passes below). The exact cut keeps every score whose
mass strictly above it falls short of top_p * Z (ties at the edge kept), so

    w is kept  <=>  A = sum of the masses of the kept scores strictly above w < ceil(top_p * Z)

with the masses in the fixed point of the radix passes (sampling_common.fixed_mass: exact,
order-free integer sums, the same integers the exact cut would sum).

1. linear_mass_kernel: Z and each candidate's A, running int64 sums a thread. The row's last
   block ends the row's top-p phase on the first candidate whose A falls short (MODE_WON: no
   histogram, no split, no exact cut; the draw takes it, R_WINNER) and otherwise lists the row
   for the next pass (hist_rows). A row with no candidate to test (top-k with top-p, or
   candidates the min_p bound cuts) bins its scores at once, as the next pass does.
2. linear_hist_kernel, over the listed rows only, the whole grid spread over them: the row's
   histogram on a linear scale of its distance from the max, which the scores pass knows:

       bin(x) = BINS - 1 - min(floor((max - x) * LINEAR_SCALE), BINS - 1)

   BINS bins of 1/LINEAR_SCALE (~0.012) each over the top LINEAR_RANGE (24) of the scaled
   scores (higher score, higher bin; bin 0 holds everything further down, whose mass is under
   e**-24 a token). The radix select of sampling_radix.py bins by the top bits of the keys
   instead: a flat row (random weights: a top-p 0.9 nucleus of ~60k of 128k tokens) lands in a
   handful of its bins. The row's last block finds the bin B where the mass from the top
   reaches top_p * Z, as the radix's first digit does, and lists the row for the split.
3. linear_split_kernel, over the rows listed: every kept score above bin B is in the nucleus
   whatever the exact cut: its Gumbel-max is taken here, into the row's packed max. The scores
   of bins B and B - 1 are copied into the candidate buffer (B - 1 too: a score just under bin
   B's edge can round to the same float32 probability as the cut, and the twin keeps ties). The
   row turns compact: the radix mass digits then find the exact cut inside the copy, given the
   mass still needed (R_REMAIN) and Z (R_Z), and the draw reads only the copy, merging into the
   packed max this pass left. Unless no score of the two copied bins can win: the pass takes
   their Gumbel-max too, and where it is lower than the max above bin B, that max is the token
   whatever the exact cut (MODE_WON): no select, no draw over the copy.

A row whose cut falls in bin 0 (top_p within ~1e-6 of 1 on a flat row) or whose two bins
overflow the buffer (thousands of scores within 0.024 of each other: equal logits) is left as
it was: the radix digits run over the whole row, with the same result (the Gumbel-max over the
row is a max: taking part of it twice changes nothing). Rows already compact after top-k skip
these passes: the radix digits read their copy.

The passes ran at a third of HBM's bandwidth (ncu: DRAM 20-38%), on the instructions a score
costs and on loads waited out with nothing else in flight, so their loops are kept lean and
their loads ahead: the accept test's sums replace a histogram's two shared-memory atomics a
score (the returning one on the loop's critical path) and take every score without a branch
(a dropped score is set to -inf, whose mass is 0); fixed_mass is one FFMA and one ex2.approx;
offsets and bins are 32-bit from the row's start; whole groups load at constant offsets from
one address, the next group's loads issued before this one is scanned (the accept loop: 155
-> 97 SASS instructions a group of four scores, sass_count); the split draws noise only where
a score can still win (sampling_common.noisy_offer). The histogram pass and the split read
only the rows listed, the whole grid spread over them: on their own one or two blocks a row at
batch 256, the split took as long as over every row (160 us; 36 spread).
"""

from __future__ import annotations

import math

from numba import cuda, float32, float64, int32, int64, uint32

from gpu.kernels.block_reduce import block_max, block_sum
from gpu.kernels.launch import device_function
from gpu.kernels.pdl import grid_dependency_sync
from gpu.kernels.sampling_common import (
    BINS,
    F_TOP_P,
    MASS_SCALE,
    MODE_COMPACT,
    MODE_EARLY,
    MODE_LINEAR,
    MODE_TOP_P,
    MODE_WON,
    NEG_INF,
    NONE,
    R_COUNT,
    R_LINEAR_BIN,
    R_MODE,
    R_REMAIN,
    R_SECOND,
    R_THIRD,
    R_WINNER,
    R_Z,
    SLOTS,
    THREADS,
    U_SEED,
    U_STEP,
    UNROLL,
    block_share,
    claim_slot,
    fixed_mass,
    group_loop,
    kept,
    last_block,
    last_of,
    listed_share,
    mass_origin,
    noise_offset,
    noisy_offer,
    packed_index,
    row_bounds,
    row_key,
)
from gpu.kernels.sampling_histogram import (
    add_mass,
    clear_bins,
    find_bin,
    flush_bins,
    read_histogram,
)

LINEAR_RANGE = 24.0  # scores this far under the max get bins of their own
LINEAR_SCALE = float32((BINS - 1) / LINEAR_RANGE)  # bins per unit of score


@device_function
def linear_bin(top, x):
    """The bin of a kept score x <= top (the row's max): higher scores, higher bins."""
    d = (top - x) * LINEAR_SCALE
    if d >= float32(BINS - 1):
        return int32(0)
    return int32(int32(BINS - 1) - int32(d))  # (int32 - int32 widens to int64 in Numba)


@device_function
def mass_group(xs, base, stop, args, state, tail):
    """scan_masses on one group of loaded scores, xs[u] at base + u * THREADS (only the last
    group, `tail`, has loads past `stop`). A score the thresholds drop (or NaN, or +inf) is
    set to -inf, whose mass is 0: the sums then take every score without a branch."""
    top, top_l2e, lower, scale, x1, x2, x3, lo, hi, binned = args
    z, a1, a2, a3 = state
    for u in range(UNROLL):
        x = xs[u] * scale
        ok = x >= lower and x < -NEG_INF  # kept (-inf passes: its mass is 0, and it is above none)
        if tail:
            ok = ok and uint32(base + uint32(u * THREADS)) < stop
        x = x if ok else NEG_INF  # (a select: every load used before a branch)
        if binned:
            if x > NEG_INF:
                add_mass(lo, hi, linear_bin(top, x), fixed_mass(x, top_l2e))
        else:
            m = fixed_mass(x, top_l2e)
            z += m
            a1 += m if x > x1 else int64(0)  # (x1 <= x2 <= x3)
            a2 += m if x > x2 else int64(0)
            a3 += m if x > x3 else int64(0)
    return z, a1, a2, a3


_mass_loop = group_loop(mass_group)


@device_function
def scan_masses(scores, start, end, top, min_bound, kth, scale, x1, x2, x3, lo, hi, binned):
    """The fixed-point mass of every kept score of scores[start:end]. With `binned`, into its
    linear bin of this block's histogram (lo, hi: sampling_histogram.add_mass; cleared and
    synced by the caller). Else this thread's share of (Z, A1, A2, A3): the masses of the kept
    scores and of those strictly above x1 <= x2 <= x3, running sums with no shared-memory
    atomic and no branch a score (~19 instructions a score, sass_count; 39 with libdevice's
    expf and a branch for each threshold). Returns them, zeros when binned (`binned` is a
    constant at each call: the inlined loop keeps one of the two). The loop is every pass's
    (sampling_common.group_loop)."""
    args = (top, mass_origin(top), max(min_bound, kth), scale, x1, x2, x3, lo, hi, binned)
    zero = int64(0)
    return _mass_loop(scores, start, end, args, (zero, zero, zero, zero))


@device_function
def pass_one_best(scores, rowi, which, row, early, min_bound, kth, scale):
    """(packed, scaled score, testable) of one of pass 1's three best noisy scores (rowi row
    `which`): testable where the row drew them (MODE_EARLY) and the thresholds keep it; its
    score is then +inf otherwise (no mass above it)."""
    packed = rowi[which, row]
    x = scores[packed_index(packed)] * scale  # (any score where there is none)
    ok = early and packed >= 0 and kept(x, min_bound, kth)
    return packed, x if ok else -NEG_INF, ok


@device_function
def nucleus_needs(fparams, row, total):
    """The mass the nucleus must reach, in fixed point: ceil(top_p * Z), at least 1."""
    return max(int64(math.ceil(float64(fparams[F_TOP_P, row]) * total)), 1)


@device_function
def cut_bin(hist, row, mode, fparams, rowf, rowi, linear_rows, hs, scan, sel):
    """The row's last block, its histogram complete: Z, and the bin B where the mass from the
    top reaches top_p * Z; the row is listed for the split. Every thread of the block calls
    it."""
    total = read_histogram(hist, row, BINS, hs, scan)
    remain = nucleus_needs(fparams, row, total)
    find_bin(hs, BINS, scan, remain, sel)
    if cuda.threadIdx.x == 0 and sel[0] > 0:  # bin 0 or no bin: the radix digits do the row
        rowf[R_Z, row] = float32(float64(total) / MASS_SCALE)
        rowi[R_LINEAR_BIN, row] = sel[0]
        rowi[R_REMAIN, row] = remain - sel[1]
        rowi[R_COUNT, row] = 0
        rowi[R_MODE, row] = mode | MODE_LINEAR
        linear_rows[2 + cuda.atomic.add(linear_rows, 0, int32(1))] = row  # for the split


@cuda.jit(cache=True)
def linear_mass_kernel(
    logits, chunk_len, fparams, ticket, hist, rowf, rowi, linear_rows, hist_rows
):  # fmt: skip
    grid_dependency_sync()
    row = cuda.blockIdx.x
    mode = rowi[R_MODE, row]
    if (mode & MODE_TOP_P) == 0 or (mode & MODE_COMPACT) != 0:
        return
    buf = cuda.shared.array(SLOTS, int64)
    hs = cuda.shared.array(BINS, int64)  # the row's histogram, in the last block
    lo = cuda.shared.array(BINS, uint32)
    hi = cuda.shared.array(BINS, uint32)
    scan = cuda.shared.array(THREADS, int64)
    sel = cuda.shared.array(2, int64)
    flag = cuda.shared.array(1, int32)
    tid = cuda.threadIdx.x
    top, min_bound, kth, scale = row_bounds(rowf, row)
    start, end = block_share(rowi, row, False, chunk_len, logits.shape[1])
    scores = logits[row]  # 32-bit offsets from the row's start (the module docstring)
    early = (mode & MODE_EARLY) != 0
    w1, x1, ok1 = pass_one_best(scores, rowi, R_WINNER, row, early, min_bound, kth, scale)
    w2, x2, ok2 = pass_one_best(scores, rowi, R_SECOND, row, early, min_bound, kth, scale)
    w3, x3, ok3 = pass_one_best(scores, rowi, R_THIRD, row, early, min_bound, kth, scale)
    test = ok1 or ok2 or ok3
    t1 = min(x1, min(x2, x3))  # the three scores in order (untestable ones +inf: no mass)
    t3 = max(x1, max(x2, x3))
    t2 = max(min(x1, x2), min(max(x1, x2), x3))  # (the median)
    if test:  # Z and the masses above them: the accept test (the module docstring)
        z, s1, s2, s3 = scan_masses(
            scores, start, end, top, min_bound, kth, scale, t1, t2, t3, lo, hi, False
        )  # fmt: skip
        z = block_sum(buf, z)
        s1 = block_sum(buf, s1)
        s2 = block_sum(buf, s2)
        s3 = block_sum(buf, s3)
        if tid == 0:
            cuda.atomic.add(hist, (row, 0), z)
            cuda.atomic.add(hist, (row, 1), s1)
            cuda.atomic.add(hist, (row, 2), s2)
            cuda.atomic.add(hist, (row, 3), s3)
    else:  # no winner to test: the row's histogram at once
        clear_bins(lo, hi, BINS)
        cuda.syncthreads()
        scan_masses(scores, start, end, top, min_bound, kth, scale, x1, x2, x3, lo, hi, True)
        cuda.syncthreads()
        flush_bins(lo, hi, hist, row, BINS)
    if not last_block(ticket, row, flag):
        return
    if not test:
        cut_bin(hist, row, mode, fparams, rowf, rowi, linear_rows, hs, scan, sel)
    elif tid == 0:
        z = cuda.atomic.exch(hist, (row, 0), int64(0))
        s1 = cuda.atomic.exch(hist, (row, 1), int64(0))
        s2 = cuda.atomic.exch(hist, (row, 2), int64(0))
        s3 = cuda.atomic.exch(hist, (row, 3), int64(0))
        needs = nucleus_needs(fparams, row, z)
        # each candidate's mass above it, by its rank among the three (equal scores: equal sums)
        a1 = s1 if x1 <= t1 else (s2 if x1 <= t2 else s3)
        a2 = s1 if x2 <= t1 else (s2 if x2 <= t2 else s3)
        a3 = s1 if x3 <= t1 else (s2 if x3 <= t2 else s3)
        # The first of the three, in noisy order, that the nucleus keeps (the mass strictly
        # above it falls short of the nucleus's) is the token: the ones before it are cut,
        # and it beats every other score the nucleus holds. The row's top-p phase ends here;
        # the draw takes it (sampling_draw.py).
        token = int64(NONE)
        if ok1 and a1 < needs:
            token = w1
        elif ok2 and a2 < needs:
            token = w2
        elif ok3 and a3 < needs:
            token = w3
        if token >= 0:
            rowi[R_WINNER, row] = token
            rowi[R_MODE, row] = (mode & ~MODE_TOP_P) | MODE_WON
        else:
            hist_rows[2 + cuda.atomic.add(hist_rows, 0, int32(1))] = row


@cuda.jit(cache=True)
def linear_hist_kernel(logits, fparams, ticket, hist, rowf, rowi, linear_rows, hist_rows):
    grid_dependency_sync()
    listed = hist_rows[0]  # rows whose three candidates the nucleus cuts (one in a thousand)
    if listed == 0:
        return
    hs = cuda.shared.array(BINS, int64)
    lo = cuda.shared.array(BINS, uint32)
    hi = cuda.shared.array(BINS, uint32)
    scan = cuda.shared.array(THREADS, int64)
    sel = cuda.shared.array(2, int64)
    flag = cuda.shared.array(1, int32)
    row, start, end, per = listed_share(hist_rows, listed, logits.shape[1])
    if row >= 0:  # block-uniform
        top, min_bound, kth, scale = row_bounds(rowf, row)
        clear_bins(lo, hi, BINS)
        cuda.syncthreads()
        scores = logits[row]
        scan_masses(
            scores, start, end, top, min_bound, kth, scale, NEG_INF, NEG_INF, NEG_INF, lo, hi, True
        )
        cuda.syncthreads()
        flush_bins(lo, hi, hist, row, BINS)
        if last_of(ticket, row, flag, per):
            cut_bin(hist, row, rowi[R_MODE, row], fparams, rowf, rowi, linear_rows, hs, scan, sel)
    blocks = cuda.gridDim.x * cuda.gridDim.y
    if last_of(hist_rows, 1, flag, blocks) and cuda.threadIdx.x == 0:  # the list read
        hist_rows[0] = 0


@cuda.jit(cache=True)
def linear_split_kernel(
    logits, uparams, ticket, best, winner, rowf, rowi, cand_val, cand_idx, linear_rows
):  # fmt: skip
    grid_dependency_sync()
    listed = linear_rows[0]  # rows the mass pass left to split (most ended on their winner)
    if listed == 0:
        return
    buf = cuda.shared.array(SLOTS, int64)
    flag = cuda.shared.array(1, int32)
    full = cuda.shared.array(1, int32)
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    blocks = cuda.gridDim.x * cuda.gridDim.y
    row, start, end, per = listed_share(linear_rows, listed, logits.shape[1])
    if row >= 0:  # block-uniform
        if tid == 0:
            full[0] = 0
        cuda.syncthreads()
        mode = rowi[R_MODE, row]
        key = row_key(uparams[U_SEED, row], uparams[U_STEP, row])
        top, min_bound, kth, scale = row_bounds(rowf, row)
        cut = int32(rowi[R_LINEAR_BIN, row])
        capacity = cand_val.shape[1]
        scores = logits[row]  # one row's view: 32-bit offsets from its start, not [row, v]
        cand = int64(NONE)  # the Gumbel-max above the cut bin
        edge = int64(NONE)  # ... and over the two copied bins (see below)
        xs = cuda.local.array(UNROLL, float32)
        stop = uint32(end)
        stride = uint32(nt)
        last = uint32(stop - uint32(1))  # (uint32 - uint32 widens to 64 bits in Numba)
        offset = -NEG_INF  # noisy_offer's: every score offered in full until the warp has a bar
        base0 = uint32(start)
        while base0 < stop:  # block-uniform, for noise_offset
            base = uint32(base0 + uint32(tid))
            for u in range(UNROLL):
                xs[u] = scores[min(uint32(base + uint32(u) * stride), last)]
            for u in range(UNROLL):
                v = uint32(base + uint32(u) * stride)
                x = xs[u] * scale
                keep = v < stop and kept(x, min_bound, kth)
                b = linear_bin(top, x) if keep else int32(-1)
                if b > cut:
                    cand, _, _ = noisy_offer(cand, NONE, NONE, x, v, key, offset, 1)
                elif b >= cut - 1:  # b >= 0: kept
                    edge, _, _ = noisy_offer(edge, NONE, NONE, x, v, key, offset, 1)
                if full[0] == 0:
                    want = b == cut or b == cut - 1
                    slot = claim_slot(rowi, row, want, capacity, full)
                    if want and slot < capacity:
                        cand_val[row, slot] = xs[u]  # as stored: later passes multiply by scale
                        cand_idx[row, slot] = v
            offset = noise_offset(cand)
            base0 = uint32(base0 + stride * uint32(UNROLL))
        cand = block_max(buf, cand)
        if tid == 0 and cand >= 0:
            cuda.atomic.max(best, row, cand)
        edge = block_max(buf, edge)
        if tid == 0 and edge >= 0:
            cuda.atomic.max(winner, row, edge)
        if last_of(ticket, row, flag, per) and tid == 0:
            edge = cuda.atomic.exch(winner, row, int64(NONE))
            above = cuda.atomic.max(best, row, int64(NONE))  # (a read)
            if edge < above:  # no score at the cut can win: the exact cut is not needed
                cuda.atomic.exch(best, row, int64(NONE))
                rowi[R_WINNER, row] = above  # the draw takes it (sampling_draw.py)
                rowi[R_MODE, row] = (mode & ~(MODE_TOP_P | MODE_LINEAR)) | MODE_EARLY | MODE_WON
            elif cuda.atomic.add(rowi, (R_COUNT, row), 0) <= capacity:
                rowi[R_MODE, row] = mode | MODE_COMPACT
            else:  # too many at the cut: the radix digits and the draw read the whole row
                rowi[R_MODE, row] = mode & ~MODE_LINEAR
                rowi[R_COUNT, row] = 0
    if last_of(linear_rows, 1, flag, blocks) and tid == 0:  # every block has read the list
        linear_rows[0] = 0
