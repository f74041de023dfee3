"""Quantized matrix products on the CPU: out[t, n] (+)= sum_k x[t, k] * w[n, k].

A decode step reads every weight once per token; on a CPU with a few cores it is bound by the
arithmetic of turning weights back into floats as much as by memory. Two formats, both
quantized once at load:
- q8, per-row int8: qs int8 [N, Kp], d float32 [N]: w = d[n] * q (K padded with zeros to a
  multiple of 16). With AVX2, each call rounds the activations to int16 with one scale a token
  (max|x[t]| / 32767: a relative error of 1.5e-5 of the token's largest, far below the
  weights' own) and the dots are exact integer sums in vpmaddwd (int16_dots.py), scaled once
  into float32: [3072, 576] at one token 129 against 157 us for the float product, at eight
  181 against 251. The float product (any CPU): the int8 row converted inside the FMA loop
  (sign-extend, convert, FMA: no scratch row). Either way two rows share each activation load
  and four tokens each weight load (the register block: 2 rows x 4 tokens), and the scale is
  applied once to the finished dot. Perplexity and greedy agreement: BENCHMARKS.md "The CPU
  paths".
- q4, Q4_1 blocks of 32 along K (llama.cpp's): qs uint8 [N, Kp/2], d, m float32 [N, Kp/32]:
  w = d * q + m, q in 0..15 (K padded with zeros to a multiple of 32). Byte j of a block holds
  element j in its low nibble and element j + 16 in its high one (llama.cpp's order), so a
  block's dot is one unit-stride loop over its 16 bytes against x[k0:k0+16] and
  x[k0+16:k0+32]; then out += d_b * dot_b + m_b * xsum_b, with each token's block sums of x
  taken once a call. Two rows share each activation load and four tokens each weight load, as
  in q8 (the block length comes in as an argument, `half`: a constant got the inner loop
  unrolled into scalar code). [3072, 576] at one token: 230-270 us, 2.2-2.7x q8's time: the
  per-block sums cost more than its 25% fewer bytes save, and q8 is the default.

The products run prange over tasks of ROWS_PER_TASK output rows, and ask for the next rows'
bytes while they work on the current ones (prefetch.py: read from DRAM, the products ran at half
their in-cache speed without it).
numpy twins: the `dequantize_*` functions below, then the oracle's float32 matmul (on
int16_activations(x) for the integer q8 product).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from gpu.kernels.cpu.fence import fence
from gpu.kernels.cpu.int16_dots import CHUNK, HAS_PMADDWD, VECTOR, dots_1, dots_2, dots_4
from gpu.kernels.cpu.prefetch import prefetch

QK = 32  # elements per Q4_1 block
HALF = QK // 2
ROWS_PER_TASK = 8  # output rows per parallel work item (even: q8 runs rows in pairs)


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


def quantize_q8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Round to nearest with d = max|w[n]| / 127 per row; the rows are padded to an even
    count with a zero row (the kernel runs rows in pairs and never writes the pad's output)
    and to a multiple of VECTOR columns with zeros (the integer dots read whole vectors)."""
    w = np.asarray(w, dtype=np.float32)
    n, k = w.shape
    w = np.pad(w, ((0, n % 2), (0, -k % VECTOR)))
    d = (np.abs(w).max(axis=1) / np.float32(127)).astype(np.float32)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d > 0)
    return np.ascontiguousarray(np.rint(w * inv[:, None]).astype(np.int8)), d


def dequantize_q8(qs: np.ndarray, d: np.ndarray) -> np.ndarray:
    return qs.astype(np.float32) * d[:, None]


