"""The device sampler vs the numpy sampler (gpu/sampling/numpy_sampler.py): greedy, temperature,
top-k, top-p, min-p, penalties and banned ids, per-row parameters, the same counter-based Gumbel
noise. Rows are sampled on random logits, so the ids must agree exactly (a disagreement would
need two candidates within float rounding of each other)."""

from __future__ import annotations

import numpy as np
from kernel_helpers import INT_POISON, fresh_rng, gpu_code_path, poisoned, synced
from numba import cuda

from gpu.backends.cuda.sampler import DeviceSampler
from gpu.kernels import block_reduce
from gpu.kernels.argmax import CHUNK, WIDE_CHUNK, WIDE_ROWS, argmax_rows, argmax_scratch_size
from gpu.kernels.sampling import PROMPT_BIT, penalty_counts
from gpu.sampling import SamplingMetadata
from gpu.sampling.numpy_sampler import sample as numpy_sample


def _metadata(rows: list[dict], rng) -> SamplingMetadata:
    n = len(rows)
    md = SamplingMetadata.greedy(n)
    md.temperature = np.array([r.get("temperature", 0.0) for r in rows], np.float32)
    md.top_k = np.array([r.get("top_k", 0) for r in rows], np.int32)
    md.top_p = np.array([r.get("top_p", 1.0) for r in rows], np.float32)
    md.min_p = np.array([r.get("min_p", 0.0) for r in rows], np.float32)
    md.repetition_penalty = np.array([r.get("repetition", 1.0) for r in rows], np.float32)
    md.presence_penalty = np.array([r.get("presence", 0.0) for r in rows], np.float32)
    md.frequency_penalty = np.array([r.get("frequency", 0.0) for r in rows], np.float32)
    md.seed = rng.integers(0, 2**63, n).astype(np.uint64)
    md.step = rng.integers(0, 1000, n).astype(np.uint64)
    return md


def _check(logits: np.ndarray, md: SamplingMetadata, seed: int) -> np.ndarray:
    sampler = DeviceSampler(logits.shape[0], logits.shape[1], cuda.stream())
    sampler.out = poisoned(sampler.out.shape, np.int32)
    sampler.ring[:] = INT_POISON  # the host's copy of the ids: written by the kernel itself
    got = sampler.sample(cuda.to_device(logits), md)
    expected = numpy_sample(logits, md)
    assert INT_POISON not in got
    assert got.tolist() == expected.tolist(), f"KERNEL_TEST_SEED={seed}"
    # The penalty scratch is left clean for the next step.
    assert not synced(sampler.counts).any()
    return got


def test_one_pass_rows_greedy_temperature_penalties_and_bans():
    rng, seed = fresh_rng()
    vocab = 300
    logits = (rng.standard_normal((5, vocab)) * 3).astype(np.float32)
    rows = [
        {},  # greedy
        {"temperature": 0.7},
        {"temperature": 1.3, "repetition": 1.5, "presence": 0.5, "frequency": 0.25},
        {"repetition": 2.0, "frequency": 1.0},  # greedy after penalties
        {"temperature": 1.0},
    ]
    md = _metadata(rows, rng)
    # Histories with repeats; the greedy row's favourite is penalised out of first place.
    md.prompt_token_ids = [rng.integers(0, vocab, rng.integers(0, 20)).astype(np.int32)] * 5
    md.output_token_ids = [rng.integers(0, vocab, rng.integers(0, 30)).astype(np.int32)] * 5
    md.output_token_ids[3] = np.array([np.argmax(logits[3])] * 4, np.int32)
    md.banned_token_ids = [(int(np.argmax(logits[0])), 5), (), (7,), (), (vocab + 3,)]
    _check(logits, md, seed)


def test_all_greedy_fast_path():
    rng, seed = fresh_rng()
    logits = rng.standard_normal((3, 200)).astype(np.float32)
    logits[1, 17] = logits[1, 99] = 50.0  # a tie: the first index wins, as np.argmax
    _check(logits, SamplingMetadata.greedy(3), seed)


def test_two_results_in_flight_land_in_their_own_ring_slots():
    """Async scheduling launches step N+1 before it reads step N's ids: each launch stages its
    own slot of the host ring, so N+1's stores (the general kernel or the greedy argmax) leave
    N's ids alone, and the device copy the next step feeds back holds the latest."""
    rng, seed = fresh_rng()
    vocab = 250
    sampler = DeviceSampler(4, vocab, cuda.stream())
    sampler.ring[:] = INT_POISON
    expected, results = [], []
    for step in range(3):
        logits = rng.standard_normal((3, vocab)).astype(np.float32)
        md = SamplingMetadata.greedy(3)
        sampler.stage(md)
        sampler.staging.upload()
        if step == 1:
            sampler.launch(cuda.to_device(logits))
        else:
            sampler.launch_greedy(cuda.to_device(logits))
        expected.append(np.argmax(logits, axis=1).tolist())
        results.append(sampler.fetch_async(3))
        if step == 1:  # two unread results: read the older before the third launch
            assert results[0].result().tolist() == expected[0], f"KERNEL_TEST_SEED={seed}"
    assert results[1].result().tolist() == expected[1], f"KERNEL_TEST_SEED={seed}"
    assert results[2].result().tolist() == expected[2], f"KERNEL_TEST_SEED={seed}"
    assert synced(sampler.out)[:3].tolist() == expected[2]
    assert sampler.ring[:, 3].tolist() == [INT_POISON] * 2  # rows past the step: untouched


