"""The sampler in numpy: the cpu backend's, and the oracle of the CUDA sampling kernels.

One row at a time, in vLLM's order: bans and penalties on the raw logits from the row's token
state (gpu/sampling/token_state.py), greedy rows take the argmax; the rest divide by the
temperature, drop tokens under min_p times the top probability, keep the top_k largest, keep
the smallest top_p nucleus, and draw with Gumbel-max from what is left. Then each row with a
token state counts the token it sampled there (the state is the sequence's history: no step
uploads one).

Truncation is defined by thresholds so that a kernel can reproduce it without sorting: top-k
keeps every token whose logit is at least the k-th largest (ties at the edge all stay); top-p
keeps every token whose probability is at least t, for the largest t whose kept mass reaches
top_p.

`fast=True` is the CPU fast path's sampler (gpu/backends/cpu_quant.py): the same draws without
the two full-row costs, which on the 2-core host took 1.1 ms (top-p's sort) and 1.5 ms (the
noise) of each 49,152-id row, half a batch-8 step of the q8 path. Top-p sorts only the
probabilities near the top, or only the bin of their float32 keys where the nucleus ends
(fast_top_p_threshold), and noise is drawn for the kept ids alone (the uniforms are a function
of the id: the same values). The tokens are the twin's except where the float64 rounding of
the row's mass (summed pairwise and per bin, not in sorted order) decides the top-p cut.
"""

from __future__ import annotations

import numpy as np

from gpu.sampling.metadata import SamplingMetadata
from gpu.sampling.rng import gumbel_noise, gumbel_noise_at
from gpu.sampling.token_state import add_tokens, apply_state


def top_p_threshold(probs: np.ndarray, top_p: float) -> float:
    """The largest t such that the probability mass of {p >= t} reaches top_p."""
    order = np.sort(probs)[::-1]
    cumulative = np.cumsum(order, dtype=np.float64)
    # First index where the cumulative mass reaches top_p (always at least the top token).
    cut = int(np.searchsorted(cumulative, top_p * cumulative[-1], side="left"))
    return float(order[min(cut, len(order) - 1)])


PEAKED = 4096  # the most candidates the peaked path sorts
PEAKED_BOUND = np.float32(2.0**-10)  # its candidates: probabilities >= the top's x this


def fast_top_p_threshold(probs: np.ndarray, top_p: float) -> float:
    """top_p_threshold without sorting the row (float32 probabilities; zeros: dropped ids).

    Peaked rows (a real model's): the probabilities within 2**-10 of the top one, if at most
    PEAKED of them hold the nucleus, sorted alone; the cumulative mass is the twin's sorted
    prefix. Flat rows (and the rest): each probability's float32 bits shifted right by 15
    (the exponent and 8 mantissa bits) are a key that orders as the values do; the keys' masses
    (np.bincount) summed from the top find the bin where the nucleus ends, and only that bin's
    values are sorted. Both compare against top_p times the row's float64 (pairwise) sum, and
    the bins above the cut are summed per bin: the cut may differ from the twin's only where
    that rounding decides it (relative 1e-16). 2-core host, 49,152 ids: 0.04-0.06 ms a peaked
    row and 0.15-0.5 ms a flat one, where a partial sort of the largest 1,024 takes 0.4 ms and
    a flat row's full sort 2.0 ms (BENCHMARKS.md: the app's defaults at batch 8)."""
    total = float(probs.sum(dtype=np.float64))
    if total <= 0.0:
        return 0.0
    target = top_p * total
    near = probs >= probs.max() * PEAKED_BOUND
    if np.count_nonzero(near) <= PEAKED:
        largest = np.sort(probs[near])[::-1]
        k = int(np.searchsorted(np.cumsum(largest, dtype=np.float64), target, side="left"))
        if k < len(largest):  # the nucleus ends among them: every value >= largest[k] is here
            return float(largest[k])
    keys = probs.view(np.int32) >> 15
    low = int(keys.min())
    mass = np.bincount(np.subtract(keys, low, out=keys), weights=probs)[::-1]  # top key first
    above = np.cumsum(mass)
    j = min(int(np.searchsorted(above, target, side="left")), len(mass) - 1)
    in_bin = np.sort(probs[keys == len(mass) - 1 - j])[::-1]
    before = float(above[j - 1]) if j else 0.0
    k = int(np.searchsorted(before + np.cumsum(in_bin, dtype=np.float64), target, side="left"))
    cut = float(in_bin[min(k, len(in_bin) - 1)])
    # Rounding past the last kept value reaches the dropped tokens' zeros: keep what is kept.
    return cut if cut > 0.0 else float(probs[probs > 0].min())


def sample_row(
    logits: np.ndarray, md: SamplingMetadata, i: int, state: np.ndarray | None, fast: bool = False
) -> int:
    """Sample one token from one row of float32 logits (modified in place); the state is read,
    not updated (sample() counts the tokens). `fast`: see the module docstring."""
    r = int(md.state_rows[i])
    if r >= 0:
        apply_state(
            logits,
            state[r],
            bool(md.ban_active[i]),
            float(md.repetition_penalty[i]),
            float(md.presence_penalty[i]),
            float(md.frequency_penalty[i]),
        )
    temperature = float(md.temperature[i])
    if temperature == 0.0:
        return int(np.argmax(logits))
    scaled = logits * (np.float32(1.0) / np.float32(temperature))  # as the kernels: x * (1 / T)
    keep = np.isfinite(scaled)
    top = float(scaled.max())
    if md.min_p[i] > 0.0:
        # p_i >= min_p * p_max  <=>  scaled_i >= max + log(min_p)
        keep &= scaled >= top + np.log(np.float32(md.min_p[i]))
    k = int(md.top_k[i])
    if 0 < k < int(keep.sum()):
        kth = np.partition(np.where(keep, scaled, -np.inf), -k)[-k]
        keep &= scaled >= kth
    if md.top_p[i] < 1.0:
        probs = np.exp(scaled - np.float32(top))  # float32, zeroed where not kept
        probs[~keep] = 0.0
        probs /= probs.sum()
        threshold = fast_top_p_threshold if fast else top_p_threshold
        keep &= probs >= threshold(probs, float(md.top_p[i]))
    if fast:
        ids = np.flatnonzero(keep)
        if ids.size == 0:
            return 0  # np.argmax of a row of -inf
        noisy = scaled[ids] + gumbel_noise_at(int(md.seed[i]), int(md.step[i]), ids)
        return int(ids[np.argmax(noisy)])
    noisy = np.where(
        keep, scaled + gumbel_noise(int(md.seed[i]), int(md.step[i]), len(scaled)), -np.inf
    )
    return int(np.argmax(noisy))


def sample(
    logits: np.ndarray, md: SamplingMetadata, state: np.ndarray | None = None, fast: bool = False
) -> np.ndarray:
    """Sample one token per row of `logits` [S, V] (float32, left unchanged). Returns int32 [S].

    state: the token-state table (uint16 [rows, V]) with md.state_writes already applied (the
    backend applies them: token_state.write_states); needed when some md.state_rows >= 0, and
    updated in place: each such row counts the token sampled for it, as the kernel does.
    """
    if md.all_greedy:
        return np.argmax(logits, axis=-1).astype(np.int32)
    if state is None and md.has_state:
        raise ValueError("rows with token state need the state table")
    rows = np.array(logits, dtype=np.float32, copy=True)
    tokens = np.array(
        [sample_row(rows[i], md, i, state, fast) for i in range(rows.shape[0])], dtype=np.int32
    )
    if md.has_state:
        add_tokens(state, md.state_rows, tokens)
    return tokens
