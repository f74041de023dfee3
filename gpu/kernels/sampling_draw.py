"""Pass 4 of the sampler (sampling.py): Gumbel-max over what the thresholds keep.

gumbel_kernel reads each kept score (the row's logits, or its candidates once the row is
compact: sampling_radix.py), keeps those above the min_p bound and the top-k threshold whose
probability reaches the top-p cut, adds Gumbel(0, 1) noise from the counter-based uniforms
(gpu/sampling/rng.py, the twin's bits) and takes the packed max; the row's last block writes
the token to out and the ring and counts it in the token state (spec step 4).

First the early exit. Pass 1 took the Gumbel-max of top-p rows without top-k over every finite
score (R_WINNER, MODE_EARLY). The max over a set that holds it is the max over any subset that
still holds it, ties included (the packed max orders them), so where the thresholds keep that
winner it is the token, and the pass reads one score instead of the row. A draw from the whole
row lands in the top-p nucleus at least top_p of the time (the nucleus holds that much of the
mass); most such rows already ended at the linear mass pass, their winner above the cut bin
(sampling_linear.py), and skip the split and the select as well as this pass's read.
"""

from __future__ import annotations

import math

from numba import cuda, float32, int32, int64, uint32

from gpu.kernels.block_reduce import block_max
from gpu.kernels.launch import device_function
from gpu.kernels.pdl import grid_dependency_sync
from gpu.kernels.sampling_common import (
    GROUP,
    I_STATE_ROW,
    MODE_COMPACT,
    MODE_EARLY,
    MODE_TRUNCATE,
    NEG_INF,
    NONE,
    R_MODE,
    R_P_T,
    R_WINNER,
    R_Z,
    SLOTS,
    THREADS,
    U_SEED,
    U_STEP,
    UNROLL,
    block_share,
    finish_row,
    group_loop,
    kept,
    last_block,
    load_group,
    noise_offset,
    noisy_insert,
    noisy_offer,
    packed_index,
    row_bounds,
    row_key,
    seed_block_best,
    shared_offset,
    whole_groups_end,
)


@device_function
def draw_group(xs, base, stop, key, top, min_bound, kth, scale, p_t, z, noisy, cand, offset,
               first, tail):  # fmt: skip
    """The Gumbel-max over one group of a row's scores, xs[u] at base + u * THREADS, of those
    the thresholds keep: into the block's best (`noisy`, sampling_common.noisy_insert), or in
    the `first` group, which has no bar yet, the thread's own (cand). Only the last group,
    `tail`, has loads past `stop`."""
    for u in range(UNROLL):
        v = uint32(base + uint32(u * THREADS))
        x = xs[u] * scale
        if tail:
            x = x if v < stop else NEG_INF
        if kept(x, min_bound, kth):
            if p_t == 0 or float32(math.exp(x - top)) / z >= p_t:
                if first:
                    cand, _, _ = noisy_offer(cand, NONE, NONE, x, v, key, offset, 1)
                else:
                    noisy_insert(noisy, x, v, key, offset, 1)
    return cand


@device_function
def draw_step(xs, base, stop, args, state, tail):
    """draw_group on a group after the first, then the bar for the next (the block's best)."""
    key, top, min_bound, kth, scale, p_t, z, noisy = args
    draw_group(xs, base, stop, key, top, min_bound, kth, scale, p_t, z, noisy, NONE, state,
               False, tail)  # fmt: skip
    return shared_offset(noisy, 1)


_draw_loop = group_loop(draw_step)


