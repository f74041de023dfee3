"""The device sampler (gpu/kernels/sampling.py) vs the numpy twin (gpu/sampling/numpy_sampler.py):
bans and penalties from the token-state table, greedy, temperature, min-p, top-k, top-p, the
same counter-based Gumbel noise, the state's count of each sampled token, the host ring. Rows
are random logits (fresh every run), so ids must agree exactly (a disagreement would need two
candidates within float rounding of each other). Vocabularies of a few hundred ids are split
into several chunks of MIN_CHUNK (128 in the simulator), the last one partial, so every pass's
cross-block merge runs."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import INT_POISON, fresh_rng, gpu_code_path, poisoned, synced
from numba import cuda

from gpu.kernels import block_reduce, sampling, sampling_common
from gpu.kernels.argmax import CHUNK, WIDE_CHUNK, WIDE_ROWS, argmax_rows, argmax_scratch_size
from gpu.kernels.sampling import (
    CANDIDATES,
    F_FREQUENCY,
    F_MIN_P,
    F_PRESENCE,
    F_REPETITION,
    F_TEMPERATURE,
    F_TOP_P,
    I_BAN_ACTIVE,
    I_STATE_ROW,
    I_TOP_K,
    MIN_CHUNK,
    MODE_COMPACT,
    MODE_EARLY,
    MODE_LINEAR,
    MODE_WON,
    NONE,
    R_KTH,
    R_MAX,
    R_MIN_BOUND,
    R_MODE,
    R_P_T,
    R_SCALE,
    R_SECOND,
    R_THIRD,
    R_WINNER,
    R_Z,
    U_SEED,
    U_STEP,
    chunking,
    sample,
    sampler_scratch,
)
from gpu.kernels.sampling_common import BINS, R_COUNT, THREADS
from gpu.kernels.sampling_linear import LINEAR_SCALE
from gpu.sampling import SamplingMetadata, uniform_from_counter
from gpu.sampling import rng as rng_mod
from gpu.sampling import token_state as ts
from gpu.sampling.numpy_sampler import sample as numpy_sample
from gpu.sampling.numpy_sampler import top_p_threshold

COUNT_MASK = ts.COUNT_MASK


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
    md.state_rows = np.array([r.get("state_row", -1) for r in rows], np.int32)
    md.ban_active = np.array([r.get("ban", 0) for r in rows], np.int32)
    return md


def _params(md: SamplingMetadata) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """fparams / iparams / uparams as the spec lays them out, the extra column neutral."""
    n = md.num_rows
    f = np.zeros((6, n + 1), np.float32)
    f[F_TOP_P, n] = f[F_REPETITION, n] = 1.0
    f[F_TEMPERATURE, :n] = md.temperature
    f[F_TOP_P, :n] = md.top_p
    f[F_MIN_P, :n] = md.min_p
    f[F_REPETITION, :n] = md.repetition_penalty
    f[F_PRESENCE, :n] = md.presence_penalty
    f[F_FREQUENCY, :n] = md.frequency_penalty
    i = np.zeros((3, n + 1), np.int32)
    i[I_STATE_ROW, n] = -1
    i[I_TOP_K, :n] = md.top_k
    i[I_STATE_ROW, :n] = md.state_rows
    i[I_BAN_ACTIVE, :n] = md.ban_active
    u = np.zeros((2, n), np.uint64)
    u[U_SEED] = md.seed
    u[U_STEP] = md.step
    return f, i, u


def _random_state(rng, rows: int, vocab: int) -> np.ndarray:
    """A state table of random histories: prompt flags, bans, counts (repeats, some saturated)."""
    state = ts.new_state(rows, vocab)
    for r in range(rows):
        tokens, values = ts.row_state(
            rng.integers(0, vocab, rng.integers(0, 30)),
            rng.integers(0, vocab // 4, rng.integers(0, 60)),  # repeats
            rng.integers(0, vocab, 3).tolist() + [vocab + 5],
            vocab,
        )
        state[r, tokens] = values
    state[:, rng.integers(0, vocab, 4)] |= np.uint16(COUNT_MASK)  # saturated counts
    return state


def _check(logits, md, seed, state=None, scratch=None) -> tuple[np.ndarray, np.ndarray]:
    """Sample on the device and with the twin; tokens, ring, state and scratch must agree.
    Returns the tokens and the state table after the call."""
    n, vocab = logits.shape
    if state is None:
        state = ts.new_state(max(1, int(md.state_rows.max(initial=-1)) + 1), vocab)
    scratch = scratch or sampler_scratch(n, vocab)
    f, i, u = _params(md)
    out = poisoned((n + 1,), np.int32)  # one row more than asked: left alone
    ring = poisoned((2, n + 1), np.int32)
    d_state = cuda.to_device(state)
    d_mask = cuda.to_device(ts.state_mask(state))
    d_logits = cuda.to_device(logits)
    sample(
        d_logits, cuda.to_device(f), cuda.to_device(i), cuda.to_device(u), d_state, d_mask,
        scratch, out[:n], ring=ring, ring_slot=cuda.to_device(np.array([1], np.int32)),
    )  # fmt: skip
    got, got_ring, got_state = synced(out), synced(ring), synced(d_state)
    want_state = state.copy()
    with np.errstate(invalid="ignore", divide="ignore"):  # the twin on rows of -inf
        expected = numpy_sample(logits.copy(), md, want_state)
    assert got[:n].tolist() == expected.tolist(), f"KERNEL_TEST_SEED={seed}"
    assert got[n] == INT_POISON
    assert got_ring[1, :n].tolist() == expected.tolist()
    assert (got_ring[0] == INT_POISON).all() and got_ring[1, n] == INT_POISON
    assert np.array_equal(got_state, want_state), f"state (KERNEL_TEST_SEED={seed})"
    assert np.array_equal(synced(d_mask), ts.state_mask(want_state)), f"mask ({seed})"
    # The scratch is left ready for the next call.
    assert not synced(scratch.ticket).any() and not synced(scratch.hist).any()
    assert not synced(scratch.linear_rows)[:2].any()  # the split list: count and ticket
    assert not synced(scratch.hist_rows)[:2].any()  # the histogram pass's list
    assert (synced(scratch.best) == NONE).all() and (synced(scratch.winner) == NONE).all()
    won = (synced(scratch.rowi)[R_MODE, :n] & MODE_WON) != 0
    _check_thresholds(logits, md, state, synced(d_logits), synced(scratch.rowf), seed, won)
    return got[:n], got_state


def _twin_keep(scaled: np.ndarray, md: SamplingMetadata, i: int, top_p: bool = True) -> np.ndarray:
    """What numpy_sampler.sample_row keeps of row i's scaled scores (min_p, top_k, and top_p
    unless told not to)."""
    keep = np.isfinite(scaled)
    top = float(scaled.max())
    if md.min_p[i] > 0.0:
        keep &= scaled >= top + np.log(np.float32(md.min_p[i]))
    k = int(md.top_k[i])
    if 0 < k < int(keep.sum()):
        keep &= scaled >= np.partition(np.where(keep, scaled, -np.inf), -k)[-k]
    if top_p and md.top_p[i] < 1.0:
        probs = np.where(keep, np.exp(scaled - top), 0.0).astype(np.float32)
        probs /= probs.sum()
        keep &= probs >= top_p_threshold(probs, float(md.top_p[i]))
    return keep


def _scaled(logits, md, state, i: int) -> np.ndarray:
    """Row i's scores as the twin scales them: the state applied, times 1 / T."""
    x = logits[i].copy()
    if md.state_rows[i] >= 0:
        ts.apply_state(
            x, state[md.state_rows[i]], bool(md.ban_active[i]), md.repetition_penalty[i],
            md.presence_penalty[i], md.frequency_penalty[i],
        )  # fmt: skip
    return x * (np.float32(1.0) / np.float32(md.temperature[i]))


