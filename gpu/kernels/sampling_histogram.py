"""The radix histogram's block-wide steps, shared by pass 1 (top-k's first digit) and the
radix passes (sampling_radix.py): read the row's global histogram back, scan it from the top
down, and find the bin where the running count (or mass) reaches what is asked.

Each block counts into a shared BINS-bin histogram and adds it into the row's global one
([rows, BINS] int64 in the scratch); the row's last block (sampling_common.last_block) reads
it here with atomic exchanges, which leave it zeroed for the next pass.

The shared histogram is two uint32 arrays, not one int64 array: sm_90 has no 64-bit add in
shared memory (an int64 atomic there compiles to a compare-and-swap spin loop, ATOMS.CAST.SPIN.64,
which retries once per colliding lane: a flat row sends most of its scores into a few bins).
A count fits 32 bits (a block reads under 2**19 scores). A mass (int64 fixed point, under
2**44 a score) goes in as its low 32 bits (native ATOMS.ADD, whose returned old value shows a
carry out of bit 31) and its high bits plus that carry into the second array, in units of 2**32
(under 2**19 * (2**12 + 1) < 2**32 a bin): the bin's total is hi * 2**32 + lo, the exact integer
sum whatever the order, as the int64 sum was.
"""

from __future__ import annotations

from numba import cuda, int64, uint32, uint64

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
    return scan_from_top(hs, bins, scan)


@device_function
def read_shared_histogram(lo, hi, bins, hs, scan):
    """read_histogram for a histogram that stayed in this block's shared memory (a row one
    block searches alone): hs[b] = the bin's exact total, scan as read_histogram leaves it.
    Returns the total. Every thread of the block calls it, after a syncthreads."""
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    for b in range(tid, bins, nt):
        hs[b] = (int64(hi[b]) << 32) + int64(lo[b])
    cuda.syncthreads()
    return scan_from_top(hs, bins, scan)


@device_function
def scan_from_top(hs, bins, scan):
    """scan[t] = the sum of the bins of threads 0..t, thread t taking bins//nt bins of hs from
    the top down; returns the total (after hs is filled and synced)."""
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
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


@device_function
def clear_bins(lo, hi, bins):
    """Zero this block's shared histogram (every thread calls it; the caller syncs)."""
    for b in range(cuda.threadIdx.x, bins, cuda.blockDim.x):
        lo[b] = 0
        hi[b] = 0


@device_function
def add_mass(lo, hi, b, weight):
    """Add a fixed-point mass (0 <= weight < 2**44) to bin b: low word, then high word + carry."""
    low = uint32(weight & 0xFFFFFFFF)
    high = uint32(weight >> 32)
    old = cuda.atomic.add(lo, b, low)
    if uint64(old) + uint64(low) > uint64(0xFFFFFFFF):
        high = uint32(high + 1)
    if high != 0:
        cuda.atomic.add(hi, b, high)


@device_function
def flush_bins(lo, hi, hist, row, bins):
    """Add this block's shared histogram into the row's global one (after a syncthreads)."""
    for b in range(cuda.threadIdx.x, bins, cuda.blockDim.x):
        total = (int64(hi[b]) << 32) + int64(lo[b])
        if total != 0:
            cuda.atomic.add(hist, (row, b), total)
