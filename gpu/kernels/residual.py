"""residual += sum_s partials[s]: a split-K product's partial sums added to the residual stream.

Normally the kernel that reads the residual next does this add itself (rmsnorm.py's fused add,
gpu/backends/cuda/split_k.py says why). This kernel is the fallback for the one reader that
cannot: a mixed step gathers its sampled rows out of the residual before the final norm, so the
add must land first. Elementwise and memory-bound: a grid-stride loop, one float32 per thread
per iteration, the S partial sums read in order (the same order the fused add uses).

numpy twin: `residual += partials.sum(axis=0)`.
"""

from __future__ import annotations

from numba import cuda

from gpu.kernels.launch import cdiv, threads

SIGNATURES = {"add_partials_kernel": ["void(float32[:, ::1], float32[:, :, ::1])"]}


@cuda.jit(cache=True)
def add_partials_kernel(residual, partials):
    hidden = residual.shape[1]
    n = residual.shape[0] * hidden
    for e in range(cuda.grid(1), n, cuda.gridsize(1)):
        t = e // hidden
        i = e - t * hidden
        value = residual[t, i]
        for s in range(partials.shape[0]):
            value += partials[s, t, i]
        residual[t, i] = value


def add_partials(residual, partials, stream=0) -> None:
    """residual [T, H] f32 += sum over s of partials [S, T, H] f32."""
    if partials.shape[1:] != residual.shape:
        raise ValueError(f"add_partials: partials {partials.shape} for {residual.shape}")
    n = residual.shape[0] * residual.shape[1]
    if n:
        block = threads(256)
        grid = min(cdiv(n, block), 132 * 16 if block > 32 else 4)
        add_partials_kernel[grid, block, stream](residual, partials)