def _check_thresholds(logits, md, state, scores, rowf, seed, won) -> None:
    """Each truncating row: the scores the passes read (logits / scale), and the set the
    thresholds of the radix passes keep, vs the twin's (without top-p where the row's top-p
    phase ended on pass 1's winner, `won`: no cut was computed; its token was checked)."""
    for i in range(md.num_rows):
        truncating = md.min_p[i] > 0 or md.top_k[i] > 0 or md.top_p[i] < 1
        if md.temperature[i] == 0 or not truncating:
            continue
        scaled = _scaled(logits, md, state, i)
        # Rows hold their penalised logits (the state applied in place), the scale is 1 / T.
        inv_t = np.float32(1.0) / np.float32(md.temperature[i])
        assert rowf[R_SCALE, i] == inv_t
        if md.state_rows[i] < 0:
            assert np.array_equal(scores[i], logits[i])
        else:
            np.testing.assert_allclose(scores[i], scaled / inv_t, rtol=1e-6, err_msg=f"{seed}")
        s = scores[i] * rowf[R_SCALE, i]
        np.testing.assert_allclose(s, scaled, rtol=1e-6, err_msg=f"seed {seed}")
        top, min_bound, kth, p_t, z = rowf[[R_MAX, R_MIN_BOUND, R_KTH, R_P_T, R_Z], i]
        near = np.zeros(s.shape, bool)  # probabilities within float rounding of the cut
        with np.errstate(invalid="ignore", over="ignore"):
            keep = np.isfinite(s) & (s >= min_bound) & (s >= kth)
            if p_t > 0:
                p = np.exp(s - top).astype(np.float32) / z
                keep &= p >= p_t
                near = np.abs(p - p_t) <= 4 * np.spacing(p_t)
        with np.errstate(invalid="ignore", divide="ignore"):
            twin = _twin_keep(scaled, md, i, top_p=not won[i])
        keep[near], twin[near] = True, True
        assert keep.tolist() == twin.tolist(), (
            f"row {i}: {keep.sum()} kept, twin {twin.sum()} (KERNEL_TEST_SEED={seed})"
        )


