"""Counter-based random numbers: u = hash(seed, step, token) -> (0, 1).

A sampler that draws from a stateful generator gives a request different tokens depending on
which other rows shared its batch. Hashing (request seed, index of the token being sampled,
vocabulary id) instead gives every request its own stream, the same on any batch, after a
preemption, and on both backends: the CUDA sampler runs this same integer hash (splitmix64's
finaliser), so CPU and GPU draw identical uniforms. Sampling is the Gumbel-max trick:
argmax(logit / T + g) with g = -log(-log(u)) is a draw from softmax(logit / T), in one pass
over the logits and with no sort.
"""

from __future__ import annotations

import numpy as np

# Odd 64-bit constants (golden ratio and splitmix64's multipliers) mixing the three inputs.
SEED_MUL = np.uint64(0x9E3779B97F4A7C15)
STEP_MUL = np.uint64(0xD1B54A32D192ED03)
TOKEN_MUL = np.uint64(0x8CB92BA72F3D8DD7)
MIX1 = np.uint64(0xBF58476D1CE4E5B9)
MIX2 = np.uint64(0x94D049BB133111EB)


def uniform_from_counter(seed: np.ndarray, step: np.ndarray, token: np.ndarray) -> np.ndarray:
    """Uniform float32 in (0, 1), broadcasting seed/step/token (uint64 arrays).

    The top 23 bits of the hash plus one half, over 2**23: every value, 2**-24 up to
    1 - 2**-24, is exact in float32, so u is never 0 or 1 and the Gumbel noise is always
    finite. (With 24 bits the top value (2**24 - 0.5) / 2**24 needs 25 bits and rounds to 1.0:
    infinite noise that forces its token whatever the logits.)
    """
    with np.errstate(over="ignore"):
        x = (
            seed.astype(np.uint64) * SEED_MUL
            + step.astype(np.uint64) * STEP_MUL
            + token.astype(np.uint64) * TOKEN_MUL
        )
        x ^= x >> np.uint64(30)
        x *= MIX1
        x ^= x >> np.uint64(27)
        x *= MIX2
        x ^= x >> np.uint64(31)
    u = ((x >> np.uint64(41)).astype(np.float32) + np.float32(0.5)) / np.float32(2**23)
    return u.astype(np.float32)


def gumbel_noise(seed: int, step: int, vocab_size: int) -> np.ndarray:
    """Gumbel(0, 1) noise for one row: -log(-log(u)), float32 [vocab_size]."""
    u = uniform_from_counter(
        np.array([seed], dtype=np.uint64),
        np.array([step], dtype=np.uint64),
        np.arange(vocab_size, dtype=np.uint64),
    )
    return -np.log(-np.log(u))


def gumbel_noise_at(seed: int, step: int, token_ids: np.ndarray) -> np.ndarray:
    """gumbel_noise(seed, step, V)[token_ids], drawing only those."""
    u = uniform_from_counter(
        np.array([seed], dtype=np.uint64),
        np.array([step], dtype=np.uint64),
        np.asarray(token_ids, dtype=np.uint64),
    )
    return -np.log(-np.log(u))
