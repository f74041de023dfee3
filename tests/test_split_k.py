"""Split-K's choice of slices (gpu/backends/cuda/split_k.py) on Llama-3.2-1B's and SmolLM2's
matrices, and the strided-batched product's contract, in the simulator's numpy twin."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import fresh_rng, synced
from numba import cuda

from gpu.backends.cuda import split_k
from gpu.backends.cuda.cublas import SimulatorGemm
from gpu.kernels.bf16 import from_bf16_bits, to_bf16_bits

H200_SMS = 132
# Llama-3.2-1B: [N, K]
QKV, O_PROJ, GATE_UP = (3072, 2048), (2048, 2048), (16384, 2048)
DOWN, LM_HEAD = (2048, 8192), (128256, 2048)


def choose(tokens, shape, mode="auto"):
    return split_k.choose_split_k(tokens, *shape, H200_SMS, mode)


def test_few_tile_products_split_until_the_sms_are_busy():
    # 16 tiles of 128 x 128 at 8-128 tokens: 132 // 16 = 8 slices; qkv's 24 tiles want 5,
    # which 2048 does not divide into 8-element slices: 4.
    for tokens in (2, 8, 64, 128):
        assert choose(tokens, O_PROJ) == 8
        assert choose(tokens, DOWN) == 8
        assert choose(tokens, QKV) == 4
    # More token tiles, fewer slices; many output tiles, none.
    assert choose(256, O_PROJ) == 4
    assert choose(512, O_PROJ) == 2
    for tokens in (8, 64, 256):
        assert choose(tokens, GATE_UP) == 1
        assert choose(tokens, LM_HEAD) == 1


def test_no_split_for_one_token_prefill_chunks_or_off():
    assert choose(1, O_PROJ) == 1  # gemv.py serves it
    assert choose(split_k.MAX_TOKENS + 1, O_PROJ) == 1
    assert choose(64, O_PROJ, "off") == 1


def test_slices_are_aligned_and_wide_enough():
    # SmolLM2-135M: hidden 576, intermediate 1536; slices of >= 128 elements, multiples of 8.
    for n, k in ((960, 576), (576, 576), (576, 1536)):
        for tokens in (2, 64, 256):
            s = split_k.choose_split_k(tokens, n, k, H200_SMS)
            assert k % (8 * s) == 0 and (s == 1 or k // s >= split_k.MIN_SLICE)
    assert split_k.choose_split_k(64, 960, 576, H200_SMS) == 4  # 8 tiles want 8; 576/8 = 72


def test_a_number_forces_that_many_slices_where_k_allows():
    assert choose(64, GATE_UP, "4") == 4
    assert choose(64, O_PROJ, "3") == 2  # 2048 is no multiple of 24
    assert split_k.choose_split_k(5, 48, 48, 4, "3") == 3  # tiny slices are allowed when asked


def test_partials_size_covers_every_step(monkeypatch):
    shapes = [QKV, O_PROJ, DOWN]
    size = split_k.partials_size(256, shapes, H200_SMS, "auto")
    needed = max(choose(t, s) * t * s[0] for t in range(2, 257) for s in shapes)
    assert size == needed
    assert split_k.partials_size(1, shapes, H200_SMS, "auto") == 0


def test_setting_rejects_nonsense(monkeypatch):
    monkeypatch.setenv(split_k.ENV, "lots")
    with pytest.raises(ValueError, match=split_k.ENV):
        split_k.setting()
    monkeypatch.setenv(split_k.ENV, " Off ")
    assert split_k.setting() == "off"


@pytest.mark.parametrize("tokens, n, k, splits", [(3, 40, 48, 3), (1, 8, 64, 2), (5, 24, 16, 2)])
def test_split_products_sum_to_the_product(tokens, n, k, splits):
    rng, seed = fresh_rng()
    x = to_bf16_bits(rng.standard_normal((tokens, k)).astype(np.float32))
    w = to_bf16_bits(rng.standard_normal((n, k)).astype(np.float32))
    gemm = SimulatorGemm(0)
    partials = cuda.device_array((splits, tokens, n), np.float32)
    gemm.linear_split_k(cuda.to_device(x), cuda.to_device(w), partials)
    got = synced(partials)
    want = from_bf16_bits(x) @ from_bf16_bits(w).T
    np.testing.assert_allclose(got.sum(axis=0), want, rtol=1e-5, atol=1e-5, err_msg=str(seed))
    ks = k // splits
    first = from_bf16_bits(x)[:, :ks] @ from_bf16_bits(w)[:, :ks].T
    np.testing.assert_allclose(got[0], first, rtol=1e-5, atol=1e-5, err_msg=str(seed))


def test_split_products_check_their_operands():
    gemm = SimulatorGemm(0)
    x = cuda.to_device(np.zeros((2, 20), np.uint16))
    w = cuda.to_device(np.zeros((4, 20), np.uint16))
    with pytest.raises(ValueError, match="slices"):
        gemm.linear_split_k(x, w, cuda.device_array((2, 2, 4), np.float32))  # 20 % 16
    with pytest.raises(ValueError, match="partials"):
        gemm.linear_split_k(x, w, cuda.device_array((2, 3, 4), np.float32))
