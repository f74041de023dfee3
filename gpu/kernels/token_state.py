"""Writing rows of the sampler's token state (gpu/sampling/token_state.py) on the device.

A sequence's row is written once, when it is first sampled in it: zeroed, then its nonzero
cells (prompt bits, output counts, banned bits) scattered. The sampler kernel counts every
token it samples from then on, so this runs only on the steps that admit (or recompute) a
sequence with a penalty or a ban, on the stream before that step's forward: in stream order
after every earlier sampler, so a count the previous owner's sampler added for a token that
was then discarded never reaches the new owner.

The row's bit mask (gpu/sampling/token_state.state_mask: a bit a nonzero cell) is written with
it, and the sampler sets the bit of each token it counts.

One block per written row: its threads zero the row, sync, then scatter the cells. The
variable-length inputs come packed in one int32 buffer (one upload): the rows, their offsets
into the cells, the cells' token ids, and their uint16 values widened to int32.

numpy twin: gpu/sampling/token_state.write_states (and state_mask).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, uint16, uint32

from gpu.kernels.launch import threads
from gpu.kernels.pdl import grid_dependency_sync

SIGNATURES = {
    "write_states_kernel": [
        "void(uint16[:, ::1], uint32[:, ::1], int32[::1], int32[::1], int32[::1], int32[::1])",
    ],
}


@cuda.jit(cache=True)
def write_states_kernel(state, mask, rows, offsets, tokens, values):
    grid_dependency_sync()
    b = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    row = rows[b]
    vocab = state.shape[1]
    for v in range(tid, vocab, nt):
        state[row, v] = uint16(0)
    for w in range(tid, mask.shape[1], nt):
        mask[row, w] = uint32(0)
    cuda.syncthreads()
    for i in range(offsets[b] + tid, offsets[b + 1], nt):
        tok = tokens[i]
        if tok >= 0 and tok < vocab:
            state[row, tok] = uint16(values[i])
            if values[i] != 0:
                cuda.atomic.or_(mask, (row, tok >> 5), uint32(1) << uint32(tok & 31))


def pack_writes(writes) -> np.ndarray:
    """A step's state_writes [(row, token ids, uint16 values)] as one int32 array:
    rows [n], offsets [n + 1], token ids [total], values [total]."""
    n = len(writes)
    lengths = np.array([len(t) for _, t, _ in writes], dtype=np.int64)
    total = int(lengths.sum())
    packed = np.empty(2 * n + 1 + 2 * total, dtype=np.int32)
    packed[:n] = [row for row, _, _ in writes]
    packed[n] = 0
    packed[n + 1 : 2 * n + 1] = np.cumsum(lengths)
    start = 2 * n + 1
    if total:
        packed[start : start + total] = np.concatenate([t for _, t, _ in writes])
        packed[start + total :] = np.concatenate([v for _, _, v in writes])
    return packed


def unpack(packed, num_rows: int, total: int) -> tuple:
    """(rows, offsets, tokens, values): the views of a pack_writes layout (host or device)."""
    start = 2 * num_rows + 1
    return (
        packed[:num_rows],
        packed[num_rows:start],
        packed[start : start + total],
        packed[start + total : start + 2 * total],
    )


def write_states(state, mask, rows, offsets, tokens, values, stream=0) -> None:
    """For each b: zero state[rows[b]] and mask[rows[b]], then state[rows[b], tokens[i]] =
    values[i] for i in offsets[b]..offsets[b + 1] (int32 device arrays; values are the uint16
    cells widened), each nonzero one's bit set in the mask."""
    if rows.shape[0]:
        write_states_kernel[rows.shape[0], threads(1024), stream](
            state, mask, rows, offsets, tokens, values
        )