def _linear_bins(top: float, x: np.ndarray) -> np.ndarray:
    """sampling_linear.linear_bin on the host (float32 arithmetic), -1 for non-finite x."""
    with np.errstate(invalid="ignore", over="ignore"):
        d = (np.float32(top) - x.astype(np.float32)) * LINEAR_SCALE
        bins = np.where(d >= BINS - 1, 0, BINS - 1 - np.minimum(d, BINS).astype(np.int64))
    return np.where(np.isfinite(x), bins, -1)


def _force_path(logits, md, state, rows, path: str) -> None:
    """Re-seed each of `rows` until its top-p draw ends where `path` says:
    "winner": pass 1's Gumbel-max over every finite score is a token the twin keeps, 0.05 (over
    two linear bins) above its least kept score or the row's max: the row ends at the linear
    mass pass;
    "edge": the same, but the winner lies in the cut's own bin (above its 3 least kept);
    "second", "third": pass 1's second (third) best noisy score is the first of its three best
    the twin keeps, as "winner" asks: the row ends at the linear mass pass on it;
    "above": pass 1's three best are cut, and the twin's token lies two bins or more above the
    cut's linear bin: the row ends at the split, no score at the cut able to win;
    "cut": pass 1's three best are cut, and a score of the two bins the split copies draws at
    least the token's noisy score: the exact cut and the draw run (sampling_linear.py,
    sampling_draw.py). (Rows asked to take these two have a small top_p: a flat row at 0.9
    cuts all three in about one seed in a thousand.)"""
    rng = np.random.default_rng(int(md.seed[rows[0]]) if rows else 0)
    for i in rows:
        scaled = _scaled(logits, md, state, i)
        finite = np.isfinite(scaled)
        with np.errstate(invalid="ignore", divide="ignore"):
            keep = _twin_keep(scaled, md, i)
        edge, top = scaled[keep].min(), scaled[finite].max()
        bins = _linear_bins(top, scaled)
        cut_bin = bins[keep].min()
        for _ in range(30_000):  # ("cut": one seed in ~1,000 on the flattest rows)
            noisy = scaled + rng_mod.gumbel_noise(int(md.seed[i]), int(md.step[i]), len(scaled))
            drawn = np.where(finite, noisy, -np.inf)
            best = []  # pass 1's three best noisy scores, the smallest index first on a tie
            for _ in range(3):
                best.append(int(np.argmax(drawn)))
                drawn[best[-1]] = -np.inf
            first = next((k for k in range(3) if keep[best[k]]), 3)  # the first kept
            w = best[0]
            if path in ("winner", "second", "third"):  # (the row's max is always kept)
                t = best[min(first, 2)]
                ok = first == ("winner", "second", "third").index(path)
                ok = ok and (scaled[t] >= edge + 0.05 or scaled[t] == top)
            elif path == "edge":  # (clear of the cut's float rounding by two kept scores)
                ok = keep[w] and bins[w] == cut_bin and scaled[w] > np.sort(scaled[keep])[2]
            else:  # (pass 1's three best turned down: else the accept test ends the row)
                token = int(np.argmax(np.where(keep, noisy, -np.inf)))
                near = (bins == cut_bin) | (bins == cut_bin - 1)  # the split's copied bins
                # (The split never ends on a token in the cut's bin: its copied bins hold it.)
                ok = first == 3
                if path == "above":
                    ok = ok and bins[token] >= cut_bin + 2
                    ok = ok and not (near & (noisy >= noisy[token])).any()
                else:
                    ok = ok and (near & (noisy >= noisy[token])).any()
            if ok:
                break
            md.seed[i] = rng.integers(0, 2**63)
        else:
            raise AssertionError(f"no seed found for row {i}")


def test_one_pass_rows_greedy_temperature_penalties_and_bans():
    """Greedy and temperature-only rows finish in the first pass, beside a truncating row."""
    rng, seed = fresh_rng()
    vocab = 2 * MIN_CHUNK + 45
    logits = (rng.standard_normal((6, vocab)) * 3).astype(np.float32)
    state = _random_state(rng, 4, vocab)
    state[1, np.argmax(logits[3])] = 3  # the greedy row's favourite penalised out of first
    state[2, np.argmax(logits[0])] |= np.uint16(ts.BAN_BIT)
    rows = [
        {"state_row": 2, "ban": 1},  # greedy, its argmax banned
        {"temperature": 0.7},
        {"temperature": 1.3, "repetition": 1.5, "presence": 0.5, "frequency": 0.25,
         "state_row": 0, "ban": 1},
        {"repetition": 2.0, "frequency": 1.0, "state_row": 1},  # greedy after penalties
        {"temperature": 1.0, "top_k": 5, "state_row": 3, "presence": 1.0},
        {"temperature": 1.0},
    ]  # fmt: skip
    got, _ = _check(logits, _metadata(rows, rng), seed, state)
    assert got[0] != np.argmax(logits[0])


def test_all_greedy_and_ties():
    rng, seed = fresh_rng()
    logits = rng.standard_normal((3, MIN_CHUNK + 70)).astype(np.float32)
    logits[1, 17] = logits[1, MIN_CHUNK + 9] = 50.0  # a tie across chunks: the first index
    logits[2] = -np.inf  # np.argmax gives 0
    _check(logits, SamplingMetadata.greedy(3), seed)


