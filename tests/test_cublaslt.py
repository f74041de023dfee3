"""Tuned cuBLASLt products (gpu/backends/cuda/cublaslt.py) against numpy, on the GPU.

The tuning runs every candidate algorithm several times on the real operands: these tests check
that the product is still right afterwards (the accumulating form keeps what was in `out`),
for awkward shapes and row-slice operands, and that two instances agree bit for bit (the choice
is shared per process, so an eager engine and a graphed one compute the same bits)."""

from __future__ import annotations

import numpy as np
import pytest

from gpu.backends import cuda_available
from gpu.kernels.bf16 import from_bf16_bits, round_to_bf16, to_bf16_bits

pytestmark = pytest.mark.skipif(not cuda_available(), reason="needs an NVIDIA GPU (cuBLASLt)")


def _operands(rng, t: int, n: int, k: int):
    x = round_to_bf16(rng.standard_normal((t, k), np.float32))
    w = round_to_bf16(rng.standard_normal((n, k), np.float32) * 0.1)
    return x, w


@pytest.mark.parametrize(
    "t,n,k",
    [(1, 64, 64), (3, 96, 40), (37, 3072, 2048), (64, 2048, 8192), (200, 1000, 576)],
)
@pytest.mark.parametrize("accumulate", [False, True])
def test_linear_matches_numpy(t, n, k, accumulate):
    from numba import cuda

    from gpu.backends.cuda.cublaslt import CublasLtGemm

    rng = np.random.default_rng(t * 1000 + n + k)
    x, w = _operands(rng, t, n, k)
    start = rng.standard_normal((t, n), np.float32)
    stream = cuda.stream()
    gemm = CublasLtGemm(stream)
    out = cuda.to_device(start if accumulate else np.zeros_like(start), stream=stream)
    xd, wd = cuda.to_device(to_bf16_bits(x)), cuda.to_device(to_bf16_bits(w))
    gemm.linear(xd, wd, out, accumulate)
    got = out.copy_to_host(stream=stream)
    stream.synchronize()
    want = np.matmul(x, w.T, dtype=np.float64) + (start if accumulate else 0)
    scale = np.abs(np.matmul(np.abs(x), np.abs(w.T))).max() + 1
    np.testing.assert_allclose(got, want, atol=1e-5 * scale, rtol=1e-5)
    gemm.close()


def test_bf16_output_row_slices_and_bitwise_agreement():
    from numba import cuda

    from gpu.backends.cuda.cublaslt import CublasLtGemm

    rng = np.random.default_rng(3)
    x, w = _operands(rng, 40, 264, 136)  # rows of 272 and 528 bytes
    stream = cuda.stream()
    xd = cuda.to_device(to_bf16_bits(x))
    wd = cuda.to_device(to_bf16_bits(w))
    results = []
    for _ in range(2):  # two instances: the second reuses the process's choice
        gemm = CublasLtGemm(stream)
        out = cuda.device_array((40, 264), np.uint16)
        gemm.linear(xd[3:27], wd, out[3:27])  # row slices: 16-byte aligned, not 256
        results.append(out.copy_to_host(stream=stream)[3:27])
        stream.synchronize()
        gemm.close()
    assert np.array_equal(results[0], results[1])
    want = x[3:27] @ w.T
    np.testing.assert_allclose(from_bf16_bits(results[0]), want, rtol=1e-2, atol=1e-2)


def test_a_shape_cublaslt_cannot_plan_runs_on_gemm_ex(monkeypatch):
    from numba import cuda

    from gpu.backends.cuda.cublaslt import FALLBACK, CublasLtGemm

    def no_plan(self, key, ptrs):
        raise RuntimeError("no algorithm")

    monkeypatch.setattr(CublasLtGemm, "_make_plan", no_plan)
    rng = np.random.default_rng(4)
    x, w = _operands(rng, 5, 48, 32)
    stream = cuda.stream()
    gemm = CublasLtGemm(stream)
    out = cuda.device_array((5, 48), np.float32)
    gemm.linear(cuda.to_device(to_bf16_bits(x)), cuda.to_device(to_bf16_bits(w)), out)
    got = out.copy_to_host(stream=stream)
    stream.synchronize()
    assert list(gemm._plans.values()) == [FALLBACK]
    np.testing.assert_allclose(got, x @ w.T, rtol=1e-5, atol=1e-4)
    gemm.close()
