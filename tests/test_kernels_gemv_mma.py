"""The tensor-core decode GEMV (gpu/kernels/gemv_mma.py) vs its numpy twins, the composed ops
of the cpu backend: every epilogue, 2, 3 (a padded tile) and 8 tokens, K that fills its 32-wide
chunks and K that ends inside one, N that is not a multiple of the block's rows, and a K long
enough for one weight row a lane. Runs in the CUDA simulator (the mma twin) without a GPU and
for real on one."""

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
from gpu.kernels import gemv_mma
from gpu.kernels.bf16 import from_bf16_bits, round_to_bf16, to_bf16_bits

cpu = CpuBackend()
RTOL = 2.0**-7  # one bf16 rounding of an output
# (tokens, K, N): a pair of tokens; 3 of the 8-token tile; a full tile; K = 72 and 200 end
# inside a chunk, K = 8 is a single lane's bytes; N = 37, 22, 9 leave a part-filled block.
SHAPES = [(2, 128, 37), (3, 200, 22), (8, 72, 9), (5, 8, 17)]


def _inputs(rng, t, k, n):
    return bf16_values(rng, (t, k)), bf16_values(rng, (n, k), 0.1)


def _dev(x):
    return cuda.to_device(to_bf16_bits(x))


def _sums_tolerance(x, w):
    """float32 sums of exact bf16 products, added in another order than numpy's: a few ulps of
    the sum of |products|."""
    return 1e-5 * (np.abs(x) @ np.abs(w).T).max() + 1e-6


@pytest.mark.parametrize(("t", "k", "n"), SHAPES)
def test_store_matches_linear(t, k, n):
    rng, seed = fresh_rng()
    x, w = _inputs(rng, t, k, n)
    out = poisoned((t, n), np.float32)
    gemv_mma.gemv_mma(_dev(x), _dev(w), out)
    expected = np.empty((t, n), np.float32)
    cpu.linear(x, w, expected)
    assert_close(synced(out), expected, 1e-5, _sums_tolerance(x, w), seed, "gemv_mma store")


def test_long_rows_take_one_weight_row_a_lane():
    """K past 2,048 loads one weight row a lane (rows g + 8 are copies, never stored); the add
    test below runs such a K (2,056)."""
    assert gemv_mma.plan(2056, "add")[0] == 1 and gemv_mma.plan(2048, "add")[0] == 2
    assert gemv_mma.plan(2056, "silu")[0] == 2  # paired epilogues always take two


@pytest.mark.parametrize(("t", "k", "n"), [*SHAPES, (3, 2056, 11)])
def test_add_accumulates_into_the_residual(t, k, n):
    rng, seed = fresh_rng()
    x, w = _inputs(rng, t, k, n)
    residual = rng.standard_normal((t, n)).astype(np.float32)
    d_residual = cuda.to_device(residual)
    gemv_mma.gemv_mma(_dev(x), _dev(w), d_residual, epilogue="add")
    expected = residual.copy()
    cpu.linear_residual(x, w, expected, np.empty((t, n), np.float32))
    assert_close(synced(d_residual), expected, 1e-5, _sums_tolerance(x, w), seed, "gemv_mma add")


@pytest.mark.parametrize(("t", "k", "inter"), [(2, 128, 19), (3, 200, 6), (8, 72, 5)])
def test_silu_matches_the_composition(t, k, inter):
    rng, seed = fresh_rng()
    x, w = _inputs(rng, t, k, 2 * inter)
    out = poisoned((t, inter), np.uint16)
    gemv_mma.gemv_mma(_dev(x), _dev(w), out, epilogue="silu")
    gate_up = np.empty((t, 2 * inter), np.float32)
    cpu.linear(x, w, gate_up)
    expected = np.empty((t, inter), np.float32)
    cpu.silu_mul(round_to_bf16(gate_up), expected)
    # a gate or up product next to a bf16 rounding boundary may round the other way
    atol = 4 * 2.0**-8 * np.abs(gate_up).max() ** 2
    assert_close(from_bf16_bits(synced(out)), expected, RTOL, atol, seed, "gemv_mma silu")


def test_padding_rows_of_the_tile_are_not_written():
    """Three tokens run the eight-token tile: row 3 of out stays untouched."""
    rng, _ = fresh_rng()
    x, w = _inputs(rng, 3, 64, 16)
    out = poisoned((4, 16), np.float32)
    gemv_mma.gemv_mma(_dev(x), _dev(w), out[:3])
    host = synced(out)
    assert np.isfinite(host[:3]).all() and np.isnan(host[3]).all()


def test_refuses_what_it_does_not_serve():
    assert gemv_mma.supports(2, 2048) and gemv_mma.supports(8, 2048)
    assert not gemv_mma.supports(1, 2048) and not gemv_mma.supports(9, 2048)
    assert not gemv_mma.supports(4, 12)
    with pytest.raises(ValueError, match="tokens"):
        gemv_mma.gemv_mma(cuda.device_array((9, 8), np.uint16),
                          cuda.device_array((4, 8), np.uint16),
                          cuda.device_array((9, 4), np.float32))  # fmt: skip


@pytest.mark.parametrize(
    ("t", "nh", "nkv", "hd", "k"), [(2, 4, 2, 16, 128), (3, 3, 1, 8, 72), (8, 9, 3, 64, 64)]
)
def test_qkv_rope_matches_the_composition(t, nh, nkv, hd, k):
    """qkv with q, k rotated, and k, v in the paged cache (the last row padding: slot -1);
    SmolLM2's GQA 9 / 3 at head_dim 64."""
    rng, seed = fresh_rng()
    n = (nh + 2 * nkv) * hd
    x, w = _inputs(rng, t, k, n)
    case = rope_epilogue_case(rng, t, nh, nkv, hd)
    qkv = poisoned((t, n), np.float32)
    gemv_mma.gemv_mma(_dev(x), _dev(w), qkv, epilogue="rope", rope=case.args)
    want = np.empty((t, n), np.float32)
    cpu.linear(x, w, want)
    case.expected(want, nh, nkv, hd)
    k_cache, v_cache, (d_k, d_v) = case.k_cache, case.v_cache, case.args[3:5]
    atol = _sums_tolerance(x, w)
    assert_close(synced(qkv), want, 1e-5, atol, seed, "gemv_mma rope: qkv")
    assert_close(from_bf16_bits(synced(d_k)), round_to_bf16(k_cache), RTOL, atol, seed, "k")
    assert_close(from_bf16_bits(synced(d_v)), round_to_bf16(v_cache), RTOL, atol, seed, "v")