def _compaction(scratch, rows: int, candidates: int) -> None:
    """With room for the candidates some truncating row went compact (its later passes read
    the copy); with room for 3, some did not (they read the logits)."""
    modes = synced(scratch.rowi)[R_MODE, :rows]
    compact = (modes & MODE_COMPACT) != 0
    assert compact.any() if candidates == CANDIDATES else not compact.all()


@pytest.mark.parametrize("candidates", [CANDIDATES, 3])
def test_top_k_edges(candidates):
    """k = 1, k at a tie, k = vocab, k past the kept count (min_p), an all-equal row, k with a
    min_p bound below the k-th score (the first digit counted in pass 1 either way)."""
    rng, seed = fresh_rng()
    vocab = 2 * MIN_CHUNK + 77
    logits = (rng.standard_normal((8, vocab)) * 2).astype(np.float32)
    logits[1, rng.permutation(vocab)[:10]] = 4.0  # ties at the top-k edge all stay
    logits[4] = 0.5
    logits[5, rng.permutation(vocab)[:40]] = -np.inf
    rows = [
        {"temperature": 0.8, "top_k": 1},
        {"temperature": 1.0, "top_k": 7},
        {"temperature": 1.2, "top_k": vocab},
        {"temperature": 1.0, "top_k": 50, "min_p": 0.3},
        {"temperature": 1.0, "top_k": 3},
        {"temperature": 0.9, "top_k": 60},
        {"temperature": 1.0, "top_k": 4, "min_p": 0.02},
        {"temperature": 1.0, "top_k": 5},  # every logit -inf: nothing kept, token 0
    ]
    logits[7] = -np.inf
    scratch = sampler_scratch(len(rows), vocab, candidates=candidates)
    _check(logits, _metadata(rows, rng), seed, scratch=scratch)
    _compaction(scratch, len(rows), candidates)


@pytest.mark.parametrize("candidates", [CANDIDATES, 3])
def test_top_p_and_min_p(candidates):
    rng, seed = fresh_rng()
    vocab = MIN_CHUNK + 33
    logits = (rng.standard_normal((9, vocab)) * 2).astype(np.float32)
    logits[[2, 8]] = 0.25  # all equal: the cut is a tie of every token
    logits[3, :8] = 5.0  # ties at the top-p edge
    logits[4, rng.permutation(vocab)[:20]] = -np.inf
    logits[6] = -np.inf
    logits[7] *= 0.15  # flat (random weights): the nucleus is most of the row
    rows = [
        {"temperature": 1.0, "top_p": 0.6},
        {"temperature": 1.5, "min_p": 0.2},
        {"temperature": 1.0, "top_k": vocab, "top_p": 0.5},  # no pass-1 winner: the cut's tie
        {"temperature": 0.7, "top_p": 0.3},
        {"temperature": 0.9, "top_k": 40, "top_p": 0.8, "min_p": 0.05},
        {"temperature": 1.0, "top_p": 1.0, "min_p": 0.01},
        {"temperature": 1.0, "top_p": 0.5},  # every logit -inf: token 0
        {"temperature": 0.7, "top_p": 0.5},
        {"temperature": 1.0, "top_p": 0.5},  # the tie holds pass 1's winner: ends on it
    ]
    md = _metadata(rows, rng)
    state = ts.new_state(1, vocab)
    _force_path(logits, md, state, [0, 3, 7], "cut")  # the full path: the exact cut
    scratch = sampler_scratch(len(rows), vocab, candidates=candidates)
    _check(logits, md, seed, state, scratch)
    _compaction(scratch, len(rows), candidates)
    # Top-p rows found their cut bin on the linear scale (sampling_linear.py) and, with room
    # for the two bins, read only the copy after it; with room for 3 the all-equal row (every
    # score in one bin) overflowed and went back to the radix digits over the row.
    modes = synced(scratch.rowi)[R_MODE, : len(rows)]
    linear = (modes & MODE_LINEAR) != 0
    if candidates == CANDIDATES:
        assert linear[[0, 2, 3, 7]].all()
    else:
        assert not linear[2]
    assert (modes[8] & MODE_WON) != 0 and not linear[8]


def test_top_p_large_copies():
    """Flat rows whose two cut bins copy thousands of scores (more than 8 a thread of the
    one-block select), a whole row tied, and a row with a token state (its penalties applied in
    place): the twin's tokens, every row compact."""
    rng, seed = fresh_rng()
    vocab = 8 * THREADS + 77
    logits = (rng.standard_normal((4, vocab)) * 0.01).astype(np.float32)  # flat: a few bins
    logits[0] *= 0.2  # flatter still: nearly the whole row in the two cut bins
    logits[1] = 0.25  # all equal: every score in the top bin, a tie at the cut (top-k: no
    # pass-1 winner, which the tie would hold)
    logits[2] = rng.standard_normal(vocab) * 0.5  # (a few scores at the cut in the simulator too)
    rows = [
        {"temperature": 1.0, "top_p": 0.5},
        {"temperature": 1.0, "top_k": vocab, "top_p": 0.5},
        {"temperature": 0.7, "top_p": 0.6},
        {"temperature": 0.8, "top_p": 0.3, "repetition": 1.1, "state_row": 0},
    ]
    md = _metadata(rows, rng)
    state = ts.new_state(1, vocab)
    _force_path(logits, md, state, [0, 2, 3], "cut")  # the split, the copy, the cut
    scratch = sampler_scratch(len(rows), vocab)
    _check(logits, md, seed, state, scratch)
    rowi = synced(scratch.rowi)
    compact = (rowi[R_MODE, : len(rows)] & MODE_COMPACT) != 0
    assert compact.all()
    assert rowi[R_COUNT, 1] == vocab  # the tie: the whole row copied
    assert (rowi[R_COUNT, : len(rows)] > 8 * THREADS).sum() >= 2, rowi[R_COUNT]


