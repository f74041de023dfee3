"""SiLU(gate) * up on the merged gate/up projection output.

gate_up [T, 2I] (float32, the GEMM's output) holds [gate | up] side by side; out [T, I] is bf16,
the input of the down projection. Purely elementwise and memory-bound, so the kernel is shaped
for the memory system and nothing else:

* a 2-D grid, one row (token) per blockIdx.y and a slice of the row per blockIdx.x, so no thread
  divides a flat index by I (a signed 64-bit division is a ~70-instruction software routine on
  the GPU, and the first grid-stride version paid it on every element: 6.5 us at 64 rows of
  8192 on the H200, three times its 6 MB at the copy rate; this kernel: 3.4 us, traced in
  the same graph, seventh session);
* each thread owns PER elements, i, i + threads, ... (coalesced), and issues all 2 * PER loads
  before the first use: one memory round trip a thread, not PER of them.

silu(x) = x / (1 + exp(-x)); for very negative x, exp(-x) = inf and the result is -0, as in
numpy.

numpy twin: CpuBackend.silu_mul (gpu/backends/cpu.py).
"""

from __future__ import annotations

import math

from numba import cuda, float32

from gpu.kernels.bf16 import f32_to_bf16
from gpu.kernels.launch import cdiv, threads
from gpu.kernels.pdl import grid_dependency_sync

PER = 4  # elements a thread: 2 * PER loads in flight before the first use

SIGNATURES = {"silu_mul_kernel": ["void(float32[:, ::1], uint16[:, ::1])"]}


@cuda.jit(cache=True)
def silu_mul_kernel(gate_up, out):
    grid_dependency_sync()
    inter = out.shape[1]
    row = cuda.blockIdx.y
    nthreads = cuda.blockDim.x
    base = cuda.blockIdx.x * nthreads * PER + cuda.threadIdx.x
    last = inter - 1
    gates = cuda.local.array(PER, float32)
    ups = cuda.local.array(PER, float32)
    for k in range(PER):  # all loads in flight at once; a slot past the row re-reads the last
        i = min(base + k * nthreads, last)
        gates[k] = gate_up[row, i]
        ups[k] = gate_up[row, inter + i]
    for k in range(PER):
        i = base + k * nthreads
        if i < inter:
            gate = gates[k]
            out[row, i] = f32_to_bf16(gate / (float32(1.0) + math.exp(-gate)) * ups[k])


def silu_mul(gate_up, out, stream=0) -> None:
    """out [T, I] bf16 = silu(gate_up[:, :I]) * gate_up[:, I:]."""
    rows, inter = out.shape
    if rows and inter:
        block = threads(256)
        silu_mul_kernel[(cdiv(inter, block * PER), rows), block, stream](gate_up, out)
