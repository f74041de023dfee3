"""Rotary position embeddings: the frequency table, computed once on the host.

Every backend gets the same `cos` / `sin` tables of shape [max_positions, head_dim // 2], so a
kernel only does the rotation (HF's rotate-half layout: the first half of each head is paired
with the second half). The llama3 scaling of Llama 3.1/3.2 stretches the low frequencies by
`factor` and blends smoothly between `low_freq_factor` and `high_freq_factor` wavelengths; the
formula here is the one of transformers' `_compute_llama3_parameters`.
"""

from __future__ import annotations

import math

import numpy as np


def rope_inv_freq(head_dim: int, theta: float, rope_scaling=None) -> np.ndarray:
    """Inverse frequencies, float32, as transformers computes them (in float32)."""
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq = (1.0 / (np.float32(theta) ** exponent)).astype(np.float32)
    if rope_scaling is None or rope_scaling.rope_type == "default":
        return inv_freq
    if rope_scaling.rope_type == "linear":
        return (inv_freq / np.float32(rope_scaling.factor)).astype(np.float32)
    if rope_scaling.rope_type == "llama3":
        factor = rope_scaling.factor
        low, high = rope_scaling.low_freq_factor, rope_scaling.high_freq_factor
        old_context = rope_scaling.original_max_position_embeddings
        low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high
        wavelen = 2 * math.pi / inv_freq
        # Long wavelengths (low frequencies) are divided by factor; short ones stay.
        scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        # In between, blend the two smoothly.
        smooth = (old_context / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
        return np.where(is_medium, smoothed, scaled).astype(np.float32)
    raise ValueError(f"unsupported rope_type {rope_scaling.rope_type!r}")


def rope_cos_sin(
    head_dim: int, theta: float, max_positions: int, rope_scaling=None
) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin tables [max_positions, head_dim // 2], float32.

    Computed as transformers does (float32 position times float32 inverse frequency), so the
    numpy engine matches its logits to float32 rounding.
    """
    inv_freq = rope_inv_freq(head_dim, theta, rope_scaling)
    positions = np.arange(max_positions, dtype=np.float32)
    freqs = np.outer(positions, inv_freq).astype(np.float32)
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)
