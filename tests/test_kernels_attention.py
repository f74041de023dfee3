"""Paged attention kernels vs the numpy twin (CpuBackend.attention) on awkward shapes: one
token, contexts that are not a multiple of the block size (last block partly full), GQA ratios
3 and 4, head_dim 64, several sequences of different lengths, prefill chunks starting
mid-sequence, split-KV decode (including empty splits). Unused cache slots hold NaN, outputs
start as NaN.
The prefill kernel's tests are in test_kernels_prefill.py."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import assert_close, cpu_attention, fresh_rng, paged_case, poisoned, synced
from numba import cuda

from gpu.kernels.attention_decode import decode_attention, partial_sizes
from gpu.kernels.bf16 import from_bf16_bits

RTOL, ATOL = 2.0**-7, 2e-3  # bf16 output rounding, fp32 sums in another order


def _device_args(case):
    b = case.batch
    return (
        cuda.to_device(case.qkv),
        cuda.to_device(case.k_bits),
        cuda.to_device(case.v_bits),
        cuda.to_device(case.block_tables_flat),
        cuda.to_device(np.array([b.block_tables.shape[1]], np.int32)),
        cuda.to_device(b.query_start_loc),
        cuda.to_device(b.seq_lens),
    )


@pytest.mark.parametrize(
    "seq_lens, num_heads, num_kv_heads, head_dim, block_size, num_splits",
    [
        ([1, 17, 40], 6, 2, 64, 16, 1),  # GQA 3, one token, partial last blocks
        ([1, 17, 40], 6, 2, 64, 16, 3),  # the same, split three ways (split 2 of seq 1 empty)
        ([33, 5], 8, 2, 16, 8, 2),  # GQA 4, block size 8
        ([70], 4, 1, 32, 16, 4),  # one long sequence over four splits
    ],
)
def test_decode_attention(seq_lens, num_heads, num_kv_heads, head_dim, block_size, num_splits):
    rng, seed = fresh_rng()
    case = paged_case(
        rng, seq_lens, [1] * len(seq_lens), num_heads, num_kv_heads, head_dim, block_size
    )
    n = len(seq_lens)
    out = poisoned((n, num_heads * head_dim), np.uint16)
    acc_size, ml_size = partial_sizes(n, num_heads, head_dim, num_splits)
    part_acc = poisoned((max(acc_size, 1),), np.float32)
    part_ml = poisoned((max(ml_size, 1),), np.float32)
    decode_attention(
        *_device_args(case), n, num_heads, head_dim**-0.5, out, part_acc, part_ml, num_splits
    )
    assert_close(
        from_bf16_bits(synced(out)), cpu_attention(case), RTOL, ATOL, seed, "decode attention"
    )


def test_decode_padding_sequence_writes_zeros():
    """seq_len 0 (a padding row of a captured graph) must write zeros, not NaN."""
    rng, _ = fresh_rng()
    case = paged_case(rng, [9, 1], [1, 1], 4, 2, 16, 16)
    case.batch.seq_lens[1] = 0
    for splits in (1, 2):
        out = poisoned((2, 64), np.uint16)
        a, m = partial_sizes(2, 4, 16, splits)
        part_acc, part_ml = poisoned((max(a, 1),), np.float32), poisoned((max(m, 1),), np.float32)
        decode_attention(*_device_args(case), 2, 4, 0.25, out, part_acc, part_ml, splits)
        got = from_bf16_bits(synced(out))
        assert (got[1] == 0).all() and np.isfinite(got[0]).all()
