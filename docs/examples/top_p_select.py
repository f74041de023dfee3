"""Top-p without a sort: the GPU sampler's way, in numpy, checked against the sorting twin.

The numpy twin (gpu/sampling/numpy_sampler.py) sorts the row's probabilities and walks the
cumulative mass until it reaches top_p. A kernel spread over many blocks cannot sort a
128,256-token row cheaply, so the CUDA sampler finds the same threshold with histograms:

1. Masses in fixed point. Each kept score s contributes exp(s - max) rounded to an integer
   number of 2**-44 units. Integer sums are exact whatever the order the blocks add them in,
   so every run, batch and block count decides the cut the same way.
2. The cut bin on a linear scale (gpu/kernels/sampling_linear.py). BINS bins of 1/SCALE each
   below the row's max: a higher score, a higher bin. Summing the bins' masses from the top
   finds bin B where the mass reaches top_p of the total. Every score above B is in the
   nucleus whatever happens inside B.
3. The exact cut by radix select (gpu/kernels/sampling_radix.py) over the scores of bins B
   and B - 1, copied out: their order-preserving 32-bit keys (a float's bits, the sign bit
   set for non-negative values, all bits flipped for negative ones) in three digits of 11, 11
   and 10 bits. Each digit's histogram of masses picks the bin where the running mass reaches
   what is still needed, and fixes those bits of the key. After three digits the key is one
   score: the cut. Everything whose probability is at least the cut's is kept, ties too.

The last part draws the token as the kernels do: Gumbel-max, argmax(s + g) with
g = -log(-log(u)) and u a hash of (seed, step, token) (gpu/sampling/rng.py), which is a draw
from softmax(s): checked here by counting 20,000 draws.

    python docs/examples/top_p_select.py
"""

from __future__ import annotations

import numpy as np

from gpu.sampling.numpy_sampler import top_p_threshold
from gpu.sampling.rng import gumbel_noise

MASS_SCALE = 2.0**44  # the kernels' fixed-point unit
BINS = 2048  # the linear histogram's bins
SCALE = (BINS - 1) / 24.0  # bins per unit of score: the top 24 units get bins of their own
DIGITS = ((21, 11), (10, 11), (0, 10))  # (shift, bits) of the key's three radix digits


def ordered_key(s: np.ndarray) -> np.ndarray:
    """uint32 keys that order as the float32 scores do (gpu/kernels/bf16.py:ordered_key)."""
    bits = s.astype(np.float32).view(np.uint32)
    return np.where(bits >> 31 == 1, ~bits, bits | np.uint32(0x80000000)).astype(np.int64)


def fixed_point(s: np.ndarray, top: float) -> np.ndarray:
    """exp(s - top) in float32 (the kernel's expf), then in integer units of 2**-44."""
    e = np.exp((s - np.float32(top)).astype(np.float32))
    return np.floor(e.astype(np.float64) * MASS_SCALE + 0.5).astype(np.int64)


def first_bin_reaching(hist: np.ndarray, remain: int) -> tuple[int, int]:
    """(the bin where the mass summed from the top bin down reaches remain, the mass of the
    bins above it)."""
    cumulative = np.cumsum(hist[::-1])
    j = int(np.searchsorted(cumulative, remain, side="left"))
    return len(hist) - 1 - j, int(cumulative[j - 1]) if j else 0


def top_p_cut(s: np.ndarray, top_p: float) -> float:
    """The smallest kept score of the top-p nucleus, found as the kernels find it."""
    top = float(s.max())
    mass = fixed_point(s, top)
    total = int(mass.sum())
    remain = max(int(np.ceil(top_p * total)), 1)
    # 2. The cut bin on the linear scale.
    d = (np.float32(top) - s) * np.float32(SCALE)
    b = np.where(d >= BINS - 1, 0, BINS - 1 - d.astype(np.int64))
    linear = np.zeros(BINS, np.int64)
    np.add.at(linear, b, mass)
    cut_bin, above = first_bin_reaching(linear, remain)
    remain -= above
    # 3. Radix select over the copy of bins cut_bin and cut_bin - 1.
    copy = (b == cut_bin) | (b == cut_bin - 1)
    keys, masses = ordered_key(s[copy]), mass[copy]
    prefix, mask = 0, 0
    for shift, bits in DIGITS:
        match = (keys & mask) == prefix
        hist = np.zeros(1 << bits, np.int64)
        np.add.at(hist, (keys[match] >> shift) & ((1 << bits) - 1), masses[match])
        digit, above = first_bin_reaching(hist, remain)
        remain -= above
        prefix |= digit << shift
        mask |= ((1 << bits) - 1) << shift
    return float(s[copy][keys == prefix][0])


def main() -> None:
    rng = np.random.default_rng(0)
    vocab, top_p = 49_152, 0.9
    # Flat rows (random weights: half the vocabulary in the nucleus) and peaked ones.
    for spread in (1.3, 4.0):
        s = (rng.standard_normal(vocab) * spread).astype(np.float32)
        cut = top_p_cut(s, top_p)
        kept = s >= cut
        probs = np.exp(s - s.max()).astype(np.float32)
        probs /= probs.sum()
        twin = probs >= top_p_threshold(probs, top_p)
        assert np.array_equal(kept, twin), (int(kept.sum()), int(twin.sum()))
        print(f"spread {spread}: the nucleus is {int(kept.sum()):,} of {vocab:,} tokens, "
              f"the same set as the sorting twin's")  # fmt: skip

    # Gumbel-max draws from softmax: argmax(s + g), a fresh g per step.
    s = np.array([2.0, 1.0, 0.5, 0.0, -1.0, -3.0], np.float32)
    draws = 20_000
    counts = np.bincount(
        [int(np.argmax(s + gumbel_noise(7, step, len(s)))) for step in range(draws)],
        minlength=len(s),
    )
    softmax = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
    assert np.abs(counts / draws - softmax).max() < 0.01, (counts / draws, softmax)
    print(f"Gumbel-max over {draws:,} steps: frequencies {np.round(counts / draws, 3)} "
          f"against softmax {np.round(softmax, 3)}")  # fmt: skip


if __name__ == "__main__":
    main()
