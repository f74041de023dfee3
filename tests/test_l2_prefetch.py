"""The L2 prefetch of the next product's weights (gpu/kernels/l2_prefetch.py): which row groups
each block asks for, and that a product which prefetches computes exactly what it computes
without. Runs in the CUDA simulator (where the instruction itself is a no-op) and on a GPU."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import bf16_values, fresh_rng, synced
from numba import cuda

from gpu.kernels import gemv, l2_prefetch
from gpu.kernels.bf16 import to_bf16_bits

block_share = l2_prefetch.block_share.py_func
selected_group = l2_prefetch.selected_group.py_func


@pytest.mark.parametrize(("count", "nblocks"), [(1, 1), (5, 7), (768, 512), (48, 5)])
def test_block_shares_deal_every_item_once(count, nblocks):
    shares = [block_share(count, b, nblocks) for b in range(nblocks)]
    dealt = [j for first, last in shares for j in range(first, last)]
    assert dealt == list(range(count))


@pytest.mark.parametrize(("groups", "selected"), [(2048, 768), (10, 3), (7, 7), (100, 1)])
def test_selected_groups_are_distinct_and_spread(groups, selected):
    chosen = [selected_group(j, groups, selected) for j in range(selected)]
    assert len(set(chosen)) == selected and 0 <= min(chosen) and max(chosen) < groups
    if l2_prefetch.SPREAD:  # no stretch of the grid more than one gap wider than the rest
        gaps = np.diff(chosen + [groups + chosen[0]])
        assert gaps.max() - gaps.min() <= 1


def test_plan_takes_whole_row_groups_of_each_half_within_the_budgets(monkeypatch):
    w = cuda.to_device(np.zeros((64, 512), np.uint16))  # 64 rows of 1 KB: halves of 32 KB
    monkeypatch.setattr(l2_prefetch, "ISSUER_MB", (0, 1))
    whole = l2_prefetch.plan(w, 4, halves=True)
    assert whole.base == l2_prefetch.device_address(w) != 0
    assert (whole.second, whole.group_bytes, whole.groups) == (32 << 10, 4 << 10, 8)
    assert whole.selected == whole.last == 8 and whole.first == 0  # under the budget: all
    assert l2_prefetch.plan(w, 4, True, l2_prefetch.QKV) == l2_prefetch.NO_PREFETCH
    monkeypatch.setattr(l2_prefetch, "_l2_bytes", lambda: 32 << 10)  # 3/4 of the L2: 24 KB
    capped = l2_prefetch.plan(w, 4, halves=True)
    assert capped.selected * capped.group_bytes * 2 == 24 << 10
    one_part = l2_prefetch.plan(w, 4, halves=False)
    assert (one_part.second, one_part.groups, one_part.selected) == (0, 16, 6)
    monkeypatch.setattr(l2_prefetch, "ISSUER_MB", (0, 0))
    assert l2_prefetch.plan(w, 4, halves=True) == l2_prefetch.NO_PREFETCH


def test_two_issuers_split_the_selected_groups_in_launch_order(monkeypatch):
    w = cuda.to_device(np.zeros((1 << 12, 512), np.uint16))  # 4 MB: halves of 2 MB
    monkeypatch.setattr(l2_prefetch, "ISSUER_MB", (1, 2))
    qkv = l2_prefetch.plan(w, 4, True, l2_prefetch.QKV)
    o_proj = l2_prefetch.plan(w, 4, True, l2_prefetch.O_PROJ)
    assert qkv.selected == o_proj.selected == 3 * (1 << 20) // (8 << 10)
    assert (qkv.first, qkv.last, o_proj.first, o_proj.last) == (0, 128, 128, 384)


def test_gemv_plans_the_groups_its_silu_blocks_read(monkeypatch):
    monkeypatch.setattr(l2_prefetch, "ISSUER_MB", (0, 24))
    w = cuda.to_device(np.zeros((2 * 40, 256), np.uint16))
    rows, _, blocks = gemv.plan(80, 64, 1, True, "silu")
    pf = gemv.prefetch_plan(w, "silu")
    assert pf.group_bytes == rows // 2 * 256 * 2 and pf.groups == 40 // (rows // 2) <= blocks
    with pytest.raises(ValueError):
        gemv.prefetch_plan(w, "rope")


def test_a_product_that_prefetches_computes_the_same(monkeypatch):
    monkeypatch.setattr(l2_prefetch, "ISSUER_MB", (0, 24))
    rng, _ = fresh_rng()
    t, k, n = 1, 128, 37
    x = cuda.to_device(to_bf16_bits(bf16_values(rng, (t, k))))
    w = cuda.to_device(to_bf16_bits(bf16_values(rng, (n, k), 0.1)))
    gate_up = cuda.to_device(to_bf16_bits(bf16_values(rng, (2 * 64, k), 0.1)))
    residual = rng.standard_normal((t, n)).astype(np.float32)
    plain, prefetching = cuda.to_device(residual), cuda.to_device(residual)
    gemv.gemv(x, w, plain, epilogue="add")
    prefetch = gemv.prefetch_plan(gate_up, "silu")
    assert prefetch.selected > 0
    gemv.gemv(x, w, prefetching, epilogue="add", prefetch=prefetch)
    np.testing.assert_array_equal(synced(prefetching), synced(plain))