@device_function
def scan_row_draw(scores, start, end, key, top, min_bound, kth, scale, p_t, z, noisy):
    """The block's Gumbel-max over the kept scores of scores[start:end], the row itself, into
    noisy[0] (as the scores pass's draws, sampling_scores.scan_scores: the first group to the
    thread's own, then the block's best the bar), the groups in every pass's loop
    (sampling_common.group_loop); its state is the bar's offset."""
    tid = cuda.threadIdx.x
    first = start
    if uint32(start) + uint32(tid) < whole_groups_end(start, end):  # (block-uniform)
        xs = cuda.local.array(UNROLL, float32)
        base = uint32(start) + uint32(tid)
        load_group(scores, base, xs)
        # noisy_offer's offset: every score offered in full until the block has a bar
        cand = draw_group(xs, base, uint32(end), key, top, min_bound, kth, scale, p_t, z, noisy,
                          int64(NONE), -NEG_INF, True, False)  # fmt: skip
        seed_block_best(noisy, cand, int64(NONE), int64(NONE), 1)
        first = start + GROUP
    args = (key, top, min_bound, kth, scale, p_t, z, noisy)
    _draw_loop(scores, first, end, args, shared_offset(noisy, 1))


@device_function
def scan_copy_draw(cand_val, cand_idx, row, start, end, key, top, min_bound, kth, scale, p_t, z):
    """scan_row_draw over a compact row's copy (entries start:end, their token ids beside)."""
    cand = int64(NONE)
    offset = -NEG_INF  # noisy_offer's: every score offered in full until the warp has a bar
    for base0 in range(start, end, GROUP):  # block-uniform, for noise_offset
        base = base0 + cuda.threadIdx.x
        for u in range(UNROLL):
            j = base + u * THREADS
            x = cand_val[row, min(j, end - 1)] * scale
            if j < end and kept(x, min_bound, kth):
                if p_t == 0 or float32(math.exp(x - top)) / z >= p_t:
                    v = cand_idx[row, j]
                    cand, _, _ = noisy_offer(cand, NONE, NONE, x, v, key, offset, 1)
        offset = noise_offset(cand)
    return cand


@cuda.jit(cache=True)
def gumbel_kernel(
    logits, chunk_len, iparams, uparams, state, mask, ticket, best, rowf, rowi, cand_val,
    cand_idx, out, ring, ring_slot,
):  # fmt: skip
    grid_dependency_sync()
    row = cuda.blockIdx.x
    mode = rowi[R_MODE, row]
    if (mode & MODE_TRUNCATE) == 0:
        return
    top, min_bound, kth, scale = row_bounds(rowf, row)
    p_t = rowf[R_P_T, row]
    z = rowf[R_Z, row]
    won = rowi[R_WINNER, row]
    if (mode & MODE_EARLY) != 0 and won >= 0:
        # Pass 1's Gumbel-max over every finite score: if the thresholds keep it, it is the max
        # over what they keep, the token this pass would find. Checked by every block alike.
        x = logits[row, packed_index(won)] * scale
        if kept(x, min_bound, kth) and (p_t == 0 or float32(math.exp(x - top)) / z >= p_t):
            if cuda.blockIdx.y == 0 and cuda.threadIdx.x == 0:
                cuda.atomic.exch(best, row, int64(NONE))  # the split's max, if it ran: unread
                finish_row(row, won, iparams[I_STATE_ROW, row], state, mask, out, ring, ring_slot)
            return
    compact = (mode & MODE_COMPACT) != 0
    buf = cuda.shared.array(SLOTS, int64)
    flag = cuda.shared.array(1, int32)
    tid = cuda.threadIdx.x
    key = row_key(uparams[U_SEED, row], uparams[U_STEP, row])
    start, end = block_share(rowi, row, compact, chunk_len, logits.shape[1])
    if compact:
        cand = scan_copy_draw(cand_val, cand_idx, row, start, end, key, top, min_bound, kth, scale,
                              p_t, z)  # fmt: skip
        cand = block_max(buf, cand)
    else:
        noisy = cuda.shared.array(1, int64)  # the block's best noisy score
        if tid == 0:
            noisy[0] = NONE
        cuda.syncthreads()
        scan_row_draw(logits[row], start, end, key, top, min_bound, kth, scale, p_t, z, noisy)
        cuda.syncthreads()
        cand = noisy[0]
    if tid == 0 and cand >= 0:
        cuda.atomic.max(best, row, cand)
    if last_block(ticket, row, flag) and tid == 0:
        packed = cuda.atomic.exch(best, row, int64(NONE))
        finish_row(row, packed, iparams[I_STATE_ROW, row], state, mask, out, ring, ring_slot)
