"""Prefill attention (gpu/kernels/attention_prefill.py) vs the numpy twin (CpuBackend.attention)
on awkward shapes: chunks starting mid-sequence, lengths that are multiples of neither the tiles
nor the block size, decode rows and empty sequences mixed with long ones, GQA ratios 3 and 4,
head_dim 64, several query tiles and KV tiles per sequence. Unused cache slots hold NaN, outputs
start as NaN (the rows of a 0-row sequence do not exist, so every output row must be written).

In the simulator the launcher uses its small tiles (one warp); one case runs the H200's own
tile configuration (128 threads: slow there, so one small shape)."""

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
    paged_case,
    poisoned,
    synced,
)

from gpu.kernels.attention_prefill import Tiles, choose_tiles, prefill_attention, split_sizes
from gpu.kernels.attention_prefill_tiles import SHARED_BYTES
from gpu.kernels.bf16 import from_bf16_bits


def _check(
    seq_lens, query_lens, num_heads, num_kv_heads, head_dim, block_size, tiles=None, narrow=0,
    splits=1,
):  # fmt: skip
    """narrow: the narrow_tokens threshold; 0 (the narrow kernel's own BQ) keeps every longer
    chunk on the wide tiles, so both kernels run."""
    rng, seed = fresh_rng()
    case = paged_case(rng, seq_lens, query_lens, num_heads, num_kv_heads, head_dim, block_size)
    out = poisoned((case.batch.num_tokens, num_heads * head_dim), np.uint16)
    o_size, ml_size = split_sizes(case.batch.num_tokens, num_heads, head_dim, splits)
    part_o, part_ml = (
        poisoned((max(o_size, 1),), np.float32),
        poisoned((max(ml_size, 1),), np.float32),
    )
    prefill_attention(
        *attention_device_args(case), len(seq_lens), max(query_lens), num_heads,
        head_dim**-0.5, out, tiles=tiles, narrow_tokens=narrow,
        part_o=part_o, part_ml=part_ml, splits=splits,
    )  # fmt: skip
    got = from_bf16_bits(synced(out))
    assert_close(got, cpu_attention(case), RTOL, ATOL, seed, "prefill attention")


@pytest.mark.parametrize(
    "seq_lens, query_lens, num_heads, num_kv_heads, head_dim, block_size",
    [
        # GQA 3, head_dim 64; a decode row, chunks starting at 13 and 18 (mid-block)
        ([1, 20, 30], [1, 7, 12], 6, 2, 64, 16),
        # GQA 4, whole prompts, last blocks partly full
        ([11, 24], [11, 24], 8, 2, 16, 16),
        # a decode row inside a mixed batch, block size 8
        ([37, 9], [5, 1], 4, 1, 32, 8),
        # 0-row sequences (one with context, one empty) between long ones; decode rows
        ([13, 40, 0, 21, 7], [13, 0, 0, 6, 1], 8, 2, 16, 16),
        # GQA 4, head_dim 64: five query tiles over a chunk that starts at 26, several KV tiles
        ([45], [19], 4, 1, 64, 16),
        # short chunks (2 and 3 rows) take the narrow kernel next to a long one
        ([30, 17, 5], [2, 17, 3], 6, 2, 32, 8),
    ],
)
def test_prefill_attention(seq_lens, query_lens, num_heads, num_kv_heads, head_dim, block_size):
    _check(seq_lens, query_lens, num_heads, num_kv_heads, head_dim, block_size)


@pytest.mark.parametrize("narrow", [9, 19, None])
def test_prefill_attention_narrow_threshold(narrow):
    """Chunks of up to `narrow` rows take the narrow tiles (None: the default, NARROW_TOKENS):
    a chat's new turn over its history (9 rows from position 31, 19 rows from 26) goes narrow
    at 19 while the 24-row prompt stays wide; at 9 only the first; by default all three."""
    _check([40, 45, 24, 12], [9, 19, 24, 1], 3, 1, 64, 16, narrow=narrow)


def test_prefill_attention_gather():
    """The K/V gather with KV tiles of 4 keys where a pass of the block covers 8 (head_dim 16:
    some threads gather no row), chunks starting mid-block, several tiles past the diagonal."""
    wide, narrow = Tiles(16, 4, 2, 1), Tiles(8, 4, 1, 1)
    _check([29, 13, 6], [11, 13, 2], 4, 2, 16, 8, tiles=(wide, narrow))


