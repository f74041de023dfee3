"""Token embedding lookup and row gathering.

embed: out[t] = float32(table[input_ids[t]]) — one block per token, its threads striding over
the hidden dimension, so each warp reads consecutive bf16 of one table row (coalesced). The
token ids come from a device buffer, never from the host, so the launch is the same for every
step of a given size (graph-capturable).

gather_rows: out[i] = x[indices[i]] — picks the last row of each sequence before the LM head, so
the final norm and the [V, H] product run on S rows instead of T. Any dtype (a plain copy:
the float32 residual stream here).

numpy twins: CpuBackend.embed and CpuBackend.gather_rows (gpu/backends/cpu.py).
"""

from __future__ import annotations

from numba import cuda

from gpu.kernels.bf16 import bf16_to_f32
from gpu.kernels.launch import threads

SIGNATURES = {
    "embedding_kernel": ["void(int32[::1], uint16[:, ::1], float32[:, ::1])"],
    "gather_rows_kernel": [
        "void(uint16[:, ::1], int32[::1], uint16[:, ::1])",
        "void(float32[:, ::1], int32[::1], float32[:, ::1])",
    ],
}


@cuda.jit(cache=True)
def embedding_kernel(input_ids, table, out):
    t = cuda.blockIdx.x
    token = input_ids[t]
    for i in range(cuda.threadIdx.x, out.shape[1], cuda.blockDim.x):
        out[t, i] = bf16_to_f32(table[token, i])


@cuda.jit(cache=True)
def gather_rows_kernel(x, indices, out):
    r = cuda.blockIdx.x
    src = indices[r]
    for i in range(cuda.threadIdx.x, out.shape[1], cuda.blockDim.x):
        out[r, i] = x[src, i]


def embed(input_ids, table, out, stream=0) -> None:
    """out [T, H] f32 <- table [V, H] bf16 at input_ids [T]."""
    if out.shape[0]:
        embedding_kernel[out.shape[0], threads(256), stream](input_ids, table, out)


def gather_rows(x, indices, out, stream=0) -> None:
    """out [S, H] <- x [T, H] at indices [S]."""
    if out.shape[0]:
        gather_rows_kernel[out.shape[0], threads(256), stream](x, indices, out)