def test_truncating_rows_top_k_top_p_min_p():
    rng, seed = fresh_rng()
    vocab = 160
    logits = (rng.standard_normal((4, vocab)) * 2).astype(np.float32)
    logits[0, :10] = 4.0  # ties at the top-k edge all stay
    rows = [
        {"temperature": 0.8, "top_k": 12},
        {"temperature": 1.0, "top_p": 0.6},
        {"temperature": 1.5, "min_p": 0.2},
        {"temperature": 0.9, "top_k": 40, "top_p": 0.8, "min_p": 0.05},
    ]
    md = _metadata(rows, rng)
    md.banned_token_ids = [(3,), (), (), (int(np.argmax(logits[3])),)]
    _check(logits, md, seed)


def test_many_draws_follow_the_distribution():
    """A row sampled at many steps draws the numpy sampler's tokens at every step."""
    rng, seed = fresh_rng()
    logits = np.tile((rng.standard_normal(64) * 1.5).astype(np.float32), (8, 1))
    md = _metadata([{"temperature": 1.0}] * 8, rng)
    md.step = np.arange(8, dtype=np.uint64)
    md.seed[:] = md.seed[0]
    got = _check(logits, md, seed)
    assert len(set(got.tolist())) > 1


def test_penalty_counts_kernel():
    rng, _ = fresh_rng()
    history = np.array([3, 3, 9, 3, 5, 5, 2], np.int32)  # row 0: prompt [3, 3, 9]; output 3 5 5
    iparams = np.zeros((4, 3), np.int32)
    iparams[2] = [0, 6, 7]  # history offsets
    iparams[3, :2] = [3, 0]  # prompt lengths
    counts = cuda.to_device(np.zeros((2, 12), np.int32))
    penalty_counts(cuda.to_device(history), cuda.to_device(iparams), counts, 2)
    got = synced(counts)
    assert got[0, 3] == PROMPT_BIT | 1 and got[0, 9] == PROMPT_BIT and got[0, 5] == 2
    assert got[1, 2] == 1 and got[1].sum() == 1 and int(got[0].sum()) == 2 * int(PROMPT_BIT) + 3


def _argmax_logits(rng) -> np.ndarray:
    """Rows with ties (across chunks, across threads of a chunk, in the last partial chunk),
    a row of -inf and a maximum at the very end; vocab not a multiple of CHUNK."""
    vocab = 2 * CHUNK + CHUNK // 2 + 5
    logits = (rng.standard_normal((6, vocab)) * 3).astype(np.float32)
    logits[0, [7, 2 * CHUNK + 1]] = 40.0  # tie across chunks: 7
    logits[1, [CHUNK + 3, CHUNK + 4, CHUNK + 40]] = 40.0  # ties inside one chunk: CHUNK + 3
    logits[2] = -np.inf  # np.argmax gives 0
    logits[3, vocab - 1] = 40.0  # in the last, partial chunk
    logits[4, [vocab - 2, vocab - 1]] = 40.0
    logits[5] = 1.0  # all equal: 0
    return logits


def _check_argmax(logits: np.ndarray, seed: int) -> None:
    rows, vocab = logits.shape
    size = argmax_scratch_size(rows, vocab)
    scratch_val, scratch_idx = poisoned((size,), np.float32), poisoned((size,), np.int32)
    out = poisoned((rows + 1,), np.int32)  # one row more than asked: left alone
    argmax_rows(cuda.to_device(logits), out, scratch_val, scratch_idx)
    got = synced(out)
    assert got[:rows].tolist() == np.argmax(logits, axis=1).tolist(), f"KERNEL_TEST_SEED={seed}"
    assert got[rows] == INT_POISON


def test_argmax_rows():
    rng, seed = fresh_rng()
    _check_argmax(_argmax_logits(rng), seed)


def test_argmax_rows_wide_chunks():
    """WIDE_ROWS rows or more: 16 logits a thread, the same ties and edges."""
    rng, seed = fresh_rng()
    vocab = 2 * WIDE_CHUNK + WIDE_CHUNK // 3 + 7
    logits = (rng.standard_normal((WIDE_ROWS + 1, vocab)) * 3).astype(np.float32)
    logits[0, [5, 2 * WIDE_CHUNK + 1]] = 40.0  # tie across chunks: 5
    logits[1, [WIDE_CHUNK + 9, WIDE_CHUNK + 9 + 256, WIDE_CHUNK + 300]] = 40.0  # one thread's
    logits[2] = -np.inf
    logits[3, vocab - 1] = 40.0
    logits[4] = 1.0
    _check_argmax(logits, seed)


def test_argmax_rows_gpu_code_path():
    """block_reduce's warp-shuffle reduction that runs on the GPU, shuffles emulated in the
    simulator."""
    rng, seed = fresh_rng()
    with gpu_code_path(block_reduce):
        _check_argmax(_argmax_logits(rng)[[0, 1]], seed)
