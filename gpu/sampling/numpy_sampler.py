"""The sampler in numpy: the cpu backend's, and the oracle of the CUDA sampling kernels.

One row at a time, in vLLM's order: penalties on the raw logits, banned tokens (min_tokens),
greedy rows take the argmax; the rest divide by the temperature, drop tokens under min_p times
the top probability, keep the top_k largest, keep the smallest top_p nucleus, and draw with
Gumbel-max from what is left.

Truncation is defined by thresholds so that a kernel can reproduce it without sorting: top-k
keeps every token whose logit is at least the k-th largest (ties at the edge all stay); top-p
keeps every token whose probability is at least t, for the largest t whose kept mass reaches
top_p.
"""

from __future__ import annotations

import numpy as np

from gpu.sampling.metadata import SamplingMetadata
from gpu.sampling.rng import gumbel_noise


def apply_penalties(
    logits: np.ndarray,
    prompt_ids: np.ndarray,
    output_ids: np.ndarray,
    repetition: float,
    presence: float,
    frequency: float,
) -> None:
    """In place on one row, with vLLM's semantics.

    repetition: tokens seen in the prompt or the output have positive logits divided and
    negative ones multiplied by it. frequency / presence: subtract penalty * count and
    penalty * (count > 0) for tokens of the output.
    """
    vocab = logits.shape[0]
    if repetition != 1.0:
        seen = np.zeros(vocab, dtype=bool)
        seen[prompt_ids[prompt_ids < vocab]] = True
        seen[output_ids[output_ids < vocab]] = True
        row = logits[seen]
        logits[seen] = np.where(row > 0, row / repetition, row * repetition)
    if presence != 0.0 or frequency != 0.0:
        counts = np.bincount(output_ids[output_ids < vocab], minlength=vocab).astype(np.float32)
        logits -= np.float32(frequency) * counts + np.float32(presence) * (counts > 0)


def top_p_threshold(probs: np.ndarray, top_p: float) -> float:
    """The largest t such that the probability mass of {p >= t} reaches top_p."""
    order = np.sort(probs)[::-1]
    cumulative = np.cumsum(order, dtype=np.float64)
    # First index where the cumulative mass reaches top_p (always at least the top token).
    cut = int(np.searchsorted(cumulative, top_p * cumulative[-1], side="left"))
    return float(order[min(cut, len(order) - 1)])


def sample_row(logits: np.ndarray, md: SamplingMetadata, i: int) -> int:
    """Sample one token from one row of float32 logits (modified in place)."""
    if md.has_penalties:
        apply_penalties(
            logits,
            md.prompt_token_ids[i],
            md.output_token_ids[i],
            float(md.repetition_penalty[i]),
            float(md.presence_penalty[i]),
            float(md.frequency_penalty[i]),
        )
    if md.banned_token_ids is not None and md.banned_token_ids[i]:
        banned = [t for t in md.banned_token_ids[i] if t < logits.shape[0]]
        logits[banned] = -np.inf
    temperature = float(md.temperature[i])
    if temperature == 0.0:
        return int(np.argmax(logits))
    scaled = logits / np.float32(temperature)
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
        probs = np.where(keep, np.exp(scaled - top), 0.0).astype(np.float32)
        probs /= probs.sum()
        keep &= probs >= top_p_threshold(probs, float(md.top_p[i]))
    noisy = np.where(
        keep, scaled + gumbel_noise(int(md.seed[i]), int(md.step[i]), len(scaled)), -np.inf
    )
    return int(np.argmax(noisy))


def sample(logits: np.ndarray, md: SamplingMetadata) -> np.ndarray:
    """Sample one token per row of `logits` [S, V] (float32). Returns int32 [S]."""
    if md.all_greedy and not md.has_penalties and md.banned_token_ids is None:
        return np.argmax(logits, axis=-1).astype(np.int32)
    rows = np.array(logits, dtype=np.float32, copy=True)
    return np.array([sample_row(rows[i], md, i) for i in range(rows.shape[0])], dtype=np.int32)
