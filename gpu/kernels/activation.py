"""SiLU(gate) * up on the merged gate/up projection output.

gate_up [T, 2I] holds [gate | up] side by side as bf16 bits: cuBLAS writes the product in bf16
(what transformers' bf16 Linear layers return too), so the product writes, and this kernel
reads, half the bytes of a float32 product. out [T, I] is bf16, the input of the down
projection. Purely elementwise and memory-bound, so the kernel is shaped for the memory system
and nothing else:

* a 2-D grid, one row (token) per blockIdx.y and a slice of the row per blockIdx.x, so no thread
  divides a flat index by I (a signed 64-bit division is a ~70-instruction software routine on
  the GPU, and the first grid-stride version paid it on every element: 6.5 us at 64 rows of
  8192 on the H200, three times its 6 MB at the copy rate; the 2-D grid: 3.4 us, traced in the
  same graph);
* 8-byte loads and stores: a thread takes PER words of four bf16 (words w, w + threads, ...,
  coalesced), and issues all 2 * PER loads (gate and up) before the first use: one memory
  round trip a thread. That needs I % 4 == 0 (every Llama's intermediate size is a multiple
  of 256); any other I takes a one-element-a-thread kernel.

silu(x) = x / (1 + exp(-x)); for very negative x, exp(-x) = inf and the result is -0, as in
numpy.

numpy twin: CpuBackend.silu_mul (gpu/backends/cpu.py), on the bf16 values as float32.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, uint64

from gpu.kernels.bf16 import bf16_of_word, bf16_to_f32, f32_to_bf16
from gpu.kernels.launch import cdiv, device_function, threads
from gpu.kernels.pdl import grid_dependency_sync

PER = 2  # words (4 bf16 each) a thread: 2 * PER loads in flight before the first use

SIGNATURES = {
    "silu_mul_words_kernel": ["void(uint64[:, ::1], uint64[:, ::1])"],
    "silu_mul_kernel": ["void(uint16[:, ::1], uint16[:, ::1])"],
}


@device_function
def silu_times(gate, up):
    return gate / (float32(1.0) + math.exp(-gate)) * up


@device_function
def silu_of_products(gate, up):
    """silu(gate) * up for the float32 sums of a fused product's epilogue (gemv.py,
    gemv_mma.py): both rounded to bf16 first, as the composed path's bf16 product stores them,
    so every path computes one function."""
    return silu_times(bf16_to_f32(f32_to_bf16(gate)), bf16_to_f32(f32_to_bf16(up)))


@cuda.jit(cache=True)
def silu_mul_words_kernel(gate_up, out):
    """gate_up [T, I / 2] and out [T, I / 4] as uint64 words of four bf16."""
    grid_dependency_sync()
    words = out.shape[1]  # I / 4: the up half starts `words` words into a row
    row = cuda.blockIdx.y
    nthreads = cuda.blockDim.x
    base = cuda.blockIdx.x * nthreads * PER + cuda.threadIdx.x
    last = words - 1
    gates = cuda.local.array(PER, uint64)
    ups = cuda.local.array(PER, uint64)
    for k in range(PER):  # all loads in flight at once; a slot past the row re-reads the last
        w = min(base + k * nthreads, last)
        gates[k] = gate_up[row, w]
        ups[k] = gate_up[row, words + w]
    for k in range(PER):
        w = base + k * nthreads
        if w < words:
            packed = uint64(0)
            for i in range(4):
                value = silu_times(bf16_of_word(gates[k], i), bf16_of_word(ups[k], i))
                packed |= uint64(f32_to_bf16(value)) << uint64(16 * i)
            out[row, w] = packed


@cuda.jit(cache=True)
def silu_mul_kernel(gate_up, out):
    """Any I: one bf16 element a thread."""
    grid_dependency_sync()
    inter = out.shape[1]
    row = cuda.blockIdx.y
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if i < inter:
        gate = bf16_to_f32(gate_up[row, i])
        out[row, i] = f32_to_bf16(silu_times(gate, bf16_to_f32(gate_up[row, inter + i])))


def silu_mul(gate_up, out, stream=0) -> None:
    """out [T, I] bf16 = silu(gate_up[:, :I]) * gate_up[:, I:], gate_up [T, 2I] bf16 bits."""
    rows, inter = out.shape
    if gate_up.dtype != np.uint16 or gate_up.shape != (rows, 2 * inter):
        raise ValueError(f"silu_mul: gate_up {gate_up.dtype} {gate_up.shape}, out {out.shape}")
    if not rows or not inter:
        return
    block = threads(256)
    if inter % 4 == 0:
        grid = (cdiv(inter // 4, block * PER), rows)
        silu_mul_words_kernel[grid, block, stream](gate_up.view(np.uint64), out.view(np.uint64))
    else:
        silu_mul_kernel[(cdiv(inter, block), rows), block, stream](gate_up, out)