def int16_activations(x: np.ndarray) -> np.ndarray:
    """The activations as the integer q8 product sees them (x rounded to a grid of
    max|x[t]| / 32767 a token): the twin's input where HAS_PMADDWD."""
    x = np.asarray(x, dtype=np.float32)
    s = np.abs(x).max(axis=1, keepdims=True) / np.float32(32767)
    inv = np.divide(np.float32(1), s, out=np.zeros_like(s), where=s > 0)
    return (np.rint(x * inv) * s).astype(np.float32)


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
@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def _put(out, t, n, value, accumulate):  # pragma: no cover - compiled
    """out[t, n] = value, or += value rounded as written (fence.py: never fused with the
    product that made value, whichever pass and caller this is inlined into)."""
    if accumulate:
        out[t, n] = fence(out[t, n] + fence(value))
    else:
        out[t, n] = value


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def _row_pair_dots(w0, w1, s0, s1, x, out, n, both, accumulate):  # pragma: no cover - compiled
    """out[t, n] (+)= s0 * (w0 . x[t]) and out[t, n + 1] (+)= s1 * (w1 . x[t]) (when `both`)
    for every token t: int8 rows converted inside the FMA loop, four tokens a pass, then two,
    then one (each pass a plain unit-stride loop that LLVM vectorises)."""
    t_count, k = x.shape
    t = 0
    while t + 4 <= t_count:
        x0, x1, x2, x3 = x[t], x[t + 1], x[t + 2], x[t + 3]
        a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = np.float32(0.0)
        for j in range(k):
            r, q = np.float32(w0[j]), np.float32(w1[j])
            v0, v1, v2, v3 = x0[j], x1[j], x2[j], x3[j]
            a0 += r * v0
            a1 += r * v1
            a2 += r * v2
            a3 += r * v3
            b0 += q * v0
            b1 += q * v1
            b2 += q * v2
            b3 += q * v3
        _put(out, t, n, a0 * s0, accumulate)
        _put(out, t + 1, n, a1 * s0, accumulate)
        _put(out, t + 2, n, a2 * s0, accumulate)
        _put(out, t + 3, n, a3 * s0, accumulate)
        if both:
            _put(out, t, n + 1, b0 * s1, accumulate)
            _put(out, t + 1, n + 1, b1 * s1, accumulate)
            _put(out, t + 2, n + 1, b2 * s1, accumulate)
            _put(out, t + 3, n + 1, b3 * s1, accumulate)
        t += 4
    if t + 2 <= t_count:
        x0, x1 = x[t], x[t + 1]
        a0 = a1 = b0 = b1 = np.float32(0.0)
        for j in range(k):
            r, q = np.float32(w0[j]), np.float32(w1[j])
            v0, v1 = x0[j], x1[j]
            a0 += r * v0
            a1 += r * v1
            b0 += q * v0
            b1 += q * v1
        _put(out, t, n, a0 * s0, accumulate)
        _put(out, t + 1, n, a1 * s0, accumulate)
        if both:
            _put(out, t, n + 1, b0 * s1, accumulate)
            _put(out, t + 1, n + 1, b1 * s1, accumulate)
        t += 2
    if t < t_count:
        x0 = x[t]
        a0 = b0 = np.float32(0.0)
        for j in range(k):
            v0 = x0[j]
            a0 += np.float32(w0[j]) * v0
            b0 += np.float32(w1[j]) * v0
        _put(out, t, n, a0 * s0, accumulate)
        if both:
            _put(out, t, n + 1, b0 * s1, accumulate)


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def _prefetch_rows(flat, start, stop):  # pragma: no cover - compiled
    """Prefetch the cache lines of flat[start:stop] (a line is 64 bytes)."""
    stop = min(stop, flat.shape[0])
    step = 64 // flat.itemsize
    for i in range(start, stop, step):
        prefetch(flat, i)
    if stop > start:
        prefetch(flat, stop - 1)


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def q8_float_rows(x, qs, d, out, lo, hi, accumulate):  # pragma: no cover - compiled
    """Rows lo..hi - 1 (lo even) of gemm_q8_float's product, on the calling thread."""
    n_rows = out.shape[1]
    k = qs.shape[1]
    flat = qs.reshape(-1)
    for n in range(lo, hi, 2):
        _prefetch_rows(flat, (n + 2) * k, (n + 4) * k)
        both = n + 1 < n_rows
        _row_pair_dots(qs[n], qs[n + 1], d[n], d[n + 1], x, out, n, both, accumulate)