@pytest.mark.parametrize("candidates", [CANDIDATES, 3])
def test_penalties_with_truncation_and_state_counts(candidates):
    """Penalties + top-p / top-k rows; each sampled token counted in its state row, a saturated
    count left as it is; rows without state leave the table alone."""
    rng, seed = fresh_rng()
    vocab = 2 * MIN_CHUNK + 5
    logits = (rng.standard_normal((4, vocab)) * 2).astype(np.float32)
    state = _random_state(rng, 5, vocab)
    state[4, :] = COUNT_MASK  # every count saturated: nothing changes
    rows = [
        {"temperature": 1.0, "top_p": 0.9, "repetition": 1.3, "frequency": 0.2, "state_row": 2},
        {"temperature": 0.8, "top_k": 20, "presence": 0.7, "state_row": 0, "ban": 1},
        {"temperature": 1.0, "top_k": 10, "repetition": 1.2, "state_row": 4},
        {"temperature": 1.0, "min_p": 0.1},
    ]
    scratch = sampler_scratch(len(rows), vocab, candidates=candidates)
    got, after = _check(logits, _metadata(rows, rng), seed, state, scratch)
    _compaction(scratch, len(rows), candidates)
    expected = state.copy()
    for row, tok in ((2, got[0]), (0, got[1])):
        if expected[row, tok] & COUNT_MASK < COUNT_MASK:
            expected[row, tok] += 1
    assert np.array_equal(after, expected), f"KERNEL_TEST_SEED={seed}"


def test_early_exits_on_a_winner():
    """Top-p ends on a winner wherever it can (MODE_WON), the twin's token either way: pass 1's
    Gumbel-max over every finite score, where the nucleus keeps it, ends the row at the linear
    mass pass (no histogram, no split, no exact cut, no select), and so does its runner-up
    where the winner is cut and it is not; else the split's Gumbel-max above the cut bin, where
    no score of the two copied bins can beat it; else the exact cut and the draw run. A min-p
    row alone takes no winner in pass 1. Each row is re-seeded to take the path asked."""
    rng, seed = fresh_rng()
    vocab = 2 * MIN_CHUNK + 19
    spread = np.array([0.5, 2.0, 0.5, 1.5, 1.0, 1.0, 1.3, 1.3, 1.0, 0.5, 0.5, 1.0, 0.7])
    logits = (rng.standard_normal((13, vocab)) * spread[:, None]).astype(np.float32)
    state = _random_state(rng, 4, vocab)
    rows = [
        {"temperature": 0.7, "top_p": 0.9},  # flat: a nucleus of most of the row
        {"temperature": 1.0, "top_p": 0.5},  # peaked
        {"temperature": 0.7, "top_p": 0.6},
        {"temperature": 1.0, "top_p": 0.8},  # (never a nucleus of one: "above" needs two bins)
        {"temperature": 1.0, "top_p": 0.8, "min_p": 0.1},
        {"temperature": 1.0, "top_p": 0.5, "min_p": 0.1},
        {"temperature": 0.7, "top_p": 0.9, "repetition": 1.1, "state_row": 0},  # the app's
        {"temperature": 0.7, "top_p": 0.6, "min_p": 0.05, "repetition": 1.1, "state_row": 1},
        {"temperature": 1.0, "min_p": 0.1},
        {"temperature": 0.7, "top_p": 0.6, "repetition": 1.1, "state_row": 2},
        {"temperature": 0.7, "top_p": 0.9},
        {"temperature": 1.0, "top_p": 0.8, "min_p": 0.1, "repetition": 1.1, "state_row": 3},
        {"temperature": 0.7, "top_p": 0.7},
    ]
    md = _metadata(rows, rng)
    _force_path(logits, md, state, [0, 1, 4, 6], "winner")
    _force_path(logits, md, state, [10, 11], "second")
    _force_path(logits, md, state, [12], "third")
    _force_path(logits, md, state, [2, 3, 9], "above")
    _force_path(logits, md, state, [5, 7], "cut")
    scratch = sampler_scratch(len(rows), vocab)
    _check(logits, md, seed, state, scratch)
    rowi = synced(scratch.rowi)[:, : len(rows)]
    modes = rowi[R_MODE]
    assert ((modes & MODE_WON) != 0).tolist() == [1, 1, 1, 1, 1, 0, 1, 0, 0, 1, 1, 1, 1]
    assert ((modes & MODE_LINEAR) != 0).tolist() == [0] * 5 + [1, 0, 1] + [0] * 5
    assert ((modes & MODE_EARLY) != 0).tolist() == [1] * 8 + [0] + [1] * 4
    # the rows ended on the noisy score asked for (R_WINNER set to it), the others on the winner
    took = np.where(
        rowi[R_WINNER] == rowi[R_SECOND], 2, np.where(rowi[R_WINNER] == rowi[R_THIRD], 3, 1)
    )
    assert took[[0, 1, 4, 6, 10, 11, 12]].tolist() == [1, 1, 1, 1, 2, 2, 3]


