"""Token embedding lookup and row gathering.

embed: out[t] = float32(table[token]) — one block per token, its threads striding over the
hidden dimension, so each warp reads consecutive bf16 of one table row (coalesced). The token
ids come from device buffers, never from the host, so the launch is the same for every step of
a given size (graph-capturable).

Async scheduling: a decode token sampled by the previous step may not have reached the host
when this step was launched. Its row of prev_rows names the row of sampled_prev (the sampler's
device output of that step) that holds it: token = sampled_prev[prev_rows[t]] if
prev_rows[t] >= 0 else input_ids[t]. The sampler writes sampled_prev at the end of a step and
the embedding reads it at the start of the next, on the same stream: it always reads the
previous step's ids. A prev_rows of length 0 means "all from input_ids".

gather_rows: out[i] = x[indices[i]] — picks the last row of each sequence before the LM head, so
the final norm and the [V, H] product run on S rows instead of T. Any dtype (a plain copy:
the float32 residual stream here).

numpy twins: CpuBackend.embed and CpuBackend.gather_rows (gpu/backends/cpu.py).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda

from gpu.kernels.bf16 import bf16_to_f32
from gpu.kernels.launch import threads
from gpu.kernels.pdl import grid_dependency_sync

SIGNATURES = {
    "embedding_kernel": [
        "void(int32[::1], int32[::1], int32[::1], uint16[:, ::1], float32[:, ::1])"
    ],
    "gather_rows_kernel": [
        "void(uint16[:, ::1], int32[::1], uint16[:, ::1])",
        "void(float32[:, ::1], int32[::1], float32[:, ::1])",
    ],
}


@cuda.jit(cache=True)
def embedding_kernel(input_ids, prev_rows, sampled_prev, table, out):
    grid_dependency_sync()
    t = cuda.blockIdx.x
    token = input_ids[t]
    if t < prev_rows.shape[0]:
        row = prev_rows[t]
        if row >= 0:
            token = sampled_prev[row]
    for i in range(cuda.threadIdx.x, out.shape[1], cuda.blockDim.x):
        out[t, i] = bf16_to_f32(table[token, i])


@cuda.jit(cache=True)
def gather_rows_kernel(x, indices, out):
    grid_dependency_sync()
    r = cuda.blockIdx.x
    src = indices[r]
    for i in range(cuda.threadIdx.x, out.shape[1], cuda.blockDim.x):
        out[r, i] = x[src, i]


@functools.cache
def _no_rows():
    """An empty int32 device array: no token comes from sampled_prev."""
    return cuda.to_device(np.zeros(0, dtype=np.int32))


def embed(input_ids, table, out, stream=0, prev_rows=None, sampled_prev=None) -> None:
    """out [T, H] f32 <- table [V, H] bf16 at input_ids [T], or at sampled_prev[prev_rows[t]]
    where prev_rows [T] is >= 0."""
    if out.shape[0]:
        if prev_rows is None:
            prev_rows = sampled_prev = _no_rows()
        embedding_kernel[out.shape[0], threads(256), stream](
            input_ids, prev_rows, sampled_prev, table, out
        )


def gather_rows(x, indices, out, stream=0) -> None:
    """out [S, H] <- x [T, H] at indices [S]."""
    if out.shape[0]:
        gather_rows_kernel[out.shape[0], threads(256), stream](x, indices, out)
