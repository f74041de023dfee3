"""The L2 prefetch of the next product's weights (gpu/kernels/l2_prefetch.py): what each block
asks for, and that a product which prefetches computes exactly what it computes without.
Runs in the CUDA simulator (where the instruction itself is a no-op) and on a GPU."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import bf16_values, fresh_rng, synced
from numba import cuda

from gpu.kernels import gemv, l2_prefetch
from gpu.kernels.bf16 import to_bf16_bits

block_share = l2_prefetch.block_share.py_func


@pytest.mark.parametrize(("length", "nblocks"), [(16, 1), (4096, 7), (1 << 20, 512), (48, 5)])
def test_block_shares_tile_the_range_in_aligned_chunks(length, nblocks):
    shares = [block_share(length, b, nblocks) for b in range(nblocks)]
    covered = 0
    for start, end in shares:
        assert start == covered or start == end == length
        assert start % 16 == 0 and start <= end <= length
        covered = max(covered, end)
    assert covered == length


@pytest.mark.parametrize("halves", [False, True])
def test_plan_takes_the_start_of_the_matrix_or_of_each_half(monkeypatch, halves):
    w = cuda.to_device(np.zeros((64, 512), np.uint16))  # 64 KB
    monkeypatch.setattr(l2_prefetch, "BUDGET_MB", 1)
    whole = l2_prefetch.plan(w, halves)
    assert whole.base == l2_prefetch.device_address(w) != 0
    assert whole.length == (w.nbytes // 2 if halves else w.nbytes)  # under the budget: all
    assert whole.second == (w.nbytes // 2 if halves else 0)
    monkeypatch.setattr(l2_prefetch, "_l2_bytes", lambda: 32 << 10)  # half the L2: 16 KB
    capped = l2_prefetch.plan(w, halves)
    assert capped.length * (2 if halves else 1) == 16 << 10
    monkeypatch.setattr(l2_prefetch, "BUDGET_MB", 0)
    assert l2_prefetch.plan(w, halves) == l2_prefetch.NO_PREFETCH


def test_a_product_that_prefetches_computes_the_same():
    rng, _ = fresh_rng()
    t, k, n = 1, 128, 37
    x = cuda.to_device(to_bf16_bits(bf16_values(rng, (t, k))))
    w = cuda.to_device(to_bf16_bits(bf16_values(rng, (n, k), 0.1)))
    gate_up = cuda.to_device(to_bf16_bits(bf16_values(rng, (2 * n, k), 0.1)))
    residual = rng.standard_normal((t, n)).astype(np.float32)
    plain, prefetching = cuda.to_device(residual), cuda.to_device(residual)
    gemv.gemv(x, w, plain, epilogue="add")
    gemv.gemv(x, w, prefetching, epilogue="add", prefetch=l2_prefetch.plan(gate_up, True))
    np.testing.assert_array_equal(synced(prefetching), synced(plain))
