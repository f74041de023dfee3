"""The radix histogram's block-wide steps, shared by pass 1 (top-k's first digit) and the
radix passes (sampling_radix.py): read the row's global histogram back, scan it from the top
down, and find the bin where the running count (or mass) reaches what is asked.

Each block counts into a shared BINS-bin histogram and adds it into the row's global one
([rows, BINS] int64 in the scratch); the row's last block (sampling_common.last_block) reads
it here with atomic exchanges, which leave it zeroed for the next pass.
"""

from __future__ import annotations

from numba import cuda, int64

from gpu.kernels.launch import device_function
from gpu.kernels.sampling_common import BINS_PER_THREAD


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
