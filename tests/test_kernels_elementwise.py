"""The small kernels vs their numpy twins (gpu/backends/cpu.py): the bf16 shim, embedding,
gather_rows, the block reductions, rmsnorm, silu_mul, rope + KV write. Runs in the CUDA
simulator without a GPU (tests/conftest.py) and for real on one."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import numpy as np
import pytest
from kernel_helpers import (
    BF16_NAN,
    assert_close,
    bf16_values,
    fresh_rng,
    from_bf16_bits,
    gpu_code_path,
    poisoned,
    synced,
)
from numba import cuda, float32, float64, int32

from gpu.backends.cpu import CpuBackend
from gpu.kernels import activation, block_reduce, embedding, rmsnorm, rope_kv
from gpu.kernels.bf16 import (
    bf16_to_f32,
    f32_to_bf16,
    key_to_f32,
    ordered_key,
    round_to_bf16,
    to_bf16_bits,
)
from gpu.kernels.block_reduce import block_argmax, block_max, block_sum
from gpu.kernels.launch import MAX_THREADS
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


@cuda.jit
def _block_reductions(xf, xd, xi, vals, idx, sums_f, sums_d, sums_i, maxes, best_v, best_i):
    """Every thread writes the result it got back: all threads of a block must agree."""
    fbuf = cuda.shared.array(MAX_THREADS, float32)
    dbuf = cuda.shared.array(MAX_THREADS, float64)
    ibuf = cuda.shared.array(MAX_THREADS, int32)
    g = cuda.grid(1)
    # Several reductions in a row on the same scratch: each must leave it free for the next.
    sums_f[g] = block_sum(fbuf, xf[g])
    maxes[g] = block_max(fbuf, xf[g])
    sums_d[g] = block_sum(dbuf, xd[g])
    sums_i[g] = block_sum(ibuf, xi[g])
    v, i = block_argmax(fbuf, ibuf, vals[g], idx[g])
    best_v[g] = v
    best_i[g] = i


def _expected_argmax(vals: np.ndarray, idx: np.ndarray) -> tuple[float, int]:
    real = idx >= 0
    if not real.any():
        return -np.inf, -1
    top = vals[real].max()
    return top, int(idx[real & (vals == top)].min())


@pytest.mark.parametrize("block", [32, 128])
@pytest.mark.parametrize("path", ["simulator", "gpu"])
def test_block_reductions(block, path):
    rng, seed = fresh_rng()
    blocks = 4
    n = blocks * block
    xf = rng.standard_normal(n).astype(np.float32)
    xd = rng.standard_normal(n)
    xi = rng.integers(-1000, 1000, n).astype(np.int32)
    vals = rng.integers(0, 4, n).astype(np.float32)  # many ties
    idx = rng.permutation(10 * n)[:n].astype(np.int32)
    nothing = rng.random(n) < 0.3  # threads with nothing to offer
    vals[nothing], idx[nothing] = -np.inf, -1
    vals[block : 2 * block] = -np.inf  # block 1: only -inf, the smallest real index wins
    idx[2 * block : 3 * block] = -1  # block 2: nobody offers anything
    vals[2 * block : 3 * block] = -np.inf
    outs = [poisoned(n, dt) for dt in (np.float32, np.float64, np.int32, np.float32)]
    best_v, best_i = poisoned(n, np.float32), poisoned(n, np.int32)
    args = [cuda.to_device(a) for a in (xf, xd, xi, vals, idx)] + outs + [best_v, best_i]
    with gpu_code_path(block_reduce) if path == "gpu" else contextlib.nullcontext():
        _block_reductions[blocks, block](*args)
        got = [synced(a) for a in (*outs, best_v, best_i)]
    sums_f, sums_d, sums_i, maxes, got_v, got_i = (g.reshape(blocks, block) for g in got)
    msg = f"KERNEL_TEST_SEED={seed}"
    for b in range(blocks):
        part = slice(b * block, (b + 1) * block)
        np.testing.assert_allclose(sums_f[b], xf[part].sum(dtype=np.float64), 1e-5, 1e-5, msg)
        assert len(set(sums_f[b].tolist())) == 1, f"threads disagree on the sum, {msg}"
        np.testing.assert_allclose(sums_d[b], xd[part].sum(), 1e-12, 1e-12, msg)
        assert (sums_i[b] == xi[part].sum()).all(), msg
        assert (maxes[b] == xf[part].max()).all(), msg
        top, first = _expected_argmax(vals[part], idx[part])
        assert (got_i[b] == first).all(), f"block {b}: {got_i[b]} != {first}, {msg}"
        assert (got_v[b] == top).all(), msg


def _rmsnorm_inputs(rng, rows, hidden):
    x = (rng.standard_normal((rows, hidden)) * 3).astype(np.float32)
    w = (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32)
    return x, w


@pytest.fixture(params=["row_in_registers", "general"])
def rmsnorm_path(request, monkeypatch):
    """Both kernels of rmsnorm.py: the row kept in registers, and the general strided one."""
    if request.param == "general":
        monkeypatch.setattr(rmsnorm, "ROW_IN_REGISTERS_MAX", 0)
    return request.param


# 72 and 100: not a multiple of the block; 1 and 31: shorter than one warp; 33: one past it;
# 64: two sweeps.
@pytest.mark.parametrize("rows, hidden", [(3, 72), (1, 100), (2, 1), (1, 31), (2, 33), (5, 64)])
def test_rmsnorm(rows, hidden, rmsnorm_path):
    rng, seed = fresh_rng()
    x, w = _rmsnorm_inputs(rng, rows, hidden)
    out = poisoned(x.shape, np.uint16)
    rmsnorm.rmsnorm(cuda.to_device(x), cuda.to_device(w), 1e-5, out)
    expected = np.zeros_like(x)
    cpu.rmsnorm(x, w, 1e-5, expected)
    assert_close(from_bf16_bits(synced(out)), expected, BF16_RTOL, 1e-6, seed, "rmsnorm")


def test_rmsnorm_with_the_gpu_reduction():
    """The row kernel with block_sum's warp-shuffle path (emulated in the simulator)."""
    rng, seed = fresh_rng()
    x, w = _rmsnorm_inputs(rng, 2, 72)
    out = poisoned(x.shape, np.uint16)
    with gpu_code_path(block_reduce):
        rmsnorm.rmsnorm(cuda.to_device(x), cuda.to_device(w), 1e-5, out)
        got = synced(out)
    expected = np.zeros_like(x)
    cpu.rmsnorm(x, w, 1e-5, expected)
    assert_close(from_bf16_bits(got), expected, BF16_RTOL, 1e-6, seed, "rmsnorm")


