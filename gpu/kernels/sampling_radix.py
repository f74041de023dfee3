"""Passes 2 and 3 of the sampler (sampling.py): the top-k and top-p thresholds by radix select.

radix_count_kernel x 2 (digits 1 and 2 of 11, 11, 10 bits): top-k. The k-th largest kept
score is found over the order-preserving integer keys of the scaled scores
(bf16.ordered_key): each pass counts the kept keys whose higher digits match the prefix found
so far into a shared 2048-bin histogram, adds it into the row's global histogram, and the last
block picks the bin where the count from the top reaches k (sampling_histogram.py). The first
digit (the key's top 11 bits) is counted in pass 1, over every finite score, before the min_p
bound is known: that is exact all the same (see sampling_scores.scores_kernel), and saves a
pass over the row. After the third digit the key is exact: kth.

radix_mass_kernel x 3: top-p, the same search with masses exp(s - max) of the scores kept by
min_p and top_k, in fixed point (int64, MASS_SCALE units: exact and order-independent sums, so
every run decides the same way). The first digit's total is the kept mass (the twin's
normaliser); the bin where the mass from the top reaches top_p of it holds the cut key K. The
probability is monotone in the score, so {p >= t} is an upper set of scores: with t = p(s_K) =
float32(exp(s_K - max)) / Z, the final pass keeps every score whose p >= t, ties included,
exactly the twin's rule.

Candidates: after the first digit of either search picks bin B, nothing below B can be kept
(top-k keeps a subset of bins >= B_k, top-p after it a subset of those, and the draw a subset
of what both keep; top-p's bins >= B_p hold its whole nucleus, and its normaliser Z was summed
over the whole row in the first digit). So the second digit's pass also copies every kept
score of bins >= B (score as stored and token id, at a slot from the row's counter: one atomic
per warp, sampling_common.claim_slot; a block stops copying once the buffer overflows) into the
row's candidate buffer; if they fit (CANDIDATES, 8,192 a row), the row turns compact and every
later pass (the last digit, the other search, the draw) reads the copy instead of the row:
top-k + top-p reads the full row in 2 passes instead of 8, top-p alone in 3 instead of 5
(~45 us each at batch 256 x 128,256, from HBM). A row whose bins >= B overflow the buffer (a
flat distribution, a vocabulary of equal logits) keeps reading the logits: the same results.

A compact row's top-p search (after top-k's copy, or the linear passes' copy of the cut bins:
sampling_linear.py) needs no grid: its copy holds at most CANDIDATES scores, so the first mass
launch does all three digits in the row's first block (compact_mass_select), the histograms in
shared memory. On an H100 that took the app's defaults from 861.8 to 867.7 tok/s at batch 1
and 5,646 to 5,669 at batch 8 (random Llama-3.2-1B weights; SmolLM2-135M 1,432 to 1,448 and
9,580 to 9,692; tests/device/sampling_table.py, both trees in one call).
"""

from __future__ import annotations

import math

from numba import cuda, float32, float64, int32, int64, uint32

from gpu.kernels.bf16 import key_to_f32, ordered_key
from gpu.kernels.launch import SIMULATOR, device_function
from gpu.kernels.pdl import grid_dependency_sync
from gpu.kernels.sampling_common import (
    BINS,
    BLOCKS_PER_SM,
    F_TOP_P,
    MASS_SCALE,
    MODE_COMPACT,
    MODE_LINEAR,
    MODE_TOP_K,
    MODE_TOP_P,
    R_COUNT,
    R_DIGIT,
    R_KTH,
    R_MODE,
    R_P_T,
    R_PREFIX,
    R_REMAIN,
    R_Z,
    THREADS,
    UNROLL,
    block_share,
    claim_slot,
    fixed_mass,
    group_loop,
    kept,
    last_block,
    mass_origin,
    row_bounds,
    warp_any,
)
from gpu.kernels.sampling_histogram import (
    add_mass,
    clear_bins,
    find_bin,
    flush_bins,
    read_histogram,
    read_shared_histogram,
)


