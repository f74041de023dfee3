"""The decode GEMV (gpu/kernels/gemv.py) vs its numpy twins, the composed ops of the cpu
backend: every prologue x epilogue, token counts that fill and that pad a bucket, K that is and
is not a multiple of the block's stride, N that is not a multiple of the rows per block.
Runs in the CUDA simulator without a GPU (tests/conftest.py) and for real on one."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import (
    assert_close,
    bf16_values,
    fresh_rng,
    poisoned,
    rope_epilogue_case,
    synced,
)
from numba import cuda

from gpu.backends.cpu import CpuBackend
from gpu.kernels import gemv
from gpu.kernels.bf16 import from_bf16_bits, round_to_bf16, to_bf16_bits

cpu = CpuBackend()
RTOL = 2.0**-7  # one bf16 rounding of an output
# With the norm prologue, an element of x near a bf16 rounding boundary may round the other
# way than in numpy (the rms differs in its last bits): one bf16 step of one input.
NORM_ATOL = 2e-3
# (tokens, K, N): one token, a padded bucket (3 of 4), a full bucket of 8; K = 4 * words with
# words a multiple of the simulator's 32 threads (no guard) or not; N not a multiple of rows.
SHAPES = [(1, 128, 37), (3, 200, 22), (8, 72, 9)]


def _inputs(rng, t, k, n):
    x = bf16_values(rng, (t, k))
    w = bf16_values(rng, (n, k), 0.1)
    residual = (rng.standard_normal((t, k)) * 2).astype(np.float32)
    norm_w = (1 + 0.1 * rng.standard_normal(k)).astype(np.float32)
    return x, w, residual, norm_w


@pytest.mark.parametrize(("t", "k", "n"), SHAPES)
def test_store_matches_linear(t, k, n):
    rng, seed = fresh_rng()
    x, w, _, _ = _inputs(rng, t, k, n)
    out = poisoned((t, n), np.float32)
    gemv.gemv(cuda.to_device(to_bf16_bits(x)), cuda.to_device(to_bf16_bits(w)), out)
    expected = np.empty((t, n), np.float32)
    cpu.linear(x, w, expected)
    assert_close(synced(out), expected, 1e-5, 1e-5, seed, "gemv store")


@pytest.mark.parametrize(("t", "k", "n"), SHAPES)
def test_add_accumulates_into_the_residual(t, k, n):
    rng, seed = fresh_rng()
    x, w, _, _ = _inputs(rng, t, k, n)
    residual = rng.standard_normal((t, n)).astype(np.float32)
    d_residual = cuda.to_device(residual)
    gemv.gemv(cuda.to_device(to_bf16_bits(x)), cuda.to_device(to_bf16_bits(w)), d_residual,
              epilogue="add")  # fmt: skip
    expected = residual.copy()
    cpu.linear_residual(x, w, expected, np.empty((t, n), np.float32))
    assert_close(synced(d_residual), expected, 1e-5, 1e-5, seed, "gemv add")


def _normed_bf16(residual, norm_w):
    """The twin of the norm prologue: the cpu rmsnorm, rounded to bf16 as the GPU's x is."""
    normed = np.empty_like(residual)
    cpu.rmsnorm(residual, norm_w, 1e-5, normed)
    return round_to_bf16(normed)


@pytest.mark.parametrize(("t", "k", "n"), SHAPES)
def test_rmsnorm_prologue_matches_rmsnorm_linear(t, k, n):
    rng, seed = fresh_rng()
    _, w, residual, norm_w = _inputs(rng, t, k, n)
    out = poisoned((t, n), np.float32)
    gemv.gemv(None, cuda.to_device(to_bf16_bits(w)), out, residual=cuda.to_device(residual),
              norm_weight=cuda.to_device(norm_w), eps=1e-5)  # fmt: skip
    expected = np.empty((t, n), np.float32)
    cpu.linear(_normed_bf16(residual, norm_w), w, expected)
    assert_close(synced(out), expected, 1e-5, NORM_ATOL, seed, "gemv rmsnorm prologue")


@pytest.mark.parametrize(("t", "k", "inter"), [(1, 128, 19), (3, 200, 6), (8, 72, 5)])
def test_rmsnorm_gate_up_silu_matches_the_composition(t, k, inter):
    rng, seed = fresh_rng()
    _, w, residual, norm_w = _inputs(rng, t, k, 2 * inter)
    out = poisoned((t, inter), np.uint16)
    d_res, d_norm_w = cuda.to_device(residual), cuda.to_device(norm_w)
    gemv.gemv(None, cuda.to_device(to_bf16_bits(w)), out, epilogue="silu",
              residual=d_res, norm_weight=d_norm_w, eps=1e-5)  # fmt: skip
    gate_up = np.empty((t, 2 * inter), np.float32)
    cpu.linear(_normed_bf16(residual, norm_w), w, gate_up)
    expected = np.empty((t, inter), np.float32)
    cpu.silu_mul(round_to_bf16(gate_up), expected)  # the product is bf16 on the composed path
    assert_close(from_bf16_bits(synced(out)), expected, RTOL, NORM_ATOL, seed, "gemv silu")


def test_padding_rows_of_a_bucket_are_not_written():
    """Three tokens run the four-token kernel: the fourth row of out stays untouched."""
    rng, _ = fresh_rng()
    x, w, _, _ = _inputs(rng, 3, 128, 8)
    out = poisoned((4, 8), np.float32)
    gemv.gemv(cuda.to_device(to_bf16_bits(x)), cuda.to_device(to_bf16_bits(w)), out[:3])
    host = synced(out)
    assert np.isfinite(host[:3]).all() and np.isnan(host[3]).all()


def test_refuses_what_it_does_not_serve():
    assert gemv.supports(8, 2048) and not gemv.supports(9, 2048) and not gemv.supports(1, 6)
    with pytest.raises(ValueError, match="at most"):
        gemv.gemv(cuda.device_array((9, 8), np.uint16), cuda.device_array((4, 8), np.uint16),
                  cuda.device_array((9, 4), np.float32))  # fmt: skip


@pytest.mark.parametrize(("t", "nh", "nkv", "hd", "k"), [(1, 4, 2, 16, 128), (3, 3, 1, 8, 72)])
def test_rmsnorm_qkv_rope_matches_the_composition(t, nh, nkv, hd, k):
    """qkv with q, k rotated, and k, v in the paged cache (one padding row: slot -1)."""
    rng, seed = fresh_rng()
    n = (nh + 2 * nkv) * hd
    _, w, residual, norm_w = _inputs(rng, t, k, n)
    case = rope_epilogue_case(rng, t, nh, nkv, hd)
    qkv = poisoned((t, n), np.float32)
    gemv.gemv(None, cuda.to_device(to_bf16_bits(w)), qkv, epilogue="rope",
              residual=cuda.to_device(residual), norm_weight=cuda.to_device(norm_w), eps=1e-5,
              rope=case.args)  # fmt: skip
    want = np.empty((t, n), np.float32)
    cpu.linear(_normed_bf16(residual, norm_w), w, want)
    case.expected(want, nh, nkv, hd)
    k_cache, v_cache, (d_k, d_v) = case.k_cache, case.v_cache, case.args[3:5]
    assert_close(synced(qkv), want, 1e-5, NORM_ATOL, seed, "gemv rope: qkv")
    assert_close(from_bf16_bits(synced(d_k)), round_to_bf16(k_cache), RTOL, NORM_ATOL, seed, "k")
    assert_close(from_bf16_bits(synced(d_v)), round_to_bf16(v_cache), RTOL, NORM_ATOL, seed, "v")