def test_winner_in_the_cut_bin():
    """The accept test is exact, not a bin's: a pass-1 winner in the cut's own linear bin, kept
    by the nucleus, still ends its row at the mass pass (flat rows, whose cut bin holds a tenth
    of the row), a row with a token state and a min-p row among them."""
    rng, seed = fresh_rng()
    vocab = 8 * MIN_CHUNK + 7
    logits = (rng.standard_normal((3, vocab)) * 0.02).astype(np.float32)
    state = _random_state(rng, 1, vocab)
    rows = [
        {"temperature": 1.0, "top_p": 0.5},
        {"temperature": 0.7, "top_p": 0.9, "repetition": 1.1, "state_row": 0},
        {"temperature": 1.0, "top_p": 0.6, "min_p": 0.95},  # keeps about a third
    ]
    md = _metadata(rows, rng)
    for i in range(len(rows)):  # a top_p whose cut bin keeps 8 scores or more
        for _ in range(500):
            scaled = _scaled(logits, md, state, i)
            keep = _twin_keep(scaled, md, i)
            bins = _linear_bins(scaled[np.isfinite(scaled)].max(), scaled)
            if (bins[keep] == bins[keep].min()).sum() >= 8:
                break
            md.top_p[i] = rng.uniform(0.3, 0.95)
        else:
            raise AssertionError(f"no top_p for row {i} (KERNEL_TEST_SEED={seed})")
    _force_path(logits, md, state, [0, 1, 2], "edge")
    scratch = sampler_scratch(len(rows), vocab)
    _check(logits, md, seed, state, scratch)
    modes = synced(scratch.rowi)[R_MODE, : len(rows)]
    assert ((modes & MODE_WON) != 0).all() and not ((modes & MODE_LINEAR) != 0).any()


def test_one_row_reused_scratch_and_many_draws():
    """One row (the most chunks), sampled at several steps through one scratch: each call
    leaves the scratch clean for the next, and the draws follow the twin's."""
    rng, seed = fresh_rng()
    vocab = 3 * MIN_CHUNK + 1
    assert chunking(1, vocab)[0] == 4
    logits = (rng.standard_normal((1, vocab)) * 1.5).astype(np.float32)
    scratch = sampler_scratch(2, vocab)
    drawn = set()
    for step, row in enumerate([{"temperature": 1.0, "top_p": 0.95}, {"temperature": 1.0},
                                {"temperature": 1.0, "top_k": 30}]):  # fmt: skip
        md = _metadata([row], rng)
        md.step[:] = step
        drawn.add(int(_check(logits, md, seed, scratch=scratch)[0][0]))
    assert len(drawn) > 1


def test_gpu_code_path():
    """block_reduce's warp-shuffle reduction and the noise filter's shared bar (the GPU's),
    shuffles emulated in the simulator; a top-p row draws above its cut bin with the filter."""
    rng, seed = fresh_rng()
    logits = (rng.standard_normal((3, MIN_CHUNK + 3)) * 2).astype(np.float32)
    rows = [{"temperature": 1.0, "top_k": 4, "top_p": 0.9}, {}, {"temperature": 1.0, "top_p": 0.9}]
    with gpu_code_path(block_reduce, sampling_common):
        _check(logits, _metadata(rows, rng), seed)


@cuda.jit
def _noisy_offer_kernel(xs, bars, tokens, key, got, exact, held):
    i = cuda.grid(1)
    if i < xs.shape[0]:
        offset = sampling_common.bar_offset(bars[i])
        got[i], _, _ = sampling_common.noisy_offer(
            NONE, NONE, NONE, xs[i], tokens[i], key, offset, 1
        )
        exact[i] = sampling_common.pack(xs[i] + sampling_common.gumbel(key, tokens[i]), tokens[i])
        # the three best of (held[i, 0] > held[i, 1] > held[i, 2], the offer), in place
        held[i, 0], held[i, 1], held[i, 2] = sampling_common.noisy_offer(
            held[i, 0], held[i, 1], held[i, 2], xs[i], tokens[i], key, offset, 3
        )