@device_function
def digit_layout(digit):
    """(shift, bins, high_mask) of the key's radix digit 0, 1 or 2 (11, 11 and 10 bits): the
    digit is bits [shift, shift + log2(bins)) of the key, high_mask the bits above it."""
    high = 32 - 11 * digit
    shift = max(high - 11, 0)
    return shift, 1 << (high - shift), ((0xFFFFFFFF >> high) << high) if high < 32 else 0


@device_function
def compact_mass_select(row, mode, fparams, rowf, rowi, cand_val, lo, hi, hs, scan, sel):
    """Top-p's three mass digits over a compact row's copy, in this one block: the histograms
    stay in shared memory and the digits follow each other after a syncthreads, where the
    row's blocks needed a launch and a cross-block merge (global atomics, the last block's
    scan) per digit: ~8 us less a step at batch 1 (H100, the module docstring). The same exact
    integer sums, so the same bins and the same cut as the three radix_mass_kernel launches.
    Every thread of the block calls it."""
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    n = rowi[R_COUNT, row]
    top, min_bound, kth, scale = row_bounds(rowf, row)
    origin = mass_origin(top)  # (fixed_mass's)
    linear = (mode & MODE_LINEAR) != 0  # Z and the mass still needed: sampling_linear.py
    z = rowf[R_Z, row]
    remain = rowi[R_REMAIN, row]
    prefix = int64(0)
    p_t = float32(0)
    for d in range(3):
        shift, bins, high_mask = digit_layout(d)
        clear_bins(lo, hi, bins)
        cuda.syncthreads()
        for j in range(tid, n, nt):
            x = cand_val[row, j] * scale
            if kept(x, min_bound, kth):
                key = int64(ordered_key(x))
                if (key & high_mask) == prefix:
                    add_mass(lo, hi, (key >> shift) & (bins - 1), fixed_mass(x, origin))
        cuda.syncthreads()
        total = read_shared_histogram(lo, hi, bins, hs, scan)
        if d == 0 and not linear:
            remain = max(int64(math.ceil(float64(fparams[F_TOP_P, row]) * total)), 1)
            z = float32(float64(total) / MASS_SCALE)
        find_bin(hs, bins, scan, remain, sel)
        if sel[0] < 0:  # nothing to cut: all the kept scores stay
            break
        prefix |= sel[0] << shift
        remain -= sel[1]
        if shift == 0:
            p_t = float32(math.exp(key_to_f32(prefix) - top)) / z
    if tid == 0:
        rowf[R_Z, row] = z
        rowf[R_P_T, row] = p_t
        rowi[R_MODE, row] = mode & ~MODE_TOP_P
        rowi[R_DIGIT, row] = 0


@device_function
def digit_group(xs, base, stop, args, state, tail):
    """One group of a row's scores, xs[u] at base + u * THREADS (only the last group, `tail`,
    has loads past `stop`): each kept score whose higher digits match the prefix counted (or
    its mass added) into its bin of this block's histogram; with `compacting`, every kept score
    of the prefix's top digit or above copied out. The warp votes once a group whether any
    lane copies: most groups of a row copy nothing, and claim_slot is a ballot a score. Its
    work lands in shared and global memory: the loop's state passes through."""
    (row, origin, min_bound, kth, scale, shift, bins, high_mask, prefix, lo, hi, rowi, cand_val,
     cand_idx, full, use_mass, compacting) = args  # fmt: skip
    want = cuda.local.array(UNROLL, int32)
    wanted = False
    for u in range(UNROLL):
        v = uint32(base + uint32(u * THREADS))
        x = xs[u] * scale
        keep = kept(x, min_bound, kth)
        if tail:
            keep = keep and v < stop
        key = uint32(ordered_key(x))
        want[u] = 0
        if compacting:
            want[u] = int32(keep and (key >> uint32(21)) >= uint32(prefix >> 21))
            wanted = wanted or want[u] != 0
        if keep and (key & uint32(high_mask)) == uint32(prefix):
            b = (key >> uint32(shift)) & uint32(bins - 1)
            if use_mass:
                add_mass(lo, hi, b, fixed_mass(x, origin))
            else:
                cuda.atomic.add(lo, b, uint32(1))
    if compacting and full[0] == 0 and warp_any(wanted):
        capacity = cand_val.shape[1]
        for u in range(UNROLL):
            slot = claim_slot(rowi, row, want[u] != 0, capacity, full)
            if want[u] != 0 and slot < capacity:
                cand_val[row, slot] = xs[u]  # as stored: read * scale again
                cand_idx[row, slot] = uint32(base + uint32(u * THREADS))
    return state