@pytest.mark.parametrize("splits", [2, 3])
def test_prefill_attention_split_kv(splits):
    """Short chunks over long histories, their keys split `splits` ways and merged: a chat turn
    of 9 rows from position 61; a 2-row chunk whose query tile straddles a split boundary (in
    the simulator's tiles: its first row sees no key of the last split, all masked there); a
    2-row chunk whose keys fit one split (written directly); a long prompt on the wide tiles
    (never split). GQA 3, head_dim 64."""
    straddle = 8 * (splits - 1) + 1  # kv_end one past a split boundary (simulator: bk 8, bq 2)
    _check(
        [70, straddle, 6, 30], [9, 2, 2, 30], 3, 1, 64, 16, narrow=9, splits=splits
    )  # fmt: skip


def test_prefill_attention_only_short_rows():
    """max_query_len within the narrow kernel's reach: only that kernel runs."""
    _check([9, 26, 3], [1, 2, 1], 8, 2, 16, 16)


def test_prefill_attention_gpu_tiles():
    """The H200's configurations (wide: 64 rows x 32 keys, 4x4 per thread; narrow: 16 x 64),
    GQA 4 and head_dim 64 as in Llama-3.2-1B: a 17-token chunk from position 16 needs two wide
    query tiles, the second with one row; the decode row goes narrow."""
    wide, narrow = choose_tiles(64, 4, simulator=False)
    assert (wide, narrow) == (Tiles(64, 32, 4, 4), Tiles(16, 64, 2, 4))
    _check([33, 40], [17, 1], 4, 1, 64, 16, tiles=(wide, narrow))


@pytest.mark.parametrize(
    "head_dim, group", [(64, 1), (64, 3), (64, 4), (64, 8), (128, 3), (128, 4), (128, 8), (32, 4)]
)
def test_gpu_tiles_fit(head_dim, group):
    """Every common shape gets tiles that fit 48 KB of static shared memory, whole warps (the
    row reductions shuffle across full warps) and at least one query token per block."""
    for tiles in choose_tiles(head_dim, group, simulator=False):
        assert tiles.fits(head_dim, group, simulator=False)
        assert tiles.threads % 32 == 0 and tiles.query_tokens(group) >= 1
        assert tiles.shared_bytes(head_dim, simulator=False) <= SHARED_BYTES


@pytest.mark.parametrize("head_dim", [16, 32, 64, 128])
@pytest.mark.parametrize("group", [1, 2, 3, 4, 8])
def test_every_llama_shape_has_gpu_tiles(head_dim, group):
    """The GPU tile table covers the tests' tiny models as well as the real ones (the first
    device run found head_dim 16 uncovered: the simulator's table had hidden it)."""
    wide, narrow = choose_tiles(head_dim, group, simulator=False)
    assert wide.fits(head_dim, group, simulator=False)
    assert narrow.fits(head_dim, group, simulator=False)


def test_mixed_step_splits_its_rows_between_the_two_kernels():
    """The cuda backend's mixed step: decode_attention (split-KV) takes the sequences with one
    query row, prefill_attention(decode_rows=False) the others; each leaves the other's rows
    untouched (still poisoned), and together they write every row the numpy twin does."""
    from numba import cuda

    from gpu.kernels.attention_decode import counter_size, decode_attention, partial_sizes

    rng, seed = fresh_rng()
    seq_lens, query_lens = [70, 19, 0, 33, 5], [1, 7, 0, 1, 5]
    nh, nkv, hd, splits = 3, 1, 64, 3
    case = paged_case(rng, seq_lens, query_lens, nh, nkv, hd, 16)
    args = attention_device_args(case)
    n = len(seq_lens)
    acc, ml = partial_sizes(n, nh, hd, splits)
    counters = cuda.to_device(np.zeros(counter_size(n, nkv, splits), np.int32))
    out = poisoned((case.batch.num_tokens, nh * hd), np.uint16)
    decode_rows = [int(case.batch.query_start_loc[b]) for b in (0, 3)]
    prompt_rows = [r for r in range(case.batch.num_tokens) if r not in decode_rows]

    decode_attention(
        *args, n, nh, hd**-0.5, out, poisoned((acc,), np.float32), poisoned((ml,), np.float32),
        splits, counters=counters,
    )  # fmt: skip
    got = from_bf16_bits(synced(out))
    assert np.isnan(got[prompt_rows]).all()
    assert not np.isnan(got[decode_rows]).any()
    prefill_attention(
        *args, n, max(query_lens), nh, hd**-0.5, out, decode_rows=False
    )  # fmt: skip
    got = from_bf16_bits(synced(out))
    assert_close(got, cpu_attention(case), RTOL, ATOL, seed, "mixed step attention")
    assert not synced(counters).any()  # left zero for the next launch
