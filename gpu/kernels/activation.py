"""SiLU(gate) * up on the merged gate/up projection output.

gate_up [T, 2I] (float32, the GEMM's output) holds [gate | up] side by side; out [T, I] is bf16,
the input of the down projection. Purely elementwise and memory-bound: a grid-stride loop over
the T * I outputs, each thread reading gate[i] and up[i] (two coalesced streams) and writing one
bf16. silu(x) = x / (1 + exp(-x)); for very negative x, exp(-x) = inf and the result is -0, as in
numpy.

numpy twin: CpuBackend.silu_mul (gpu/backends/cpu.py).
"""

from __future__ import annotations

import math

from numba import cuda, float32

from gpu.kernels.bf16 import f32_to_bf16
from gpu.kernels.launch import cdiv, threads
from gpu.kernels.pdl import grid_dependency_sync

SIGNATURES = {"silu_mul_kernel": ["void(float32[:, ::1], uint16[:, ::1])"]}


@cuda.jit(cache=True)
def silu_mul_kernel(gate_up, out):
    grid_dependency_sync()
    inter = out.shape[1]
    n = out.shape[0] * inter
    for e in range(cuda.grid(1), n, cuda.gridsize(1)):
        t = e // inter
        i = e - t * inter
        gate = gate_up[t, i]
        up = gate_up[t, inter + i]
        out[t, i] = f32_to_bf16(gate / (float32(1.0) + math.exp(-gate)) * up)


def silu_mul(gate_up, out, stream=0) -> None:
    """out [T, I] bf16 = silu(gate_up[:, :I]) * gate_up[:, I:]."""
    n = out.shape[0] * out.shape[1]
    if n:
        block = threads(256)
        grid = min(cdiv(n, block), 132 * 16 if block > 32 else 4)
        silu_mul_kernel[grid, block, stream](gate_up, out)