def test_row_threads_give_about_eight_elements_a_thread():
    assert [rmsnorm.row_threads(h) for h in (1, 576, 2048, 3072, 4096, 16384, 10**6)] == [
        32, 128, 256, 512, 512, 1024, 1024,
    ]  # fmt: skip


@pytest.mark.filterwarnings("ignore:overflow encountered in cast")  # simulator: f64 -> f32
@pytest.mark.parametrize("rows, inter", [(1, 52), (3, 50), (2, 300), (2, 1 << 10), (1, 7)])
def test_silu_mul(rows, inter):
    """bf16 gate_up. I % 4 == 0 takes the 8-byte-word kernel: 52 (13 words, one part-filled
    block), 300 (75 words: several blocks a row of the simulator's 32 threads x PER 2 words),
    1,024; 50 and 7 take the one-element kernel."""
    rng, seed = fresh_rng()
    gate_up = to_bf16_bits(rng.standard_normal((rows, 2 * inter)) * 4)
    gate_up[0, :3] = to_bf16_bits(np.array([-200.0, 0.0, 90.0]))  # exp overflow gives -0
    out = poisoned((rows, inter), np.uint16)
    activation.silu_mul(cuda.to_device(gate_up), out)
    expected = np.zeros((rows, inter), np.float32)
    cpu.silu_mul(from_bf16_bits(gate_up), expected)
    assert_close(from_bf16_bits(synced(out)), expected, BF16_RTOL, 1e-30, seed, "silu_mul")


@pytest.mark.parametrize(
    "tokens, num_heads, num_kv_heads, head_dim, scaling",
    [
        (5, 6, 2, 16, None),  # 4 heads a block in the simulator, the last block part empty
        (5, 4, 1, 64, "llama3"),
        (1, 9, 3, 64, None),  # SmolLM2's GQA 9/3, a single token
        (3, 2, 2, 128, None),  # MHA, a head wider than the simulator's 32-thread block
        (4, 5, 1, 6, None),  # hd/2 = 3: a block that is no multiple of anything
    ],
)
def test_rope_rotates_in_place_and_writes_the_paged_cache(
    tokens, num_heads, num_kv_heads, head_dim, scaling
):
    rng, seed = fresh_rng()
    rope_scaling = None
    if scaling:
        rope_scaling = SimpleNamespace(
            rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_position_embeddings=64,
        )  # fmt: skip
    cos, sin = rope_cos_sin(head_dim, 500000.0, 300, rope_scaling)
    num_blocks, block_size = 6, 4
    width = (num_heads + 2 * num_kv_heads) * head_dim
    qkv = (rng.standard_normal((tokens, width)) * 2).astype(np.float32)
    positions = rng.integers(0, 300, tokens).astype(np.int32)  # mid-sequence positions
    slots = rng.choice(num_blocks * block_size, tokens, replace=False).astype(np.int32)
    if tokens > 1:
        slots[tokens // 2] = -1  # a padding row: rotated, not written
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
