"""Matrix products through cuBLAS (nvmath.bindings.cublas.gemm_ex), on the backend's stream.

`linear(x, w, out)` computes out = x @ w.T for row-major x [T, K] (bf16 bits), w [N, K] (bf16
bits, PyTorch's nn.Linear layout) and out [T, N] (float32, or bf16 bits), with float32
accumulation (CUBLAS_COMPUTE_32F: bf16 tensor cores, fp32 sums).

The transpose trick. cuBLAS is column-major: it sees a row-major [R, C] array as the
column-major [C, R] array, i.e. its transpose, for free. So we ask cuBLAS for the transpose of
what we want, out.T = w @ x.T, an [N, T] column-major product, which in memory *is* the
row-major out [T, N]:

    C (N x T, ldc = N) = op(A) (N x K) * op(B) (K x T)
    A = w   : row-major [N, K] = column-major [K, N], lda = K -> op(A) = A^T   (transa = T)
    B = x   : row-major [T, K] = column-major [K, T], ldb = K -> op(B) = B     (transb = N)

No data is ever transposed. Leading dimensions come from the row strides, so row slices of the
preallocated buffers (x[:T]) work as they are.

cuBLAS runs on the Numba stream (cublasSetStream) with a workspace of our own
(cublasSetWorkspace): with it, cuBLAS allocates nothing during a call, which is what lets its
calls be captured into a CUDA graph together with the Numba kernels. alpha and beta are host
scalars (the default pointer mode), read when the call is enqueued (or captured).

The heuristic's one algorithm (CUBLAS_GEMM_DEFAULT), not a per-shape tuned cuBLASLt plan: on the
H200 the tuned products left whole decode steps no faster (GPU time of a step, batch 8: 1.331 ms
tuned against 1.275; batch 64: 1.480 against 1.457) and the tuning added 14 s to start-up.

Under the CUDA simulator there is no cuBLAS: SimulatorGemm does the same product in numpy on the
simulated device arrays (bf16 inputs, float32 accumulation), so the backend's glue can be tested
without a GPU.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from gpu.kernels.bf16 import from_bf16_bits, to_bf16_bits

CUDA_R_32F = 0
CUDA_R_16BF = 14
WORKSPACE_BYTES = 32 << 20  # cuBLAS asks for up to 32 MiB on Hopper


def device_pointer(array) -> int:
    """The device address of a Numba device array's first element (slices included)."""
    return int(array.__cuda_array_interface__["data"][0])


def check_linear(x, w, out) -> bool:
    """Check the operands of out = x @ w.T: x [T, K] and w [N, K] bf16 bits, out [T, N].
    Returns whether there is anything to compute (T > 0)."""
    t, k = x.shape
    if w.shape[1] != k or out.shape != (t, w.shape[0]):
        raise ValueError(f"linear: x {x.shape} @ w {w.shape}.T -> out {out.shape}")
    if x.dtype != np.uint16 or w.dtype != np.uint16:
        raise TypeError("linear: x and w must be bf16 bits (uint16)")
    return t > 0


class CublasGemm:
    def __init__(self, stream) -> None:
        from nvmath.bindings import cublas

        self._cublas = cublas
        self.handle = cublas.create()
        cublas.set_stream(self.handle, int(stream.handle))
        self.workspace = cuda.device_array(WORKSPACE_BYTES, dtype=np.uint8, stream=stream)
        cublas.set_workspace(self.handle, device_pointer(self.workspace), WORKSPACE_BYTES)
        self._one = np.ones(1, dtype=np.float32)  # alpha, and beta when accumulating
        self._zero = np.zeros(1, dtype=np.float32)
        self._op_t = int(cublas.Operation.T)
        self._op_n = int(cublas.Operation.N)
        self._compute = int(cublas.ComputeType.COMPUTE_32F)
        self._algo = int(cublas.GemmAlgo.DFALT)

    def linear(self, x, w, out, accumulate: bool = False) -> None:
        """out = x @ w.T, or out += x @ w.T with accumulate (beta = 1; out float32)."""
        if not check_linear(x, w, out):
            return
        (t, k), n = x.shape, w.shape[0]
        ctype = CUDA_R_32F if out.dtype == np.float32 else CUDA_R_16BF
        ldc = out.strides[0] // out.dtype.itemsize
        self._cublas.gemm_ex(
            self.handle, self._op_t, self._op_n, n, t, k,
            self._one.ctypes.data, device_pointer(w), CUDA_R_16BF, w.strides[0] // 2,
            device_pointer(x), CUDA_R_16BF, x.strides[0] // 2,
            (self._one if accumulate else self._zero).ctypes.data, device_pointer(out), ctype, ldc,
            self._compute, self._algo,
        )  # fmt: skip

    def close(self) -> None:
        if self.handle:
            self._cublas.destroy(self.handle)
            self.handle = 0


class SimulatorGemm:
    """The same product in numpy, for the CUDA simulator (which has no cuBLAS)."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def linear(self, x, w, out, accumulate: bool = False) -> None:
        if x.shape[0] == 0:
            return
        xf = from_bf16_bits(x.copy_to_host())
        wf = from_bf16_bits(w.copy_to_host())
        result = np.matmul(xf, wf.T, dtype=np.float32)
        if accumulate:
            result += out.copy_to_host()
        out.copy_to_device(result if out.dtype == np.float32 else to_bf16_bits(result))

    def close(self) -> None:
        pass
