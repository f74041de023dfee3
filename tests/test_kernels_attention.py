"""Paged attention kernels vs the numpy twin (CpuBackend.attention) on awkward shapes: one
token, contexts that are not a multiple of the block size (last block partly full), GQA ratios
3 and 4, head_dim 64, several sequences of different lengths, prefill chunks starting
mid-sequence, split-KV decode (including empty splits and more splits than tiles, with the
partials' contract checked), padding rows (seq_len 0), and the decode kernel's GPU code path
(warp shuffles, emulated in the simulator). Unused cache slots hold NaN, outputs start as NaN.
The prefill kernel's tests are in test_kernels_prefill.py."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import (
    ATOL,
    RTOL,
    assert_close,
    attention_device_args,
    cpu_attention,
    fresh_rng,
    gpu_code_path,
    paged_case,
    poisoned,
    synced,
)

from gpu.kernels import attention_decode
from gpu.kernels.attention_decode import (
    MAX_SPLITS,
    choose_num_splits,
    decode_attention,
    partial_sizes,
)
from gpu.kernels.bf16 import from_bf16_bits


def _run_decode(seq_lens, num_heads, num_kv_heads, head_dim, block_size, num_splits):
    """One decode launch on a fresh paged case; checks the output against the numpy twin and
    the split partials against the contract; returns the (m, l) pairs (None for one split)."""
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
        *attention_device_args(case), n, num_heads, head_dim**-0.5, out, part_acc, part_ml,
        num_splits,
    )  # fmt: skip
    assert_close(
        from_bf16_bits(synced(out)), cpu_attention(case), RTOL, ATOL, seed, "decode attention"
    )
    if num_splits == 1:
        return None
    # Every split wrote its (m, l): an empty one -inf and 0, a busy one a finite m and l >= 1
    # (the token at the maximum counts 2^0); the reduce skips the empty ones.
    m, den = synced(part_ml)[:ml_size].reshape(-1, 2).T
    empty = m == -np.inf
    assert not np.isnan(m).any() and not np.isnan(den).any(), f"KERNEL_TEST_SEED={seed}"
    assert (den[empty] == 0).all() and np.isfinite(m[~empty]).all() and (den[~empty] >= 1).all()
    return m.reshape(n, num_heads, num_splits), den.reshape(n, num_heads, num_splits)


@pytest.mark.parametrize(
    "seq_lens, num_heads, num_kv_heads, head_dim, block_size, num_splits",
    [
        ([1, 17, 40], 6, 2, 64, 16, 1),  # GQA 3, one token, partial last blocks
        ([1, 17, 40], 6, 2, 64, 16, 3),  # the same, split three ways
        ([33, 5], 8, 2, 16, 8, 2),  # GQA 4, block size 8, head_dim 16
        ([70], 4, 1, 32, 16, 4),  # one long sequence over four splits
        ([1, 16, 49, 32], 8, 2, 64, 16, 2),  # Llama-3.2-1B's head_dim and GQA 4, full blocks
        ([37], 8, 1, 128, 16, 2),  # head_dim 128, GQA 8
    ],
)
def test_decode_attention(seq_lens, num_heads, num_kv_heads, head_dim, block_size, num_splits):
    _run_decode(seq_lens, num_heads, num_kv_heads, head_dim, block_size, num_splits)


def test_decode_more_splits_than_tiles():
    """Eight splits of 20- and 3-token contexts: most splits are empty and say so."""
    m, _ = _run_decode([20, 3], 8, 2, 64, 16, 8)
    assert (m[:, :, 0] > -np.inf).all()  # the first split always holds the first token
    assert (m[:, :, -1] == -np.inf).all()  # a 20-token context never reaches the eighth


@pytest.mark.parametrize(
    "seq_lens, num_heads, num_kv_heads, head_dim, block_size, num_splits",
    [
        ([5, 40], 6, 2, 64, 16, 2),  # 8 lanes a token: three shuffles a score
        ([33, 5], 8, 2, 16, 8, 1),  # 2 lanes a token
    ],
)
def test_decode_attention_gpu_code_path(
    seq_lens, num_heads, num_kv_heads, head_dim, block_size, num_splits
):
    """The warp-shuffle path that runs on the GPU, with the shuffles emulated in the simulator."""
    with gpu_code_path(attention_decode):
        _run_decode(seq_lens, num_heads, num_kv_heads, head_dim, block_size, num_splits)


def test_choose_num_splits():
    """Batch 1 of an 8-KV-head model fills the H200's 132 SMs; big batches do not split."""
    assert choose_num_splits(1, 8, 132) * 8 >= 132
    assert choose_num_splits(64, 8, 132) == 1
    for batch in range(1, 300):
        splits = choose_num_splits(batch, 8, 132)
        assert 1 <= splits <= MAX_SPLITS
        assert batch * 8 * splits >= min(132, batch * 8 * MAX_SPLITS)


def test_decode_padding_sequence_writes_zeros():
    """seq_len 0 (a padding row of a captured graph) must write zeros, not NaN, whatever the
    split count (5: more splits than the 9-token context has tiles)."""
    rng, _ = fresh_rng()
    case = paged_case(rng, [9, 1], [1, 1], 4, 2, 16, 16)
    case.batch.seq_lens[1] = 0
    for splits in (1, 2, 5):
        out = poisoned((2, 64), np.uint16)
        a, m = partial_sizes(2, 4, 16, splits)
        part_acc, part_ml = poisoned((max(a, 1),), np.float32), poisoned((max(m, 1),), np.float32)
        decode_attention(*attention_device_args(case), 2, 4, 0.25, out, part_acc, part_ml, splits)
        got = from_bf16_bits(synced(out))
        assert (got[1] == 0).all() and np.isfinite(got[0]).all()