@njit(parallel=True, fastmath=True, cache=True, nogil=True, error_model="numpy")
def gemm_q8_float(x, qs, d, out, accumulate):  # pragma: no cover - compiled
    """out[t, n] (+)= x[t] . dequantize_q8(qs, d)[n] for x [T, K] float32 and n < out.shape[1]
    (qs may hold one zero pad row more, and zero pad columns: quantize_q8)."""
    n_rows = out.shape[1]
    tasks = (n_rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    for task in prange(tasks):
        lo = task * ROWS_PER_TASK
        q8_float_rows(x, qs, d, out, lo, min(n_rows, lo + ROWS_PER_TASK), accumulate)


@njit(fastmath=False, cache=True, nogil=True, error_model="numpy")
def int16_round(x, xq, sx):  # pragma: no cover - compiled
    """x [T, K] -> xq int16 [T, >= K] (zeros past K) and the scales sx [T]: x[t] ~ sx[t] *
    xq[t], rounded as int16_activations rounds (IEEE arithmetic: no fastmath)."""
    t_count, k = x.shape
    for t in range(t_count):
        amax = np.float32(0.0)
        for j in range(k):
            amax = max(amax, abs(x[t, j]))
        sx[t] = np.float32(0.0)
        if amax > 0:
            sx[t] = amax / np.float32(32767.0)
            inv = np.float32(1.0) / sx[t]
            for j in range(k):
                xq[t, j] = np.int16(np.rint(x[t, j] * inv))
        else:
            for j in range(k):
                xq[t, j] = 0
        for j in range(k, xq.shape[1]):
            xq[t, j] = 0


@njit(fastmath=False, cache=True, nogil=True, error_model="numpy")
def _int16_activations(x, kp):  # pragma: no cover - compiled
    """int16_round into new arrays of kp columns. Serial, apart from the parallel product
    (there np.empty would be a parallel loop of its own)."""
    xq = np.empty((x.shape[0], kp), np.int16)
    sx = np.empty(x.shape[0], np.float32)
    int16_round(x, xq, sx)
    return xq, sx


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def _add(total, chunk):  # pragma: no cover - compiled
    """A chunk's dot added to the running sum, rounded as written (fence.py)."""
    return fence(total + chunk)


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def _scaled(dot, s, sx):  # pragma: no cover - compiled
    """dot * s * sx, left to right, each product rounded as written (fence.py)."""
    return fence(fence(dot * s) * sx)


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def _int16_pair_dots(qs, d, xq, sx, out, n, both, accumulate):  # pragma: no cover - compiled
    """out[t, n] (+)= rows n and n + 1 (when `both`) of the int8 weights . the int16
    activations, scaled: four tokens a pass, then two, then one, each over stretches of CHUNK
    elements (int16_dots.py) added in float32. The integer dots are exact and every float step
    is fenced (fence.py), so each pass rounds a token's sum alike: its result does not depend
    on the batch around it (the cpu backend's batch invariance)."""
    t_count = xq.shape[0]
    vectors, step = qs.shape[1] // VECTOR, CHUNK // VECTOR
    s0, s1 = d[n], d[n + 1]
    t = 0
    while t + 4 <= t_count:
        a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = np.float32(0.0)
        for c in range(0, vectors, step):
            i0, i1, i2, i3, j0, j1, j2, j3 = dots_4(qs, xq, n, t, c, min(vectors, c + step))
            a0 = _add(a0, i0)
            a1 = _add(a1, i1)
            a2 = _add(a2, i2)
            a3 = _add(a3, i3)
            b0 = _add(b0, j0)
            b1 = _add(b1, j1)
            b2 = _add(b2, j2)
            b3 = _add(b3, j3)
        _put(out, t, n, _scaled(a0, s0, sx[t]), accumulate)
        _put(out, t + 1, n, _scaled(a1, s0, sx[t + 1]), accumulate)
        _put(out, t + 2, n, _scaled(a2, s0, sx[t + 2]), accumulate)
        _put(out, t + 3, n, _scaled(a3, s0, sx[t + 3]), accumulate)
        if both:
            _put(out, t, n + 1, _scaled(b0, s1, sx[t]), accumulate)
            _put(out, t + 1, n + 1, _scaled(b1, s1, sx[t + 1]), accumulate)
            _put(out, t + 2, n + 1, _scaled(b2, s1, sx[t + 2]), accumulate)
            _put(out, t + 3, n + 1, _scaled(b3, s1, sx[t + 3]), accumulate)
        t += 4
    if t + 2 <= t_count:
        a0 = a1 = b0 = b1 = np.float32(0.0)
        for c in range(0, vectors, step):
            i0, i1, j0, j1 = dots_2(qs, xq, n, t, c, min(vectors, c + step))
            a0 = _add(a0, i0)
            a1 = _add(a1, i1)
            b0 = _add(b0, j0)
            b1 = _add(b1, j1)
        _put(out, t, n, _scaled(a0, s0, sx[t]), accumulate)
        _put(out, t + 1, n, _scaled(a1, s0, sx[t + 1]), accumulate)
        if both:
            _put(out, t, n + 1, _scaled(b0, s1, sx[t]), accumulate)
            _put(out, t + 1, n + 1, _scaled(b1, s1, sx[t + 1]), accumulate)
        t += 2
    if t < t_count:
        a0 = b0 = np.float32(0.0)
        for c in range(0, vectors, step):
            i0, j0 = dots_1(qs, xq, n, t, c, min(vectors, c + step))
            a0 = _add(a0, i0)
            b0 = _add(b0, j0)
        _put(out, t, n, _scaled(a0, s0, sx[t]), accumulate)
        if both:
            _put(out, t, n + 1, _scaled(b0, s1, sx[t]), accumulate)


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def q8_int16_rows(xq, sx, qs, d, out, lo, hi, accumulate):  # pragma: no cover - compiled
    """Rows lo..hi - 1 (lo even) of gemm_q8_int16's product on the rounded activations
    (int16_round), on the calling thread."""
    n_rows = out.shape[1]
    k = qs.shape[1]
    flat = qs.reshape(-1)
    for n in range(lo, hi, 2):
        _prefetch_rows(flat, (n + 2) * k, (n + 4) * k)
        _int16_pair_dots(qs, d, xq, sx, out, n, n + 1 < n_rows, accumulate)


@njit(parallel=True, fastmath=True, cache=True, nogil=True, error_model="numpy")
def gemm_q8_int16(x, qs, d, out, accumulate):  # pragma: no cover - compiled
    """gemm_q8_float's product on int16_activations(x): exact integer dots (AVX2 only)."""
    n_rows = out.shape[1]
    xq, sx = _int16_activations(x, qs.shape[1])
    tasks = (n_rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    for task in prange(tasks):
        lo = task * ROWS_PER_TASK
        q8_int16_rows(xq, sx, qs, d, out, lo, min(n_rows, lo + ROWS_PER_TASK), accumulate)


# out[t, n] (+)= x[t] . dequantize_q8(qs, d)[n]: the integer product where the CPU has it.
gemm_q8 = gemm_q8_int16 if HAS_PMADDWD else gemm_q8_float


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def _q4_1_pair_dots(
    w0, w1, d0, d1, m0, m1, x, xs, out, n, both, accumulate, half
):  # pragma: no cover - compiled
    """out[t, n] (+)= the Q4_1 row (w0, d0, m0) . x[t], and row n + 1 (w1, ...) when `both`,
    for every token t: block by block, four tokens a pass, then one; xs[t, b] is the sum of
    x[t]'s block b (x zero-padded to whole blocks)."""
    t_count = x.shape[0]
    qk = 2 * half
    t = 0
    while t + 4 <= t_count:
        x0, x1, x2, x3 = x[t], x[t + 1], x[t + 2], x[t + 3]
        s0 = s1 = s2 = s3 = r0 = r1 = r2 = r3 = np.float32(0.0)
        for b in range(d0.shape[0]):
            k0, p0 = b * qk, b * half
            a0 = a1 = a2 = a3 = c0 = c1 = c2 = c3 = np.float32(0.0)
            for j in range(half):
                u, v = w0[p0 + j], w1[p0 + j]
                lu, hu = np.float32(u & 15), np.float32(u >> 4)
                lv, hv = np.float32(v & 15), np.float32(v >> 4)
                e, f = x0[k0 + j], x0[k0 + half + j]
                a0 += lu * e + hu * f
                c0 += lv * e + hv * f
                e, f = x1[k0 + j], x1[k0 + half + j]
                a1 += lu * e + hu * f
                c1 += lv * e + hv * f
                e, f = x2[k0 + j], x2[k0 + half + j]
                a2 += lu * e + hu * f
                c2 += lv * e + hv * f
                e, f = x3[k0 + j], x3[k0 + half + j]
                a3 += lu * e + hu * f
                c3 += lv * e + hv * f
            da, ma, dc, mc = d0[b], m0[b], d1[b], m1[b]
            s0 += da * a0 + ma * xs[t, b]
            s1 += da * a1 + ma * xs[t + 1, b]
            s2 += da * a2 + ma * xs[t + 2, b]
            s3 += da * a3 + ma * xs[t + 3, b]
            r0 += dc * c0 + mc * xs[t, b]
            r1 += dc * c1 + mc * xs[t + 1, b]
            r2 += dc * c2 + mc * xs[t + 2, b]
            r3 += dc * c3 + mc * xs[t + 3, b]
        _put(out, t, n, s0, accumulate)
        _put(out, t + 1, n, s1, accumulate)
        _put(out, t + 2, n, s2, accumulate)
        _put(out, t + 3, n, s3, accumulate)
        if both:
            _put(out, t, n + 1, r0, accumulate)
            _put(out, t + 1, n + 1, r1, accumulate)
            _put(out, t + 2, n + 1, r2, accumulate)
            _put(out, t + 3, n + 1, r3, accumulate)
        t += 4
    while t < t_count:
        x0 = x[t]
        s0 = r0 = np.float32(0.0)
        for b in range(d0.shape[0]):
            k0, p0 = b * qk, b * half
            a0 = c0 = np.float32(0.0)
            for j in range(half):
                u, v = w0[p0 + j], w1[p0 + j]
                e, f = x0[k0 + j], x0[k0 + half + j]
                a0 += np.float32(u & 15) * e + np.float32(u >> 4) * f
                c0 += np.float32(v & 15) * e + np.float32(v >> 4) * f
            s0 += d0[b] * a0 + m0[b] * xs[t, b]
            r0 += d1[b] * c0 + m1[b] * xs[t, b]
        _put(out, t, n, s0, accumulate)
        if both:
            _put(out, t, n + 1, r0, accumulate)
        t += 1


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def _block_sums(x, nb, half):  # pragma: no cover - compiled
    """x zero-padded to nb whole blocks, and the sum of each token's blocks. Serial, and apart
    from the parallel product: there, numpy calls become parallel loops of their own."""
    t_count, k = x.shape
    qk = 2 * half
    xp = x
    if k != nb * qk:  # the last block's missing elements meet zeros
        xp = np.zeros((t_count, nb * qk), np.float32)
        for t in range(t_count):  # loops: a slice assignment took 4 s to compile
            for j in range(k):
                xp[t, j] = x[t, j]
    xs = np.zeros((t_count, nb), np.float32)
    for t in range(t_count):
        for b in range(nb):
            acc = np.float32(0.0)
            for j in range(b * qk, (b + 1) * qk):
                acc += xp[t, j]
            xs[t, b] = acc
    return xp, xs


@njit(parallel=True, fastmath=True, cache=True, nogil=True, error_model="numpy")
def gemm_q4_1(x, qs, d, m, out, accumulate, half):  # pragma: no cover - compiled
    """out[t, n] (+)= x[t] . dequantize_q4_1(qs, d, m)[n][:K] for x [T, K] float32; `half`
    is half a block (HALF)."""
    n_rows = d.shape[0]
    xp, xs = _block_sums(x, d.shape[1], half)
    row_bytes = qs.shape[1]
    flat = qs.reshape(-1)
    tasks = (n_rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    for task in prange(tasks):
        for n in range(task * ROWS_PER_TASK, min(n_rows, (task + 1) * ROWS_PER_TASK), 2):
            _prefetch_rows(flat, (n + 2) * row_bytes, (n + 4) * row_bytes)
            both = n + 1 < n_rows
            n1 = n + 1 if both else n  # an odd last row is read twice, its pair never written
            _q4_1_pair_dots(
                qs[n], qs[n1], d[n], d[n1], m[n], m[n1], xp, xs, out, n, both, accumulate, half
            )
