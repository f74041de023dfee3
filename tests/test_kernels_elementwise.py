"""The small kernels vs their numpy twins (gpu/backends/cpu.py): the bf16 shim, embedding,
gather_rows, rmsnorm, add_rmsnorm, silu_mul, rope + KV write. Runs in the CUDA simulator
without a GPU (tests/conftest.py) and for real on one."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from kernel_helpers import (
    BF16_NAN,
    assert_close,
    bf16_values,
    fresh_rng,
    from_bf16_bits,
    poisoned,
    synced,
)
from numba import cuda

from gpu.backends.cpu import CpuBackend
from gpu.kernels import activation, embedding, rmsnorm, rope_kv
from gpu.kernels.bf16 import (
    bf16_to_f32,
    f32_to_bf16,
    key_to_f32,
    ordered_key,
    round_to_bf16,
    to_bf16_bits,
)
from gpu.rope import rope_cos_sin

BF16_RTOL = 2.0**-7  # one bf16 rounding of the output, with room for fp32 summation order
cpu = CpuBackend()


@cuda.jit
def _bf16_roundtrip(x, bits, back, keys, unkeyed):
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        b = f32_to_bf16(x[i])
        bits[i] = b
        back[i] = bf16_to_f32(b)
        keys[i] = ordered_key(x[i])
        unkeyed[i] = key_to_f32(keys[i])


def test_bf16_shim_matches_numpy_bit_for_bit():
    rng, seed = fresh_rng()
    x = (rng.standard_normal(200) * 10.0 ** rng.integers(-30, 30, 200)).astype(np.float32)
    # Halfway cases both ways (ties to even), extremes and specials.
    x[:12] = np.array(
        [0x3F808000, 0x3F818000, 0x7F7FFFFF, 0x00000001, 0x80000000, 0x7F800000, 0xFF800000,
         0x7FC00000, 0x7F800001, 0xFFC00001, 0x3F80FFFF, 0xBF808001],
        np.uint32,
    ).view(np.float32)  # fmt: skip
    bits = poisoned(x.shape, np.uint16)
    back = poisoned(x.shape, np.float32)
    keys = cuda.to_device(np.zeros(x.shape, np.int64))
    unkeyed = poisoned(x.shape, np.float32)
    _bf16_roundtrip[2, 32](cuda.to_device(x), bits, back, keys, unkeyed)
    expected = to_bf16_bits(x)
    got = synced(bits)
    nan = np.isnan(x)
    assert (got[~nan] == expected[~nan]).all(), f"KERNEL_TEST_SEED={seed}"
    assert np.isnan(from_bf16_bits(got[nan])).all()
    assert np.array_equal(synced(back)[~nan], from_bf16_bits(expected)[~nan])
    order = np.argsort(x[~nan], kind="stable")
    k = synced(keys)[~nan]
    assert (np.diff(k[order]) >= 0).all(), "ordered_key must sort like the floats"
    assert np.array_equal(synced(unkeyed)[~nan].view(np.uint32), x[~nan].view(np.uint32))


def test_embedding_and_gather_rows():
    rng, seed = fresh_rng()
    vocab, hidden, tokens = 50, 40, 5
    table = bf16_values(rng, (vocab, hidden))
    ids = rng.integers(0, vocab, tokens).astype(np.int32)
    out = poisoned((tokens, hidden), np.float32)
    embedding.embed(cuda.to_device(ids), cuda.to_device(to_bf16_bits(table)), out)
    expected = np.zeros((tokens, hidden), np.float32)
    cpu.embed(ids, table, expected)
    assert np.array_equal(synced(out), expected), f"KERNEL_TEST_SEED={seed}"

    x_bits = to_bf16_bits(bf16_values(rng, (tokens, hidden)))
    rows = np.array([4, 0, 4], np.int32)
    gathered = poisoned((3, hidden), np.uint16)
    embedding.gather_rows(cuda.to_device(x_bits), cuda.to_device(rows), gathered)
    assert np.array_equal(synced(gathered), x_bits[rows])


@pytest.mark.parametrize("hidden", [72, 1])
def test_rmsnorm(hidden):
    rng, seed = fresh_rng()
    x = (rng.standard_normal((3, hidden)) * 3).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32)
    out = poisoned(x.shape, np.uint16)
    rmsnorm.rmsnorm(cuda.to_device(x), cuda.to_device(w), 1e-5, out)
    expected = np.zeros_like(x)
    cpu.rmsnorm(x, w, 1e-5, expected)
    assert_close(from_bf16_bits(synced(out)), expected, BF16_RTOL, 1e-6, seed, "rmsnorm")


def test_add_rmsnorm_updates_the_residual():
    rng, seed = fresh_rng()
    x = rng.standard_normal((4, 100)).astype(np.float32)
    residual = rng.standard_normal((4, 100)).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(100)).astype(np.float32)
    d_residual = cuda.to_device(residual)
    out = poisoned(x.shape, np.uint16)
    rmsnorm.add_rmsnorm(cuda.to_device(x), d_residual, cuda.to_device(w), 1e-6, out)
    expected, expected_residual = np.zeros_like(x), residual.copy()
    cpu.add_rmsnorm(x, expected_residual, w, 1e-6, expected)
    assert_close(synced(d_residual), expected_residual, 1e-7, 0, seed, "residual")
    assert_close(from_bf16_bits(synced(out)), expected, BF16_RTOL, 1e-6, seed, "add_rmsnorm")


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # simulator: f64 -> f32
def test_silu_mul():
    rng, seed = fresh_rng()
    inter = 50
    gate_up = (rng.standard_normal((3, 2 * inter)) * 4).astype(np.float32)
    gate_up[0, :3] = [-200.0, 0.0, 90.0]  # exp overflow gives -0, as in numpy
    out = poisoned((3, inter), np.uint16)
    activation.silu_mul(cuda.to_device(gate_up), out)
    expected = np.zeros((3, inter), np.float32)
    cpu.silu_mul(gate_up, expected)
    assert_close(from_bf16_bits(synced(out)), expected, BF16_RTOL, 1e-30, seed, "silu_mul")


@pytest.mark.parametrize(
    "num_heads, num_kv_heads, head_dim, scaling",
    [(6, 2, 16, None), (4, 1, 64, "llama3")],
)
def test_rope_rotates_in_place_and_writes_the_paged_cache(
    num_heads, num_kv_heads, head_dim, scaling
):
    rng, seed = fresh_rng()
    rope_scaling = None
    if scaling:
        rope_scaling = SimpleNamespace(
            rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_position_embeddings=64,
        )  # fmt: skip
    cos, sin = rope_cos_sin(head_dim, 500000.0, 300, rope_scaling)
    tokens, num_blocks, block_size = 5, 6, 4
    width = (num_heads + 2 * num_kv_heads) * head_dim
    qkv = (rng.standard_normal((tokens, width)) * 2).astype(np.float32)
    positions = rng.integers(0, 300, tokens).astype(np.int32)  # mid-sequence positions
    slots = rng.choice(num_blocks * block_size, tokens, replace=False).astype(np.int32)
    slots[2] = -1  # a padding row: rotated, not written
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_before = bf16_values(rng, shape)
    v_before = bf16_values(rng, shape)

    d_qkv, k_cache, v_cache = (
        cuda.to_device(qkv),
        cuda.to_device(to_bf16_bits(k_before)),
        cuda.to_device(to_bf16_bits(v_before)),
    )
    rope_kv.rope_kv_write(
        d_qkv, cuda.to_device(positions), cuda.to_device(cos), cuda.to_device(sin),
        k_cache, v_cache, cuda.to_device(slots), num_heads, num_kv_heads, head_dim,
    )  # fmt: skip
    expected_qkv, k_expected, v_expected = qkv.copy(), k_before.copy(), v_before.copy()
    cpu.rope_kv_write(
        expected_qkv, positions, cos, sin, k_expected, v_expected, slots,
        num_heads, num_kv_heads, head_dim,
    )  # fmt: skip
    assert_close(synced(d_qkv), expected_qkv, 1e-6, 1e-6, seed, "rotated qkv")
    assert_close(
        from_bf16_bits(synced(k_cache)), round_to_bf16(k_expected), 2.0**-8, 1e-6, seed, "k"
    )
    assert np.array_equal(from_bf16_bits(synced(v_cache)), round_to_bf16(v_expected))


def test_poison_is_nan():
    assert np.isnan(from_bf16_bits(np.array([BF16_NAN])))[0]
