"""Matrix-vector products for decode steps, with the ops around them fused in.

A decode step of a few sequences multiplies a handful of rows by every weight matrix: at batch 1
each bf16 weight is read once and used for one multiply-add. That is pure weight streaming, and
the matrices of a 1B model are small (3-67 MB): cuBLAS, built for tiles of a large product,
streamed them at 1.4-3.5 TB/s on the H200 against a 4.3 TB/s copy rate, and every op around a
product (the RMSNorm before it, the SiLU or residual add after it) was a kernel of its own. This
kernel streams the weights and does the small ops on the way in and out:

    prologue "none":     x = the bf16 input rows
    prologue "rmsnorm":  x = rmsnorm(residual) * norm_weight, computed by every block
    epilogue "store":    out[t, n] = x[t] . w[n]                (float32)
    epilogue "add":      out[t, n] += x[t] . w[n]               (out is the residual stream)
    epilogue "silu":     out[t, i] = silu(g) * u, g = bf16(x[t] . w[i]), u = bf16(x[t] . w[I + i])
                         (bf16 out; w = [gate; up]; g and u rounded as cuBLAS's bf16 product is)
    epilogue "rope":     out = qkv with q and k rotated, and k, v written to the paged KV cache

Shape of the work:

* One block computes `rows` output rows for all T (<= max_tokens) tokens. Its threads stride
  over K together: thread `tid` owns the 8-byte words (four bf16) tid, tid + nthreads, ... of
  every one of its rows (a warp's load covers 256 contiguous bytes), so each weight byte is read
  by exactly one thread and x is read (or normalised) once per block, then reused for all rows.
* K is a compile-time constant (the kernel is built per shape by a factory, like the decode
  attention): every loop has a constant trip count, so the rows x words-per-thread weight words
  of a thread are loaded into registers up front, all in flight before the first is used, and
  the per-thread arrays never spill to local memory.
* The T x rows partial dot products of a thread are summed over the warp with xor shuffles and
  over the block's warps through shared memory, in a fixed order: the result does not depend on
  timing. The first T x rows threads apply the epilogue.
* RMSNorm prologue: the block reads the T residual rows (8 KB a row for a 2048-wide model, from
  L2), reduces the sum of squares per token, and rounds x / rms * weight to bf16 in registers:
  the same values the separate rmsnorm kernel writes for cuBLAS. Its weight loads (and the
  norm's weights) are issued before the reduction, so they overlap it. Recomputing the norm in
  each block costs L2 reads; it saves a launch and a dependent kernel per use, which is what a
  decode step is made of.
* Programmatic dependent launch (pdl.py): the weight loads (and the rope epilogue's position,
  cos / sin and slot: staged inputs and constants) come before grid_dependency_sync,
  everything that reads the previous kernel's output after it. In a batch-1 graph, whose edges
  are programmatic, the next product's weights are thus on their way while the kernel before
  it drains (968 -> 1,033 tok/s at batch 1, with the norm weights' preload).
* The epilogue's loads go out with the weights' (the residual an "add" adds to; the position's
  cos / sin and the KV slot of "rope"): at the end a block then only computes and stores,
  instead of waiting one more round trip (or two: position, then its cos) after its sums.
* Paired epilogues: with "silu" a block takes rows/2 gate rows and the matching up rows, so
  both halves of each output meet in one block and gate_up never goes to memory. With "rope" it
  takes rows/2 rotation pairs of the merged qkv projection (dimension j and j + head_dim/2 of a
  q or k head; two neighbouring dimensions of v), rotates them with the position's cos/sin, and
  writes q to qkv and k, v to the cache at slot_mapping, as rope_kv.py does after cuBLAS.

Measured on the H200 at one token (tests/device/bench_gemv.py, cold weights): Llama-3.2-1B's
qkv 9.1 us (cuBLAS 9.5), o_proj 7.4 (9.2), gate_up 22.9 (21.4), down 13.3 (16.0), LM head
123.6 (127.1; 4.25 TB/s). The small matrices are latency-bound, not bandwidth-bound (a kernel
costs ~5 us however small), so the gain is mostly the launches fused away: a batch-1 step went
from 1.67 to 1.39 ms. At 4-8 tokens the kernel loses to cuBLAS, so the backend sends it only
single-token steps (DECODE_TOKENS); steps of 2-8 tokens go to the tensor-core twin of this
kernel, gemv_mma.py.

Loading further ahead does not pay here. The sm_90 builds (ptxas -v): qkv and gate_up 72
registers x 256 threads (3 blocks an SM), down 100 (2), o_proj 32 (8). In an H100 trace qkv's
first blocks already start 7.5 us before down ends, and down streams at the copy rate, so
bytes loaded beside it only slow it; and the largest shared-memory carveout, which a block
staging its rows in shared memory would need, costs gate_up and down ~1 us each (906 -> 870
tok/s). What is left at batch 1 is latency between dependent steps (the norm's reduction,
attention's ~8 us a layer), not streaming.

numpy twins: CpuBackend.linear, rmsnorm_linear, linear_residual, rmsnorm_gate_up_silu and
rmsnorm_qkv_rope (gpu/backends/cpu.py and ComposedOps in gpu/backends/base.py).
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import numpy as np
from numba import cuda, float32, uint64

from gpu.kernels.activation import silu_of_products
from gpu.kernels.bf16 import bf16_of_word, bf16_to_f32, f32_to_bf16
from gpu.kernels.launch import SIMULATOR, cdiv, device_function, threads
from gpu.kernels.pdl import grid_dependency_sync

MAX_TOKENS = 8  # the largest step the kernel is built for
# The largest step the backend sends here. Measured on the H200 (tests/device/bench_gemv.py):
# at one token the kernel matches or beats cuBLAS on every Llama-3.2-1B matrix and saves the
# launches it fuses; at 4 and 8 tokens the norm-prologue variants fall to 0.4-1 TB/s (qkv
# 17.7 / 30.9 us against cuBLAS's 9.7; the LM head 458 / 989 us against 130), so steps of two
# or more tokens take cuBLAS and the composed ops.
DECODE_TOKENS = 1
FULL_MASK = 0xFFFFFFFF
PROLOGUES = ("none", "rmsnorm")
EPILOGUES = ("store", "add", "silu", "rope")
PAIRED = ("silu", "rope")  # epilogues that combine two rows of w per output pair
NTHREADS = 256  # threads per block (half for rows shorter than that many words: plan())
TALL_ROWS = 32768


@device_function
def pair_row(pair, element, rope_pairs, half_dim):
    """The row of qkv (and of w_qkv) holding element 0 or 1 of rotation pair `pair`: dimension
    j or j + head_dim/2 of a q or k head, or (past the rotated heads) two neighbouring v dims."""
    if pair < rope_pairs:
        head = pair // half_dim
        return head * 2 * half_dim + pair - head * half_dim + element * half_dim
    return rope_pairs * 2 + 2 * (pair - rope_pairs) + element


@device_function
def rope_inputs(pair, t, positions, cos, sin, slot_mapping, rope_pairs, half_dim):
    """What rope_store needs besides the two products: (cos, sin) of the pair's angle at token
    t's position (1, 0 for v, which is not rotated) and the token's KV slot. Read at the start
    of the kernel, while the weights stream, so the epilogue waits for no load."""
    c = float32(1.0)
    s = float32(0.0)
    if pair < rope_pairs:
        pos = positions[t]
        d1 = pair_row(pair, 0, rope_pairs, half_dim) % (2 * half_dim)
        c = cos[pos, d1]
        s = sin[pos, d1]
    return c, s, slot_mapping[t]


@device_function
def rope_store(
    pair, t, x1, x2, c, s, slot, qkv, k_cache, v_cache, num_heads, head_dim, rope_pairs,
):  # fmt: skip
    """Rotate pair `pair` of token t (q, k) by (c, s) or pass it through (v: c = 1, s = 0);
    store it to qkv and, for k and v, to the cache at `slot` (a negative slot, graph padding,
    writes no cache)."""
    half_dim = head_dim // 2
    n1 = pair_row(pair, 0, rope_pairs, half_dim)
    n2 = pair_row(pair, 1, rope_pairs, half_dim)
    head = n1 // head_dim
    d1 = n1 - head * head_dim
    d2 = n2 - head * head_dim
    x1, x2 = x1 * c - x2 * s, x2 * c + x1 * s
    qkv[t, n1] = x1
    qkv[t, n2] = x2
    if head >= num_heads and slot >= 0:
        block_size = k_cache.shape[1]
        block = slot // block_size
        offset = slot - block * block_size
        nkv = k_cache.shape[2]
        cache = k_cache if head < num_heads + nkv else v_cache
        kv_head = (head - num_heads) % nkv
        cache[block, offset, kv_head, d1] = f32_to_bf16(x1)
        cache[block, offset, kv_head, d2] = f32_to_bf16(x2)


@functools.cache
def gemv_kernel(
    k_words: int, max_tokens: int, rows: int, nthreads: int, prologue: str, epilogue: str
):
    """The kernel for K = 4 * k_words inputs, up to max_tokens tokens, `rows` outputs a block."""
    if prologue not in PROLOGUES or epilogue not in EPILOGUES:
        raise ValueError(f"gemv: unknown prologue {prologue!r} or epilogue {epilogue!r}")
    if epilogue in PAIRED and rows % 2:
        raise ValueError(f"gemv: the {epilogue} epilogue needs an even number of rows")
    norm = prologue == "rmsnorm"
    silu = epilogue == "silu"
    rope = epilogue == "rope"
    paired = epilogue in PAIRED
    wpt = cdiv(k_words, nthreads)  # weight words per thread and row
    nacc = rows * max_tokens
    if nacc > nthreads:
        raise ValueError(f"gemv: rows * max_tokens ({nacc}) must be at most nthreads")
    half = rows // 2
    hidden = float(4 * k_words)
    nwarps = max(1, nthreads // 32)
    red_shape = (nthreads, nacc) if SIMULATOR else (nwarps, nacc)
    xf_len = max_tokens * 4 * wpt if norm else 1
    nw_len = 4 * wpt if norm else 1
    nwv, nwf = rows * wpt, rows * 4  # local array sizes must be compile-time constants
    exact = k_words % nthreads == 0  # every thread owns wpt words: no guard needed

    # The block reductions (the norm's sums of squares, the final dot products): each thread's
    # partials summed over its warp with xor shuffles, one row of `red` a warp, then summed
    # over the warps in order. The simulator has no shuffles: one row of `red` a thread.
    red_rows = red_shape[0]

    @device_function
    def partials_to_shared(acc, count, red, tid):
        if SIMULATOR:
            for a in range(count):
                red[tid, a] = acc[a]
        else:
            for a in range(count):
                v = acc[a]
                for k in range(5):
                    v += cuda.shfl_xor_sync(FULL_MASK, v, 16 >> k)
                acc[a] = v
            if tid % 32 == 0:
                for a in range(count):
                    red[tid // 32, a] = acc[a]
        cuda.syncthreads()

    @device_function
    def shared_total(red, a):
        total = float32(0.0)
        for k in range(red_rows):
            total += red[k, a]
        return total

    def kernel(
        x64, xres, norm_w, eps, w64, out, num_tokens,
        positions, cos, sin, k_cache, v_cache, slot_mapping, num_heads, head_dim,
    ):  # fmt: skip
        red = cuda.shared.array(red_shape, float32)
        fin = cuda.shared.array(nacc, float32)
        wv = cuda.local.array(nwv, uint64)
        wf = cuda.local.array(nwf, float32)
        xf = cuda.local.array(xf_len, float32)
        nw = cuda.local.array(nw_len, float32)
        xs = cuda.local.array(4, float32)
        acc = cuda.local.array(nacc, float32)
        tid = cuda.threadIdx.x
        n_w = w64.shape[0]
        last_t = num_tokens - 1
        half_dim = head_dim // 2
        rope_pairs = (num_heads + k_cache.shape[2]) * half_dim  # q and k heads

        # This block's weight rows: `rows` consecutive ones, or rows/2 pairs (paired epilogues).
        # Out-of-range rows are clamped for the loads, never stored.
        base = cuda.blockIdx.x * (half if paired else rows)
        for r in range(rows):
            n = base + r
            if silu and r >= half:
                n = n_w // 2 + base + r - half
            elif rope:
                n = pair_row(base + r % half, r // half, rope_pairs, half_dim)
            n = min(n, n_w - 1)
            for j in range(wpt):
                c = min(tid + j * nthreads, k_words - 1)
                wv[r * wpt + j] = w64[n, c]
        if norm:  # the norm's weights too: else a dependent round trip after its reduction
            for j in range(wpt):
                c = min(tid + j * nthreads, k_words - 1)
                for i in range(4):
                    nw[j * 4 + i] = norm_w[4 * c + i]
        # The epilogue's own loads, issued now so that they too arrive while the weights
        # stream: its rotation and KV slot (staged inputs and constant tables, which no kernel
        # writes: read before the wait), the residual this thread adds to (after it).
        out_row = tid // max_tokens  # the (row, token) whose result this thread will store
        out_t = min(tid % max_tokens, last_t)
        prior = float32(0.0)
        rc = float32(1.0)
        rs = float32(0.0)
        slot = -1
        if rope and out_row < half and base + out_row < n_w // 2:
            rc, rs, slot = rope_inputs(
                base + out_row, out_t, positions, cos, sin, slot_mapping, rope_pairs, half_dim
            )
        # Only what no kernel writes is read before the previous kernel has finished
        # (pdl.py): in a graph with programmatic edges the weights stream while it drains.
        grid_dependency_sync()
        if epilogue == "add" and tid < nacc and base + out_row < n_w:
            prior = out[out_t, base + out_row]

        if norm:  # x = bf16(residual / rms * norm_weight), each token's rows in registers
            for t in range(max_tokens):
                tt = min(t, last_t)
                squares = float32(0.0)
                for j in range(wpt):
                    c = tid + j * nthreads
                    for i in range(4):
                        v = float32(0.0)
                        if exact or c < k_words:
                            v = xres[tt, 4 * c + i]
                        xf[(t * wpt + j) * 4 + i] = v
                        squares += v * v
                acc[t] = squares
            partials_to_shared(acc, max_tokens, red, tid)
            for t in range(max_tokens):
                acc[t] = shared_total(red, t)
            cuda.syncthreads()  # red is reused by the final reduction
            for t in range(max_tokens):
                denom = math.sqrt(float32(acc[t] / float32(hidden)) + float32(eps))
                for j in range(wpt):
                    for i in range(4):
                        e = (t * wpt + j) * 4 + i
                        xf[e] = bf16_to_f32(f32_to_bf16(xf[e] / denom * nw[j * 4 + i]))

        for a in range(nacc):
            acc[a] = float32(0.0)
        for j in range(wpt):
            if exact or tid + j * nthreads < k_words:
                c = tid + j * nthreads
                for r in range(rows):
                    for i in range(4):
                        wf[r * 4 + i] = bf16_of_word(wv[r * wpt + j], i)
                for t in range(max_tokens):
                    if norm:
                        for i in range(4):
                            xs[i] = xf[(t * wpt + j) * 4 + i]
                    else:
                        word = x64[min(t, last_t), c]
                        for i in range(4):
                            xs[i] = bf16_of_word(word, i)
                    for r in range(rows):
                        dot = acc[r * max_tokens + t]
                        for i in range(4):
                            dot += wf[r * 4 + i] * xs[i]
                        acc[r * max_tokens + t] = dot

        # Sum each partial over the block, in a fixed order.
        partials_to_shared(acc, nacc, red, tid)
        total = float32(0.0)
        if tid < nacc:
            total = shared_total(red, tid)

        r = tid // max_tokens
        t = tid % max_tokens
        if paired:
            if tid < nacc:
                fin[tid] = total
            cuda.syncthreads()
            if r < half and t < num_tokens and base + r < n_w // 2:
                first, second = fin[tid], fin[tid + half * max_tokens]
                if silu:
                    out[t, base + r] = f32_to_bf16(silu_of_products(first, second))
                else:
                    rope_store(
                        base + r, t, first, second, rc, rs, slot, out, k_cache, v_cache,
                        num_heads, head_dim, rope_pairs,
                    )  # fmt: skip
        elif tid < nacc and t < num_tokens and base + r < n_w:
            if epilogue == "add":
                out[t, base + r] = prior + total
            else:
                out[t, base + r] = total

    return cuda.jit(cache=True)(kernel)


def plan(n_rows: int, k_words: int, max_tokens: int, norm: bool, epilogue: str):
    """(weight rows per block, threads per block, blocks) for a w of n_rows rows.

    From the H200 sweep at one token (tests/device/bench_gemv.py): 8 rows a block where the
    block recomputes the norm (its cost shared by more rows: qkv 9.1 us against 10.3 at 4
    rows, gate_up 22.9 against 28.4), 4 rows otherwise (o_proj 7.4, down 13.3; 8 rows was
    slower), 16 rows for the LM head's 128k rows (123.7 us, 4.25 TB/s, against 174 at 4).
    A short row (SmolLM2's 576) would leave half of 256 threads idle: 128 then.
    Whole steps with programmatic launch (`tinychat bench latency`, Llama-3.2-1B / SmolLM2-135M
    tok/s at batch 1): these choices 1,034 / 1,447; 4 rows everywhere 888 / 1,332; 512 threads
    910 / 1,450; 128 threads 993 / 1,451.
    """
    nthreads = threads(NTHREADS if k_words >= NTHREADS else NTHREADS // 2)
    if n_rows >= TALL_ROWS:
        rows = 16
    else:
        rows = 8 if norm else 4
    while rows * max_tokens > nthreads:
        rows //= 2
    if epilogue in PAIRED:  # a block's rows are rows/2 pairs
        rows = max(rows, 2)
        return rows, nthreads, cdiv(n_rows // 2, rows // 2)
    return rows, nthreads, cdiv(n_rows, rows)


def bucket(num_tokens: int) -> int:
    """The kernel's compile-time token count: the next power of two (1, 2, 4, 8)."""
    return 1 << (num_tokens - 1).bit_length()


def supports(num_tokens: int, k: int) -> bool:
    """Whether the kernel can run num_tokens rows with K = k inputs."""
    return 1 <= num_tokens <= MAX_TOKENS and k % 4 == 0


def serves(num_tokens: int, k: int) -> bool:
    """Whether the backend should send a step of num_tokens rows here (see DECODE_TOKENS)."""
    return num_tokens <= DECODE_TOKENS and supports(num_tokens, k)


class RopeArgs(NamedTuple):
    """What the "rope" epilogue needs besides the product (see rope_kv.py)."""

    positions: Any  # [T] int32
    cos: Any  # [max_pos, head_dim / 2] float32
    sin: Any
    k_cache: Any  # [blocks, block_size, nkv, head_dim] bf16 bits
    v_cache: Any
    slot_mapping: Any  # [T] int32, -1: no cache write
    num_heads: int
    head_dim: int


@functools.cache
def _dummy(dtype, ndim: int):
    """A one-element device array standing in for an argument a variant does not read."""
    return cuda.to_device(np.zeros((1,) * ndim, dtype))


@functools.cache
def _no_rope() -> RopeArgs:
    """The rope arguments of the other epilogues: dummies, made once."""
    i32, f32, cache = _dummy(np.int32, 1), _dummy(np.float32, 2), _dummy(np.uint16, 4)
    return RopeArgs(i32, f32, f32, cache, cache, i32, 0, 2)


def gemv(
    x, w, out, *, epilogue: str = "store", residual=None, norm_weight=None, eps: float = 0.0,
    rope: RopeArgs | None = None, stream=0,
) -> None:  # fmt: skip
    """out = epilogue(prologue(x) @ w.T) for x [T, K] (T <= MAX_TOKENS), w [N, K] bf16 bits.

    With norm_weight given, the input is `residual` [T, K] float32, normalised on the fly
    (x is unused and may be None); otherwise x is bf16 bits. out: float32 [T, N] ("store",
    "add", and "rope", which also needs `rope`) or bf16 bits [T, N / 2] ("silu").
    """
    norm = norm_weight is not None
    src = residual if norm else x
    t, k = src.shape
    if not supports(t, k):
        raise ValueError(f"gemv: {t} tokens of {k} inputs (at most {MAX_TOKENS}, K % 4 == 0)")
    if (epilogue == "rope") != (rope is not None):
        raise ValueError("gemv: the rope epilogue, and only it, takes rope arguments")
    max_tokens = bucket(t)
    rows, nthreads, blocks = plan(w.shape[0], k // 4, max_tokens, norm, epilogue)
    kernel = gemv_kernel(
        k // 4, max_tokens, rows, nthreads, "rmsnorm" if norm else "none", epilogue
    )
    if norm:
        x64, xres, nw = _dummy(np.uint64, 2), residual, norm_weight
    else:
        x64, xres, nw = x.view(np.uint64), _dummy(np.float32, 2), _dummy(np.float32, 1)
    kernel[blocks, nthreads, stream](
        x64, xres, nw, float(eps), w.view(np.uint64), out, t, *(rope or _no_rope())
    )


# The specialisations of Llama-3.2-1B's decode at batch 1, for the sm_90 compile test.
_ARGS = (
    "uint64[:, ::1], float32[:, ::1], float32[::1], float64, uint64[:, ::1], {out}, int64,"
    " int32[::1], float32[:, ::1], float32[:, ::1], uint16[:, :, :, ::1], uint16[:, :, :, ::1],"
    " int32[::1], int64, int64"
)
gemv_qkv_llama32 = gemv_kernel(512, 1, 8, NTHREADS, "rmsnorm", "rope")
gemv_gate_up_llama32 = gemv_kernel(512, 1, 8, NTHREADS, "rmsnorm", "silu")
gemv_down_llama32 = gemv_kernel(2048, 1, 4, NTHREADS, "none", "add")
gemv_lm_head_llama32 = gemv_kernel(512, 1, 16, NTHREADS, "rmsnorm", "store")
SIGNATURES = {
    "gemv_qkv_llama32": [f"void({_ARGS.format(out='float32[:, ::1]')})"],
    "gemv_gate_up_llama32": [f"void({_ARGS.format(out='uint16[:, ::1]')})"],
    "gemv_down_llama32": [f"void({_ARGS.format(out='float32[:, ::1]')})"],
    "gemv_lm_head_llama32": [f"void({_ARGS.format(out='float32[:, ::1]')})"],
}
