"""Paged decode attention vs the numpy twin (CpuBackend.attention) on awkward shapes: one
token, contexts that are not a multiple of the block size or of the tile, GQA ratios 3, 4 and 8,
head_dim 16 to 128, batches of mixed context lengths, split-KV with busy and empty splits (the
partials' contract checked: busy splits write (m, l), empty ones write nothing), padding rows
(seq_len 0), the split counters (left at zero, so a second launch on the same counters gives the
same bits), and the GPU code path (warp shuffles, emulated in the simulator). Unused cache slots
hold NaN; outputs and partials start as NaN. The prefill kernel's tests are in
test_kernels_prefill.py.

In the simulator a block is 32 threads, so a tile is 16 tokens at head_dim 64 (64 on the GPU):
the cases below reach several busy splits with contexts of tens of tokens."""

from __future__ import annotations

import itertools

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
from numba import cuda

from gpu.kernels import attention_decode, attention_decode_ffma
from gpu.kernels.attention_decode import (
    MAX_SPLITS,
    busy_splits,
    choose_num_splits,
    choose_warp_heads_ctx,
    counter_size,
    decode_attention,
    partial_sizes,
    tile_tokens,
)
from gpu.kernels.bf16 import from_bf16_bits


def _scaled(seq_lens, head_dim):
    """The cases are written for the simulator's tiles (32-thread blocks); a GPU block's tile
    holds 4x the tokens, so there the contexts are scaled by 4 to split the same way."""
    sim_tile = 32 // (head_dim // attention_decode.DIMS) * attention_decode.UNROLL
    return [n * (tile_tokens(head_dim) // sim_tile) for n in seq_lens]


def _run_decode(
    seq_lens, num_heads, num_kv_heads, head_dim, block_size, num_splits, launches: int = 1,
    min_split_tiles: int = 1, tensor_cores: bool = False, warp_heads_ctx: int = 0,
):  # fmt: skip
    """`launches` decode launches on one fresh paged case (seq_len 0: a padding row), all on
    the same counters. Checks each output against the numpy twin (zeros for padding rows), the
    counters back at zero after each, every launch's bits equal to the first's, and the split
    partials against the contract. Returns (m, l) of the partials, [seq, head, split] (NaN where
    nothing was written), and the busy splits of each sequence."""
    rng, seed = fresh_rng()
    seq_lens = _scaled(seq_lens, head_dim)
    pad = [i for i, n in enumerate(seq_lens) if n == 0]
    case = paged_case(
        rng, [max(n, 1) for n in seq_lens], [1] * len(seq_lens), num_heads, num_kv_heads,
        head_dim, block_size,
    )  # fmt: skip
    want = cpu_attention(case)  # padding rows: computed over one token, then zeroed
    want[pad] = 0.0
    case.batch.seq_lens[pad] = 0
    args = attention_device_args(case)
    n = len(seq_lens)
    acc_size, ml_size = partial_sizes(n, num_heads, head_dim, num_splits)
    part_acc = poisoned((max(acc_size, 1),), np.float32)
    part_ml = poisoned((max(ml_size, 1),), np.float32)
    counters = cuda.to_device(np.zeros(max(counter_size(n, num_kv_heads, num_splits), 1), np.int32))
    first = None
    for launch in range(launches):
        out = poisoned((n, num_heads * head_dim), np.uint16)
        decode_attention(
            *args, n, num_heads, head_dim**-0.5, out, part_acc, part_ml, num_splits,
            counters=counters, min_split_tiles=min_split_tiles, tensor_cores=tensor_cores,
            warp_heads_ctx=_scaled([warp_heads_ctx], head_dim)[0],
        )  # fmt: skip
        bits = synced(out)
        what = f"decode attention, launch {launch + 1}"
        assert_close(from_bf16_bits(bits), want, RTOL, ATOL, seed, what)
        assert (counters.copy_to_host() == 0).all(), f"counters not reset (KERNEL_TEST_SEED={seed})"
        if first is None:
            first = bits
        np.testing.assert_array_equal(bits, first, err_msg=f"{what} (KERNEL_TEST_SEED={seed})")

    busy = [busy_splits(ctx, num_splits, head_dim, min_split_tiles) for ctx in seq_lens]
    if num_splits == 1:
        return None, None, busy
    # A sequence of more than one busy split: each busy split wrote a finite m and l >= 1 (the
    # token at the maximum counts 2^0) for every head; nothing else was written, not even by a
    # sequence whose one busy split wrote its output directly.
    m, den = synced(part_ml)[:ml_size].reshape(n, num_heads, num_splits, 2).transpose(3, 0, 1, 2)
    acc = synced(part_acc)[:acc_size].reshape(n, num_heads, num_splits, head_dim)
    for b, k in enumerate(busy):
        written = k if k > 1 else 0
        msg = f"sequence {b}, {k} busy splits (KERNEL_TEST_SEED={seed})"
        assert np.isfinite(m[b, :, :written]).all() and (den[b, :, :written] >= 1).all(), msg
        assert np.isfinite(acc[b, :, :written]).all(), msg
        assert np.isnan(m[b, :, written:]).all() and np.isnan(den[b, :, written:]).all(), msg
        assert np.isnan(acc[b, :, written:]).all(), msg
    return m, den, busy


@pytest.mark.parametrize(
    "seq_lens, num_heads, num_kv_heads, head_dim, block_size, num_splits",
    [
        ([1, 17, 40], 6, 2, 64, 16, 1),  # GQA 3, one token, partial last blocks, one split
        ([1, 17, 40, 0], 6, 2, 64, 16, 3),  # the same split three ways (1, 2, 3 busy), padding
        ([150, 5, 0], 8, 2, 16, 8, 3),  # GQA 4, head_dim 16 (64-token tiles), block size 8
        ([70], 4, 1, 32, 16, 4),  # one sequence: 3 busy splits of 4, the last one short
        ([1, 16, 49, 32], 8, 2, 64, 16, 2),  # Llama-3.2-1B's head_dim and GQA 4, full blocks
        ([37], 8, 1, 128, 16, 2),  # head_dim 128, GQA 8
    ],
)
def test_decode_attention(seq_lens, num_heads, num_kv_heads, head_dim, block_size, num_splits):
    _, _, busy = _run_decode(seq_lens, num_heads, num_kv_heads, head_dim, block_size, num_splits)
    if num_splits > 1:  # the cases were chosen so: some sequence splits, none splits evenly
        assert max(busy) > 1


def test_decode_more_splits_than_tiles():
    """Eight splits of 20- and 3-token contexts: most splits are empty and write nothing; the
    3-token sequence has one busy split, which writes the output itself."""
    twenty = _scaled([20], 64)[0]
    assert tile_tokens(64) < twenty <= 2 * tile_tokens(64)  # the 20-token context: two tiles
    m, _, busy = _run_decode([20, 3], 8, 2, 64, 16, 8)
    assert busy == [2, 1]
    assert np.isfinite(m[0, :, :2]).all() and np.isnan(m[0, :, 2:]).all()
    assert np.isnan(m[1]).all()


@pytest.mark.parametrize("min_split_tiles, want", [(1, [3, 2, 2, 1]), (2, [2, 1, 1, 1])])
def test_decode_min_split_tiles(min_split_tiles, want):
    """A busy split of at least min_split_tiles tiles. Contexts of 3 tiles less 5 tokens, 2
    tiles, 1 tile + 1 token and a padding row, 4 splits: with 1, one tile a split; with 2, the
    first splits in two (a block walks two tiles, the other the rest) and the next two are one
    block's walk each, which writes its output itself: no partials, no merge."""
    tile = 32 // (64 // attention_decode.DIMS) * attention_decode.UNROLL  # _scaled's units
    seq_lens = [3 * tile - 5, 2 * tile, tile + 1, 0]
    _, _, busy = _run_decode(seq_lens, 8, 2, 64, 16, 4, min_split_tiles=min_split_tiles)
    assert busy == want


def test_decode_twice_on_the_same_counters():
    """The counters are back at zero after a launch: a second launch on them (as a graph replay
    would) merges again, with the same bits (the merge runs over the splits in a fixed order,
    whichever block finishes last). Mixed contexts, a padding row, GQA 4, head_dim 64."""
    _, _, busy = _run_decode([40, 0, 23], 8, 2, 64, 16, 3, launches=2)
    assert busy == [3, 1, 2]


@pytest.mark.parametrize(
    "seq_lens, num_heads, num_kv_heads, head_dim, block_size, num_splits",
    [
        ([5, 40, 0], 6, 2, 64, 16, 2),  # 8 lanes a token: three shuffles a score; padding
        ([33, 5], 8, 2, 16, 8, 1),  # 2 lanes a token
    ],
)
def test_decode_attention_gpu_code_path(
    seq_lens, num_heads, num_kv_heads, head_dim, block_size, num_splits
):
    """The warp-shuffle path that runs on the GPU, with the shuffles emulated in the simulator."""
    with gpu_code_path(attention_decode, attention_decode_ffma):
        _run_decode(seq_lens, num_heads, num_kv_heads, head_dim, block_size, num_splits)


def test_split_launch_needs_counters():
    rng, _ = fresh_rng()
    case = paged_case(rng, [9], [1], 4, 2, 16, 16)
    out = poisoned((1, 64), np.uint16)
    scratch = poisoned((64,), np.float32)
    with pytest.raises(ValueError, match="counters"):
        decode_attention(*attention_device_args(case), 1, 4, 0.25, out, scratch, scratch, 2)


def test_busy_splits():
    """The host twin of the kernel's split arithmetic: busy splits are whole tiles (the last
    one short) that cover the context, never more than num_splits, one for seq_len 0."""
    for head_dim in (16, 64, 128):
        tile = tile_tokens(head_dim)
        for splits, least in itertools.product((1, 2, 3, 8, MAX_SPLITS), (1, 2, 4)):
            assert busy_splits(0, splits, head_dim, least) == 1
            for ctx in (1, tile - 1, tile, tile + 1, 5 * tile + 3, 100 * tile):
                busy = busy_splits(ctx, splits, head_dim, least)
                chunk = -(-ctx // splits)
                chunk = max(-(-chunk // tile), least) * tile
                assert 1 <= busy <= splits
                assert (busy - 1) * chunk < ctx <= busy * chunk
                assert busy == 1 or ctx > least * tile
                assert busy == 1 or ctx > tile


def test_choose_num_splits():
    """Batch 1 of an 8-KV-head model fills the H200's 132 SMs; big batches do not split."""
    assert choose_num_splits(1, 8, 132) * 8 >= 132
    assert choose_num_splits(64, 8, 132) == 1
    for batch in range(1, 300):
        splits = choose_num_splits(batch, 8, 132)
        assert 1 <= splits <= MAX_SPLITS
        assert batch * 8 * splits >= min(132, batch * 8 * MAX_SPLITS)
        assert counter_size(batch, 8, splits) == (0 if splits == 1 else batch * 8)


@pytest.mark.parametrize(
    "seq_lens, num_heads, num_kv_heads, block_size, num_splits",
    [
        ([1, 16, 49, 32], 8, 2, 16, 2),  # Llama-3.2-1B's GQA 4, partial tiles, split-KV
        ([37, 0, 5], 6, 2, 16, 3),  # SmolLM2's GQA 3, a padding row, a one-token context
        ([20, 3], 16, 2, 8, 1),  # GQA 8, blocks of 8: a warp's tokens span two blocks
    ],
)
def test_decode_attention_tensor_cores(seq_lens, num_heads, num_kv_heads, block_size, num_splits):
    """The tensor-core walk (mma.py: the instruction's simulator twin here, the instruction on
    the GPU) against the numpy twin, head_dim 64, with the shuffles of the GPU path, at the
    FFMA walk's tolerance: q and P go in as two bf16 each (hi + lo)."""
    with gpu_code_path(attention_decode, attention_decode_ffma):
        _run_decode(
            seq_lens, num_heads, num_kv_heads, 64, block_size, num_splits, tensor_cores=True
        )


@pytest.mark.parametrize(
    "seq_lens, num_heads, num_kv_heads, block_size, warp_heads_ctx",
    [
        ([1, 16, 49, 32, 0], 8, 2, 16, 40),  # GQA 4; 49 is over the limit: 4 warps a head
        ([37, 5, 17], 15, 5, 16, 64),  # GQA 3, 5 KV heads: the last block's warps 1-3 idle
        ([20, 3, 33], 24, 3, 8, 64),  # GQA 8, 3 KV heads, a warp's tokens in two blocks
    ],
)
def test_decode_attention_warp_heads(seq_lens, num_heads, num_kv_heads, block_size, warp_heads_ctx):
    """A warp per (sequence, KV head): each warp walks its head's whole context 16 tokens at a
    time and writes the head's output from its registers, no merge; a sequence over the limit
    walks 4 warps a head in the same launch. (The simulator's block is one warp, so there each
    block is one head; on the GPU a block takes 4 and the others exit.)"""
    with gpu_code_path(attention_decode, attention_decode_ffma):
        _run_decode(
            seq_lens, num_heads, num_kv_heads, 64, block_size, 1, tensor_cores=True,
            warp_heads_ctx=warp_heads_ctx,
        )  # fmt: skip


def test_choose_warp_heads_ctx():
    """A warp per head only where one split leaves many waves of blocks (batch 256 of an
    8-KV-head model on 132 SMs, not batch 64), and only for the tensor-core walk."""
    limit = attention_decode.WARP_HEADS_MAX_CTX
    assert choose_warp_heads_ctx(256, 8, 132, 1, 64, 4) == limit
    assert choose_warp_heads_ctx(64, 8, 132, 1, 64, 4) == 0
    assert choose_warp_heads_ctx(256, 8, 132, 2, 64, 4) == 0  # split launches: never
    assert choose_warp_heads_ctx(256, 8, 132, 1, 128, 8) == 0  # head_dim 128: the FFMA walk
    for batch in range(1, 300):
        ctx = choose_warp_heads_ctx(batch, 8, 132, choose_num_splits(batch, 8, 132), 64, 4)
        blocks_per_sm = batch * 8 / 132
        assert ctx == (limit if blocks_per_sm >= attention_decode.WARP_HEADS_MIN_BLOCKS else 0)
