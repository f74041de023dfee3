"""Block-quantized matrix products on the CPU: out[t, n] (+)= sum_k x[t, k] * w[n, k].

A decode step reads every weight once per token, so on a CPU it is bound by memory bandwidth:
the float32 oracle reads 4 bytes per weight, Q8_0 1.06, Q4_1 0.63. The weights are quantized
once at load in blocks of 32 along K (llama.cpp's Q8_0 and Q4_1 formats) and dequantized in
registers; the activations stay float32. Quantizing the activations to int8 as llama.cpp does
measured slower here: LLVM turns Numba's int8 dot products into sign-extends and per-block
horizontal sums, not AVX2's maddubs, so the integer path lost to the float one at every shape.

The products run prange over tasks of ROWS_PER_TASK output rows. Each row is dequantized into
a float32 scratch row that stays in L1, then dotted with every token's activations: batch N
reads the weights once, as batch 1 does, and both loops are plain unit-stride loops that LLVM
vectorises (measured faster than accumulating per block, or into 32 float lanes, whose
constant-length inner loops LLVM unrolled into scalar or gathering code). The block length
comes in as an argument (`qk`) for the same reason: a constant 32 gets the loop unrolled.

Layouts (K padded with zeros to a multiple of 32):
- Q8_0: qs int8 [N, Kp], d float32 [N, Kp/32]: w = d * q.
- Q4_1: qs uint8 [N, Kp/2], d, m float32 [N, Kp/32]: w = d * q + m, q in 0..15. Byte j of a
  block holds element j in its low nibble and element j + 16 in its high one (llama.cpp's
  order).
numpy twins: the `dequantize_*` functions below, then the oracle's float32 matmul.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

QK = 32  # elements per quantization block
HALF = QK // 2
ROWS_PER_TASK = 8  # output rows per parallel work item


def padded_k(k: int) -> int:
    return -(-k // QK) * QK


# --- weights: quantized once at load; numpy, and the twins of the kernels' dequantization ----
def _blocks(w: np.ndarray) -> np.ndarray:
    """w [N, K] -> float32 [N, Kp/32, 32], zero-padded along K."""
    w = np.asarray(w, dtype=np.float32)
    n, k = w.shape
    kp = padded_k(k)
    if kp != k:
        w = np.concatenate([w, np.zeros((n, kp - k), np.float32)], axis=1)
    return np.ascontiguousarray(w).reshape(n, kp // QK, QK)


def quantize_q8_0(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Round to nearest with d = max|w| / 127 per block (llama.cpp's Q8_0)."""
    b = _blocks(w)
    d = (np.abs(b).max(axis=-1) / np.float32(127)).astype(np.float32)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d > 0)
    q = np.rint(b * inv[..., None]).astype(np.int8)
    return q.reshape(b.shape[0], -1), d


def dequantize_q8_0(qs: np.ndarray, d: np.ndarray) -> np.ndarray:
    n = qs.shape[0]
    return (qs.reshape(n, -1, QK).astype(np.float32) * d[..., None]).reshape(n, -1)


def quantize_q4_1(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """16 levels from each block's min to its max (llama.cpp's Q4_1): a weight that came from a
    Q4_1 GGUF with the same blocks lands back on its own grid."""
    b = _blocks(w)
    lo, hi = b.min(axis=-1), b.max(axis=-1)
    d = ((hi - lo) / np.float32(15)).astype(np.float32)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d > 0)
    q = np.clip(np.rint((b - lo[..., None]) * inv[..., None]), 0, 15).astype(np.uint8)
    packed = q[..., :HALF] | (q[..., HALF:] << 4)
    return packed.reshape(b.shape[0], -1), d, lo.astype(np.float32)


def dequantize_q4_1(qs: np.ndarray, d: np.ndarray, m: np.ndarray) -> np.ndarray:
    n = qs.shape[0]
    p = qs.reshape(n, -1, HALF)
    q = np.concatenate([p & 0xF, p >> 4], axis=-1).astype(np.float32)
    return (q * d[..., None] + m[..., None]).reshape(n, -1)


# --- the products ----------------------------------------------------------------------------
@njit(fastmath=True, cache=True, nogil=True)
def _put(out, t, n, value, accumulate):  # pragma: no cover - compiled
    if accumulate:
        out[t, n] += value
    else:
        out[t, n] = value


@njit(fastmath=True, cache=True, nogil=True)
def _dots(row, x, out, n, accumulate):  # pragma: no cover - compiled
    """out[t, n] (+)= row[:K] . x[t] for every token t: vectorised float32 reductions, four
    tokens per pass over the row (each load of it serves four; 25-30% faster at 8 tokens)."""
    t_count, k = x.shape
    t = 0
    while t + 4 <= t_count:
        x0, x1, x2, x3 = x[t], x[t + 1], x[t + 2], x[t + 3]
        a0 = a1 = a2 = a3 = np.float32(0.0)
        for j in range(k):
            r = row[j]
            a0 += r * x0[j]
            a1 += r * x1[j]
            a2 += r * x2[j]
            a3 += r * x3[j]
        _put(out, t, n, a0, accumulate)
        _put(out, t + 1, n, a1, accumulate)
        _put(out, t + 2, n, a2, accumulate)
        _put(out, t + 3, n, a3, accumulate)
        t += 4
    while t < t_count:
        xr = x[t]
        acc = np.float32(0.0)
        for j in range(k):
            acc += row[j] * xr[j]
        _put(out, t, n, acc, accumulate)
        t += 1


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def gemm_q8_0(x, qs, d, out, accumulate, qk):  # pragma: no cover - compiled
    """out[t, n] (+)= x[t] . dequantize_q8_0(qs, d)[n][:K] for x [T, K] float32 (qk = QK)."""
    n_rows, nb = d.shape
    tasks = (n_rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    for task in prange(tasks):
        row = np.empty(nb * qk, np.float32)
        for n in range(task * ROWS_PER_TASK, min(n_rows, (task + 1) * ROWS_PER_TASK)):
            wq, wd = qs[n], d[n]
            for b in range(nb):
                s, k0 = wd[b], b * qk
                for i in range(qk):
                    row[k0 + i] = s * np.float32(wq[k0 + i])
            _dots(row, x, out, n, accumulate)


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def gemm_q4_1(x, qs, d, m, out, accumulate, qk):  # pragma: no cover - compiled
    """out[t, n] (+)= x[t] . dequantize_q4_1(qs, d, m)[n][:K] for x [T, K] float32."""
    n_rows, nb = d.shape
    half = qk // 2
    tasks = (n_rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    for task in prange(tasks):
        row = np.empty(nb * qk, np.float32)
        for n in range(task * ROWS_PER_TASK, min(n_rows, (task + 1) * ROWS_PER_TASK)):
            wq, wd, wm = qs[n], d[n], m[n]
            for b in range(nb):
                s, o, k0, p0 = wd[b], wm[b], b * qk, b * half
                for i in range(half):
                    byte = wq[p0 + i]
                    row[k0 + i] = s * np.float32(byte & 0xF) + o
                    row[k0 + half + i] = s * np.float32(byte >> 4) + o
            _dots(row, x, out, n, accumulate)
