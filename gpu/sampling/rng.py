"""Counter-based random numbers: u = hash(seed, step, token) -> (0, 1).

A sampler that draws from a stateful generator gives a request different tokens depending on
which other rows shared its batch. Hashing (request seed, index of the token being sampled,
vocabulary id) instead gives every request its own stream, the same on any batch, after a
preemption, and on both backends: the CUDA sampler runs these same integer hashes, so CPU and
GPU draw identical uniforms. The hash is in two levels because the GPU sampler draws a uniform
for every token of a row: the row's 64-bit key (splitmix64's finaliser over seed and step)
once a row, then 32-bit arithmetic a token (lowbias32 over the spread token id and the key).
A 64-bit hash a token cost ~22 instructions plus a slow 64-bit-to-float conversion on sm_90;
this costs ~15 32-bit ones.

Sampling is the Gumbel-max trick: argmax(logit / T + g) with g = -log(-log(u)) is a draw
from softmax(logit / T), in one pass over the logits and with no sort.
"""

from __future__ import annotations

import numpy as np

# Odd 64-bit constants (golden ratio and splitmix64's multipliers) mixing the row's counter.
SEED_MUL = np.uint64(0x9E3779B97F4A7C15)
STEP_MUL = np.uint64(0xD1B54A32D192ED03)
MIX1 = np.uint64(0xBF58476D1CE4E5B9)
MIX2 = np.uint64(0x94D049BB133111EB)
# 32-bit constants for a token inside its row: an odd spread (golden ratio) and lowbias32's
# multipliers (Wellons' hash-prospector: one of the least biased 32-bit integer hashes).
TOKEN_MUL = np.uint32(0x9E3779B1)
LOW1 = np.uint32(0x7FEB352D)
LOW2 = np.uint32(0x846CA68B)


def row_key(seed: np.ndarray, step: np.ndarray) -> np.ndarray:
    """The 64-bit key of a row's draw: splitmix64's finaliser over (seed, step)."""
    with np.errstate(over="ignore"):
        x = seed.astype(np.uint64) * SEED_MUL + step.astype(np.uint64) * STEP_MUL
        x ^= x >> np.uint64(30)
        x *= MIX1
        x ^= x >> np.uint64(27)
        x *= MIX2
        x ^= x >> np.uint64(31)
    return x


def token_hash(key: np.ndarray, token: np.ndarray) -> np.ndarray:
    """32 bits for one token of a keyed row: lowbias32 over (token * TOKEN_MUL) ^ the key's
    low word, plus its high word. A bijection of the token for each key."""
    with np.errstate(over="ignore"):
        x = (token.astype(np.uint32) * TOKEN_MUL) ^ (key & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        x ^= x >> np.uint32(16)
        x *= LOW1
        x ^= x >> np.uint32(15)
        x *= LOW2
        x ^= x >> np.uint32(16)
        return x + (key >> np.uint64(32)).astype(np.uint32)


def uniform_from_counter(seed: np.ndarray, step: np.ndarray, token: np.ndarray) -> np.ndarray:
    """Uniform float32 in (0, 1), broadcasting seed/step/token (uint64 arrays).

    The top 23 bits of the token's hash plus one half, over 2**23: every value, 2**-24 up to
    1 - 2**-24, is exact in float32, so u is never 0 or 1 and the Gumbel noise is always
    finite. (With 24 bits the top value (2**24 - 0.5) / 2**24 needs 25 bits and rounds to 1.0:
    infinite noise that forces its token whatever the logits.)
    """
    x = token_hash(row_key(np.asarray(seed), np.asarray(step)), np.asarray(token))
    u = ((x >> np.uint32(9)).astype(np.float32) + np.float32(0.5)) / np.float32(2**23)
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
