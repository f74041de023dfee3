"""Online softmax: attention over a context read once, tile by tile, in numpy.

softmax(s) @ V needs the maximum and the sum of exp over the whole row before the first weight
is known. A kernel that streams K and V from memory cannot keep the row; it keeps three running
values instead, the maximum m, the sum of exponentials `total` and the weighted sum acc, and
rescales the last two whenever a tile raises the maximum. Split-KV (flash-decoding) runs that
loop on several pieces of the context at once and merges the pieces' (m, total, acc) the same
way. The decode attention kernels do both (gpu/kernels/attention_decode.py), with exp2 and the
scores pre-multiplied by log2(e); this script does it in float64 numpy and checks it against
the direct formula.

    python docs/examples/online_softmax.py
"""

from __future__ import annotations

import numpy as np


def direct(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """softmax(q . K^T * scale) @ V with the whole row of scores in memory."""
    s = k @ q * scale
    p = np.exp(s - s.max())
    return p @ v / p.sum()


def online_pass(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, tile: int
) -> tuple[float, float, np.ndarray]:
    """One walk over the context, `tile` tokens at a time: the unnormalised (m, total, acc)."""
    m, total, acc = -np.inf, 0.0, np.zeros(v.shape[1])
    for start in range(0, len(k), tile):
        s = k[start : start + tile] @ q * scale
        m_new = max(m, float(s.max()))
        correction = np.exp(m - m_new)  # rescale what was summed under the old maximum
        p = np.exp(s - m_new)
        total = total * correction + p.sum()
        acc = acc * correction + p @ v[start : start + tile]
        m = m_new
    return m, total, acc


def split_kv(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, splits: int, tile: int):
    """Each split walks its own piece of the context; the merge weighs each piece by
    exp(m_s - M), M the largest m_s, exactly as the kernel's last block does."""
    pieces = [
        online_pass(q, ks, vs, scale, tile)
        for ks, vs in zip(np.array_split(k, splits), np.array_split(v, splits), strict=True)
    ]
    big_m = max(m for m, _, _ in pieces)
    weights = [np.exp(m - big_m) for m, _, _ in pieces]
    total = sum(w * l_s for w, (_, l_s, _) in zip(weights, pieces, strict=True))
    acc = sum(w * a for w, (_, _, a) in zip(weights, pieces, strict=True))
    return acc / total


def main() -> None:
    rng = np.random.default_rng(0)
    context, head_dim = 1000, 64
    q = rng.standard_normal(head_dim)
    k = rng.standard_normal((context, head_dim)) * 3.0  # large scores: the max matters
    v = rng.standard_normal((context, head_dim))
    scale = head_dim**-0.5

    want = direct(q, k, v, scale)
    m, total, acc = online_pass(q, k, v, scale, tile=64)
    streamed = acc / total
    merged = split_kv(q, k, v, scale, splits=7, tile=64)
    for name, got in (("one pass, 64-token tiles", streamed), ("7 splits, merged", merged)):
        err = float(np.abs(got - want).max())
        assert err < 1e-12, (name, err)
        print(f"{name:26s} max |error| vs the direct softmax: {err:.1e}")


if __name__ == "__main__":
    main()