def test_noisy_offer_skips_only_what_cannot_reach_the_bar():
    """The noise filter against the exact draw: where it offers nothing the exact noisy score is
    under the bar (so it could not be the row's max), elsewhere it is the exact packed score.
    Bars at random distances, and right at the edge: the exact score itself, a rounding above
    and below it, and the slack's size either side; logits up to 1e4 (the slack scales); -inf,
    +inf and NaN never offered. Keeping three, an offer lands first, second, third or
    nowhere."""
    rng, seed = fresh_rng()
    n = 4096
    key = rng_mod.row_key(np.uint64(rng.integers(0, 2**63)), np.uint64(rng.integers(0, 1000)))
    tokens = rng.integers(0, 200_000, n).astype(np.int32)
    scale = np.where(np.arange(n) % 8 == 0, 1e4, 3.0).astype(np.float32)
    xs = (rng.standard_normal(n) * scale).astype(np.float32)
    xs[4:7] = [-np.inf, np.inf, np.nan]
    d_xs, d_tokens = cuda.to_device(xs), cuda.to_device(tokens)

    held = np.sort(rng.integers(0, 2**62, (n, 3)), axis=1)[:, ::-1].copy()  # best first
    held[: n // 4, 2] = NONE
    held[: n // 8, 1] = NONE
    held[: n // 16, 0] = NONE
    kept_three = np.empty_like(held)

    def run(bars: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        got, exact = poisoned((n,), np.int64), poisoned((n,), np.int64)
        three = cuda.to_device(held)
        _noisy_offer_kernel[n // 64, 64](
            d_xs, cuda.to_device(bars.astype(np.float32)), d_tokens, np.uint64(key), got, exact,
            three,
        )  # fmt: skip
        kept_three[:] = synced(three)
        return synced(got), synced(exact)

    unbarred, exact = run(np.full(n, -np.inf, np.float32))
    assert (unbarred[4:7] == NONE).all() and (unbarred[7:] >= 0).all()
    values = _key_values(exact >> 31)  # each exact noisy score
    edge = np.array([0.0, 1e-7, -1e-7, 1e-3, -1e-3, 3e-3, -3e-3, 0.5], np.float32)
    bars = (xs + rng.uniform(-2.0, 22.0, n)).astype(np.float32)
    at_edge = np.flatnonzero(np.arange(n) % 2 == 1)
    e = edge[at_edge % len(edge)]
    bars[at_edge] = values[at_edge] * (1 + e) + e
    bars[:4] = [-np.inf, values[1], xs[2] + 100, xs[3] - 100]
    bars[4:7] = [0.0, 0.0, 0.0]
    got, again = run(bars)
    assert np.array_equal(again, exact)
    skipped = got == NONE
    finite = np.isfinite(xs)
    assert (values[skipped & finite] < bars[skipped & finite]).all(), f"KERNEL_TEST_SEED={seed}"
    assert np.array_equal(got[~skipped], exact[~skipped]), f"KERNEL_TEST_SEED={seed}"
    assert not skipped[:2].any() and skipped[2] and not skipped[3] and skipped[4:7].all()
    assert skipped.mean() > 0.4  # it does skip: most random bars are out of reach
    offered = np.where(skipped, NONE, exact)
    four = np.sort(np.column_stack([held, offered]), axis=1)[:, ::-1]
    assert np.array_equal(kept_three, four[:, :3]), f"KERNEL_TEST_SEED={seed}"


@cuda.jit
def _block_best_kernel(values, firsts, n, out, bars):
    """Each block: every thread seeds the block's best n with its own three best (as after a
    first group, seed_block_best), then inserts its other values one by one (insert_best),
    reading the bar (slots[n - 1]) before each: the bar it read must never exceed the n-th
    largest value inserted before it."""
    slots = cuda.shared.array(3, np.int64)
    b = cuda.blockIdx.x
    t = cuda.threadIdx.x
    if t < 3:
        slots[t] = NONE
    cuda.syncthreads()
    f = firsts[b, t]
    sampling_common.seed_block_best(slots, f[0], f[1], f[2], n)
    for j in range(values.shape[2]):
        bars[b, t, j] = slots[n - 1]
        sampling_common.insert_best(slots, values[b, t, j], n)
    cuda.syncthreads()
    if t < 3:
        out[b, t] = slots[t]


@pytest.mark.parametrize("n", [1, 3])
def test_block_best_keeps_the_n_largest_whatever_the_order(n):
    """insert_best from every thread of a block at once (and seed_block_best's warp merge on
    the GPU) leaves the block's n largest values in order, whatever order the atomics land
    in; every bar a thread read on the way was a value with n - 1 others at least as large.
    Blocks of distinct values, and blocks with only NONE (a row of -inf) or few values."""
    rng, seed = fresh_rng()
    blocks, threads, each = 6, 64, 5
    values = rng.choice(2**40, blocks * threads * each, replace=False).reshape(
        blocks, threads, each
    )
    values = values.astype(np.int64)
    values[1] = NONE  # nothing offered
    values[2, 1:] = NONE  # one thread's values only
    firsts = np.sort(values[:, :, :3], axis=2)[:, :, ::-1].copy()  # each thread's own, best first
    if n == 1:
        firsts[:, :, 1:] = NONE
    rest = values[:, :, 3:].copy()
    out, bars = poisoned((blocks, 3), np.int64), poisoned(rest.shape, np.int64)
    _block_best_kernel[blocks, threads](
        cuda.to_device(rest), cuda.to_device(firsts), n, out, bars
    )  # fmt: skip
    got, bars = synced(out), synced(bars)
    pool = np.concatenate([firsts[:, :, :n].reshape(blocks, -1), rest.reshape(blocks, -1)], 1)
    want = np.sort(pool, axis=1)[:, ::-1][:, :n]
    assert np.array_equal(got[:, :n], want), f"KERNEL_TEST_SEED={seed}"
    assert (bars <= want[:, n - 1][:, None, None]).all(), f"KERNEL_TEST_SEED={seed}"
    assert (bars[0] > NONE).any()  # the bar does rise: seeded from the first values


@cuda.jit
def _fixed_mass_kernel(xs, top, out):
    i = cuda.grid(1)
    if i < xs.shape[0]:
        out[i] = sampling_common.fixed_mass(xs[i], sampling_common.mass_origin(top))


def test_fixed_mass_is_exp_in_fixed_point():
    """fixed_mass(x, mass_origin(top)) against float64 exp(x - top) * 2**44, for |top| <= 30
    and scores down to 35 under it: within one unit (the truncation) and 3e-6 relatively (the
    origin's rounding, a factor common to the row, and the ex2 argument's, larger far under
    the max); -inf has no mass, and a row with no finite score (top -inf) gives 0, not NaN's
    garbage."""
    rng, seed = fresh_rng()
    top = np.float32(rng.uniform(-30, 30))
    xs = (top - rng.uniform(0, 35, 4096)).astype(np.float32)
    xs[:3] = [top, -np.inf, np.nextafter(top, np.float32(-np.inf))]
    got = poisoned((len(xs),), np.int64)
    _fixed_mass_kernel[len(xs) // 128, 128](cuda.to_device(xs), top, got)
    got = synced(got)
    want = np.exp(xs.astype(np.float64) - np.float64(top)) * 2.0**44
    assert got[1] == 0, f"KERNEL_TEST_SEED={seed}"
    live = np.isfinite(xs)
    err = np.abs(got[live] - want[live]) - 1.0  # (truncation: up to one unit)
    assert (err <= 3e-6 * want[live]).all(), f"KERNEL_TEST_SEED={seed}"
    empty = poisoned((4,), np.int64)
    _fixed_mass_kernel[1, 4](cuda.to_device(np.full(4, -np.inf, np.float32)), -np.inf, empty)
    assert (synced(empty) == 0).all()


def _key_values(keys: np.ndarray) -> np.ndarray:
    """bf16.key_to_f32 on the host: the float32 values of ordered keys."""
    keys = keys.astype(np.int64)
    bits = np.where(keys & 0x80000000, keys & 0x7FFFFFFF, 0xFFFFFFFF - keys)
    return bits.astype(np.uint32).view(np.float32)


def test_temperature_rows_on_the_gpu_code_path():
    """Temperature-only rows, the warp sharing its best noisy score through shuffles (emulated
    here): flat rows where the noise decides, a cold row (most scores far under the bar), huge
    logits, -inf entries; several steps. Tokens equal the twin's."""
    rng, seed = fresh_rng()
    vocab = MIN_CHUNK + 37
    logits = (rng.standard_normal((5, vocab)) * 3).astype(np.float32)
    logits[0] = 0.5  # all equal: the noise alone decides
    logits[3] += 1e4
    logits[4, rng.integers(0, vocab, 50)] = -np.inf
    rows = [{"temperature": t} for t in (1.0, 1.0, 0.05, 0.7, 1.3)]
    with gpu_code_path(block_reduce, sampling_common):
        for step in range(3):
            md = _metadata(rows, rng)
            md.step[:] = step
            _check(logits, md, seed)


def test_chunking():
    for rows in (1, 3, 8, 64, 256):
        for vocab in (1, MIN_CHUNK - 1, 5 * MIN_CHUNK + 3, 128_256):
            chunks, chunk_len = chunking(rows, vocab)
            assert chunks >= 1 and chunk_len % sampling.THREADS == 0
            assert (chunks - 1) * chunk_len < vocab <= chunks * chunk_len
            assert chunks == 1 or chunk_len >= MIN_CHUNK


@cuda.jit
def _uniform_kernel(seeds, tokens, step, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = sampling.uniform(sampling.row_key(seeds[i], step), tokens[i])


def test_uniform_matches_rng_and_is_never_one():
    """The kernel's row key and uniform are rng.uniform_from_counter (23 bits + 1/2 over
    2**23): the top value stays below 1 in float32, so the Gumbel noise is finite."""
    rng, seed = fresh_rng()
    seeds = rng.integers(0, 2**63, 50).astype(np.uint64)
    tokens = rng.integers(0, 200_000, 50).astype(np.uint64)
    want = uniform_from_counter(seeds, np.uint64(7), tokens)
    out = poisoned((50,), np.float32)
    _uniform_kernel[1, 64](cuda.to_device(seeds), cuda.to_device(tokens), np.uint64(7), out)
    assert np.array_equal(synced(out), want), f"KERNEL_TEST_SEED={seed}"
    top = (np.float32(2**23 - 1) + np.float32(0.5)) / np.float32(2**23)
    assert top < 1 and np.float32(0.5) / np.float32(2**23) > 0


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