_digit_loop = group_loop(digit_group)


@device_function
def scan_digit(
    scores, start, end, row, origin, min_bound, kth, scale, shift, bins, high_mask, prefix, lo,
    hi, rowi, cand_val, cand_idx, full, use_mass, compacting,
):  # fmt: skip
    """One block's share of a radix digit over scores[start:end] (the row, or its copy once the
    row is compact; `compacting` only over the row, whose indices are the token ids), in every
    pass's loop (sampling_common.group_loop)."""
    args = (row, origin, min_bound, kth, scale, shift, bins, high_mask, prefix, lo, hi, rowi,
            cand_val, cand_idx, full, use_mass, compacting)  # fmt: skip
    _digit_loop(scores, start, end, args, 0)


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
        hs = cuda.shared.array(BINS, int64)  # the row's histogram, in the last block
        lo = cuda.shared.array(BINS, uint32)  # this block's counts, or masses' low words
        hi = cuda.shared.array(BINS, uint32)  # masses' high words and carries
        scan = cuda.shared.array(THREADS, int64)
        sel = cuda.shared.array(2, int64)
        flag = cuda.shared.array(1, int32)
        full = cuda.shared.array(1, int32)  # the row's candidates overflowed: stop copying
        tid = cuda.threadIdx.x
        shift, bins, high_mask = digit_layout(digit)
        prefix = rowi[R_PREFIX, row] if digit > 0 else int64(0)
        top, min_bound, kth, scale = row_bounds(rowf, row)
        if use_mass and compact and digit == 0:  # the whole search in one block
            if cuda.blockIdx.y == 0:
                compact_mass_select(row, mode, fparams, rowf, rowi, cand_val, lo, hi, hs, scan, sel)
            return
        clear_bins(lo, hi, bins)
        if tid == 0:
            full[0] = 0
        cuda.syncthreads()
        start, end = block_share(rowi, row, compact, chunk_len, logits.shape[1])
        scores = cand_val[row] if compact else logits[row]  # the row's copy, or the row
        scan_digit(
            scores, start, end, row, mass_origin(top), min_bound, kth, scale, shift, bins,
            high_mask, prefix, lo, hi, rowi, cand_val, cand_idx, full, use_mass, compacting,
        )  # fmt: skip
        cuda.syncthreads()
        flush_bins(lo, hi, hist, row, bins)
        if not last_block(ticket, row, flag):
            return
        total = read_histogram(hist, row, bins, hs, scan)
        linear = (mode & MODE_LINEAR) != 0  # Z and the mass still needed: sampling_linear.py
        if digit == 0 and not linear:  # top-p only: top-k's first digit is counted in pass 1
            remain = max(int64(math.ceil(float64(fparams[F_TOP_P, row]) * total)), 1)
        else:
            remain = rowi[R_REMAIN, row]
        find_bin(hs, bins, scan, remain, sel)
        if tid != 0:
            return
        if digit == 0 and not linear:
            rowf[R_Z, row] = float32(float64(total) / MASS_SCALE)
        done = sel[0] < 0
        if compacting:
            # Every score this phase can keep (and the next phases and the draw: they keep
            # fewer) is in the copied bins; from now on the row's passes read the copy.
            if not done and cuda.atomic.add(rowi, (R_COUNT, row), 0) <= cand_val.shape[1]:
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
    if SIMULATOR:  # (the simulator's jit takes no launch bounds)
        return cuda.jit(cache=True)(kernel)
    return cuda.jit(cache=True, launch_bounds=(THREADS, BLOCKS_PER_SM))(kernel)


radix_count_kernel = _radix_kernel(False)
radix_mass_kernel = _radix_kernel(True)
