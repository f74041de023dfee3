"""Matrix products for decode steps of 2-8 tokens, on tensor cores, with the ops around them.

gemv.py streams the weights of a one-token step through FFMA: one multiply-add per weight
byte pair. At 8 tokens that is 8 FMAs a weight, and the kernel fell to 0.4-1 TB/s; cuBLAS
took those steps instead, at 1-3 TB/s on the small matrices, with every op around a product
(rope + KV write, SiLU, the residual add) a kernel of its own and no programmatic launch (a
cuBLAS kernel cannot wait for its predecessor, so its weights start streaming only once that
one is done). Here the weights stream as in gemv.py, and the tokens ride along in one tensor
core instruction: mma.sync m16n8k16 (mma.py) takes 16 weight rows as A and the (up to) 8
tokens as B, so a warp does 16 x 8 x 16 multiply-adds per instruction and the step costs no
more instructions than one token.

    epilogue "store":  out[t, n] = x[t] . w[n]                      (float32)
    epilogue "add":    out[t, n] += x[t] . w[n]                     (out is the residual stream)
    epilogue "silu":   out[t, i] = silu(bf16(x[t] . w[i])) * bf16(x[t] . w[I + i])  (bf16)
    epilogue "rope":   qkv with q and k rotated, k and v written to the paged KV cache

x is bf16 (the rmsnorm kernel's output where the op has a norm before it: recomputing the norm
in every block, as gemv.py does for one token, would read all T residual rows per block).

Shape of the work:

* One block owns one m-tile: the 16 weight rows a warp's A operand holds (lane g * 4 + c holds
  rows g and g + 8), or, for long rows (plan's rows_per_lane 1), 8 rows g with rows g + 8 a
  copy that is never stored. Paired epilogues put the two halves of an output in rows g and g + 8:
  gate row i and up row I + i, or the two dimensions of a rotation pair (gemv.pair_row), so
  both land in the same thread's accumulators (d0/d1 and d2/d3) and the epilogue needs no
  exchange.
* The block's warps split K: warp w takes `chunks_per_warp` consecutive 32-wide chunks. In a
  chunk, lane (g, c) loads 16 contiguous bytes of each of its rows, k = 32 j + 8c .. + 7, and 16
  bytes of token g's x at the same k. The sum over k does not care which k is which (mma.py):
  so its first 8 bytes are the a0/a2 (and b0/b1) pair of one mma and the next 8 bytes the pair
  of a second, and no shuffle or shared memory is needed to build a fragment. A warp's load
  covers 64 contiguous bytes of 8 rows: whole sectors.
* All of a thread's weight words (chunks_per_warp x rows x 16 bytes, at most 256) are loaded
  into registers first, before grid_dependency_sync: in a graph with programmatic edges
  (pdl.py) they stream while the kernel before this one drains, as gemv.py's do. x (written by
  that kernel) is read after it.
* The warps' partial 16 x 8 tiles are summed through shared memory in warp order (fixed: the
  result does not depend on timing), and warp 0 applies the epilogue from its own fragment
  layout: row g, tokens 2c and 2c + 1 (d0, d1), row g + 8 (d2, d3).
* Tokens past T (a step of 3 rows runs the 8-token tile) read row T - 1's x and are not stored.
  K must be a multiple of 8 (a lane's 16 bytes); a chunk past K contributes zeros.

Measured on the H200, in a batch-8 Llama-3.2-1B graph with programmatic edges
(tests/device/trace_step.py), what each op adds to the step, us: rmsnorm + qkv-with-rope 9.0
against 12.2 for rmsnorm, cuBLAS and the rope kernel; o_proj + residual 3.8-4.4 against 6.4;
rmsnorm + gate_up-with-SiLU 24.0 against 25.9 (8 warps a block, 120 registers; 4 warps: 28-30
us alone, 16: 32-33). down (K = 8,192: 8 rows a block, 512 threads) took 19.2 against cuBLAS's
13.2 and the LM head lost too, so both stay with cuBLAS (SERVE_MAX_K, SERVE_MAX_N). Whole steps
(`tinychat bench decode --batches 2,4,8`): SmolLM2-135M, all of whose products but the LM head
this kernel serves, 2,075 / 4,105 / 8,239 -> 2,636 / 5,168 / 9,969 tok/s (+21-27%);
Llama-3.2-1B within 1%, its fused ops' savings spent beside the products still on cuBLAS
(down, the LM head), where our early-launched blocks only wait.

numpy twins: the composed ops of the cpu backend (linear, linear_residual, silu_mul,
rope_kv_write), as for gemv.py.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from numba import cuda, float32, uint32, uint64

from gpu.kernels import mma
from gpu.kernels.activation import silu_of_products
from gpu.kernels.bf16 import f32_to_bf16
from gpu.kernels.gemv import RopeArgs, _no_rope, pair_row, rope_inputs, rope_store
from gpu.kernels.launch import SIMULATOR, cdiv, device_function
from gpu.kernels.pdl import grid_dependency_sync

MIN_TOKENS, MAX_TOKENS = 2, 8  # one n-tile of the mma; a single token takes gemv.py
EPILOGUES = ("store", "add", "silu", "rope")
PAIRED = ("silu", "rope")
CHUNK = 32  # k per chunk: 4 lanes x 8 bf16
# A thread's weight registers: chunks_per_warp x rows_per_lane x 16 bytes <= 16 x 16 bytes.
MAX_CHUNK_ROWS = 16
MAX_WARPS = 32
# Two weight rows a lane (16 a block) while that fits in this many warps (K <= 2,048); longer
# rows load one (8 a block), so a block stays at 256 threads for K up to 4,096.
TWO_ROW_WARPS = 8
# The largest step the backend sends here. Not in the CUDA simulator: its mma twin costs two
# block barriers per instruction (~60 ms of Python threads), which would make every simulated
# engine step of 2-8 tokens minutes long; tests/test_kernels_gemv_mma.py runs the kernel there,
# and one of its tests an engine step.
SERVE_TOKENS = 1 if SIMULATOR else MAX_TOKENS
# ... and only matrices of at most SERVE_MAX_K inputs and SERVE_MAX_N rows: a block holds its
# 16 rows' whole K in registers, 64 KB at K = 2,048; longer rows (down, K = 8,192) get 8 rows
# a block and read as many x bytes as weight bytes, and the LM head's 128 k rows are 8,000
# blocks. Those go to cuBLAS, measured faster there (above).
SERVE_MAX_K = 4096
SERVE_MAX_N = 32767
LOW32, HIGH_SHIFT = np.uint64(0xFFFFFFFF), np.uint64(32)
FA_SHAPE, FB_SHAPE, FC_SHAPE = mma.scratch_shapes(SIMULATOR)


def plan(k: int, epilogue: str) -> tuple[int, int, int]:
    """(rows a lane loads: 1 or 2, warps a block, chunks a warp) for rows of k inputs."""
    chunks = cdiv(k, CHUNK)
    two_rows_fit = chunks * 2 <= MAX_CHUNK_ROWS * TWO_ROW_WARPS
    rows_per_lane = 2 if epilogue in PAIRED or two_rows_fit else 1
    if SIMULATOR:  # one warp a block there: every chunk in one warp
        return rows_per_lane, 1, chunks
    warps = min(MAX_WARPS, max(1, cdiv(chunks * rows_per_lane, MAX_CHUNK_ROWS)))
    return rows_per_lane, warps, cdiv(chunks, warps)


@device_function
def silu_store(out, t, i, gate, up, num_tokens):
    """out[t, i] = silu(gate) * up (activation.silu_of_products) for a token of the step."""
    if t < num_tokens:
        out[t, i] = f32_to_bf16(silu_of_products(gate, up))


@device_function
def plain_store(out, t0, t1, r, v0, v1, num_tokens, n_w, add):
    """Row r's results for tokens t0 and t1: stored, or added to out (the residual)."""
    if r < n_w:
        if t0 < num_tokens:
            out[t0, r] = out[t0, r] + v0 if add else v0
        if t1 < num_tokens:
            out[t1, r] = out[t1, r] + v1 if add else v1


@functools.cache
def gemv_mma_kernel(k: int, rows_per_lane: int, warps: int, chunks_per_warp: int, epilogue: str):
    """The kernel for rows of k inputs (k % 8 == 0)."""
    if epilogue not in EPILOGUES:
        raise ValueError(f"gemv_mma: unknown epilogue {epilogue!r}")
    if epilogue in PAIRED and rows_per_lane != 2:
        raise ValueError("gemv_mma: a paired epilogue needs two rows a lane")
    silu = epilogue == "silu"
    rope = epilogue == "rope"
    add = epilogue == "add"
    paired = epilogue in PAIRED
    two = rows_per_lane == 2
    k_words = k // 4
    chunks = cdiv(k, CHUNK)
    nwv = chunks_per_warp * rows_per_lane * 2  # uint64 weight words a thread holds
    block_rows = 16 if two else 8  # distinct weight rows (or pairs: 8) a block owns
    red_shape = (warps, 32, 4) if warps > 1 else (1, 1, 1)

    def kernel(
        x64, w64, out, num_tokens,
        positions, cos, sin, k_cache, v_cache, slot_mapping, num_heads, head_dim,
    ):  # fmt: skip
        fa = cuda.shared.array(FA_SHAPE, uint32)
        fb = cuda.shared.array(FB_SHAPE, uint32)
        fc = cuda.shared.array(FC_SHAPE, float32)
        red = cuda.shared.array(red_shape, float32)
        wv = cuda.local.array(nwv, uint64)
        tid = cuda.threadIdx.x
        warp = tid // 32
        lane = tid % 32
        g = lane // 4
        c = lane % 4
        n_w = w64.shape[0]
        last_t = num_tokens - 1
        half_dim = head_dim // 2
        rope_pairs = (num_heads + k_cache.shape[2]) * half_dim

        # This lane's rows: g (and g + 8), or, paired, the two halves of output pair `pair`.
        pair = cuda.blockIdx.x * 8 + g
        if silu:
            row0 = pair
            row1 = n_w // 2 + pair
        elif rope:
            row0 = pair_row(pair, 0, rope_pairs, half_dim)
            row1 = pair_row(pair, 1, rope_pairs, half_dim)
        else:
            row0 = cuda.blockIdx.x * block_rows + g
            row1 = row0 + 8
        row0 = min(row0, n_w - 1)  # loads only: out-of-range rows are never stored
        row1 = min(row1, n_w - 1)

        first_chunk = warp * chunks_per_warp
        for i in range(chunks_per_warp):
            col = min((first_chunk + i) * 8 + 2 * c, k_words - 2)
            wv[i * rows_per_lane * 2] = w64[row0, col]
            wv[i * rows_per_lane * 2 + 1] = w64[row0, col + 1]
            if two:
                wv[i * 4 + 2] = w64[row1, col]
                wv[i * 4 + 3] = w64[row1, col + 1]
        # The rope epilogue's rotation and KV slots (staged inputs and constant tables) for
        # this lane's two tokens, while the weights stream.
        rc0 = float32(1.0)
        rs0 = float32(0.0)
        slot0 = -1
        rc1 = float32(1.0)
        rs1 = float32(0.0)
        slot1 = -1
        if rope and warp == 0 and pair < n_w // 2:
            t0 = min(2 * c, last_t)
            t1 = min(2 * c + 1, last_t)
            rc0, rs0, slot0 = rope_inputs(
                pair, t0, positions, cos, sin, slot_mapping, rope_pairs, half_dim
            )
            rc1, rs1, slot1 = rope_inputs(
                pair, t1, positions, cos, sin, slot_mapping, rope_pairs, half_dim
            )
        grid_dependency_sync()

        tok = min(g, last_t)
        d0 = float32(0.0)
        d1 = float32(0.0)
        d2 = float32(0.0)
        d3 = float32(0.0)
        for i in range(chunks_per_warp):
            j = first_chunk + i
            live = j < chunks and j * CHUNK + 8 * c < k
            col = min(j * 8 + 2 * c, k_words - 2)
            for h in range(2):  # the chunk's two mma: bytes 0-7, then 8-15 of each row
                xw = x64[tok, col + h]
                a0w = wv[i * rows_per_lane * 2 + h]
                a1w = wv[i * 4 + 2 + h] if two else a0w
                if not live:
                    a0w = uint64(0)
                    a1w = uint64(0)
                d0, d1, d2, d3 = mma.mma_m16n8k16(
                    fa, fb, fc,
                    uint32(a0w & LOW32), uint32(a1w & LOW32),
                    uint32(a0w >> HIGH_SHIFT), uint32(a1w >> HIGH_SHIFT),
                    uint32(xw & LOW32), uint32(xw >> HIGH_SHIFT),
                    d0, d1, d2, d3,
                )  # fmt: skip

        if warps > 1:  # the warps' partial tiles, summed in warp order by warp 0
            red[warp, lane, 0] = d0
            red[warp, lane, 1] = d1
            red[warp, lane, 2] = d2
            red[warp, lane, 3] = d3
            cuda.syncthreads()
            if warp == 0:
                d0 = float32(0.0)
                d1 = float32(0.0)
                d2 = float32(0.0)
                d3 = float32(0.0)
                for w in range(warps):
                    d0 += red[w, lane, 0]
                    d1 += red[w, lane, 1]
                    d2 += red[w, lane, 2]
                    d3 += red[w, lane, 3]
        if warp != 0:
            return

        t0 = 2 * c
        t1 = 2 * c + 1
        if paired:
            if pair < n_w // 2:
                if silu:
                    silu_store(out, t0, pair, d0, d2, num_tokens)
                    silu_store(out, t1, pair, d1, d3, num_tokens)
                else:
                    if t0 < num_tokens:
                        rope_store(
                            pair, t0, d0, d2, rc0, rs0, slot0, out, k_cache, v_cache,
                            num_heads, head_dim, rope_pairs,
                        )  # fmt: skip
                    if t1 < num_tokens:
                        rope_store(
                            pair, t1, d1, d3, rc1, rs1, slot1, out, k_cache, v_cache,
                            num_heads, head_dim, rope_pairs,
                        )  # fmt: skip
        else:
            r0 = cuda.blockIdx.x * block_rows + g
            plain_store(out, t0, t1, r0, d0, d1, num_tokens, n_w, add)
            if two:
                plain_store(out, t0, t1, r0 + 8, d2, d3, num_tokens, n_w, add)

    return cuda.jit(cache=True)(kernel)


def num_blocks(n: int, rows_per_lane: int, epilogue: str) -> int:
    """The grid for w of n rows: 8 output pairs a block (paired epilogues), else 16 or 8 rows."""
    if epilogue in PAIRED:
        return cdiv(n // 2, 8)
    return cdiv(n, 16 if rows_per_lane == 2 else 8)


def supports(num_tokens: int, k: int) -> bool:
    return MIN_TOKENS <= num_tokens <= MAX_TOKENS and k % 8 == 0 and k >= 8


def serves(num_tokens: int, w) -> bool:
    """Whether the backend sends a step of num_tokens rows times w [N, K] here (SERVE_*)."""
    n, k = w.shape
    return (
        num_tokens <= SERVE_TOKENS
        and k <= SERVE_MAX_K
        and n <= SERVE_MAX_N
        and supports(num_tokens, k)
    )


def gemv_mma(x, w, out, *, epilogue: str = "store", rope: RopeArgs | None = None, stream=0) -> None:
    """out = epilogue(x @ w.T) for x [T, K] bf16 bits (2 <= T <= 8), w [N, K] bf16 bits.
    out: float32 [T, N] ("store", "add"; "rope", which also needs `rope`, writes qkv) or bf16
    bits [T, N / 2] ("silu")."""
    t, k = x.shape
    if not supports(t, k):
        raise ValueError(f"gemv_mma: {t} tokens of {k} inputs ({MIN_TOKENS}-{MAX_TOKENS}, K % 8)")
    if (epilogue == "rope") != (rope is not None):
        raise ValueError("gemv_mma: the rope epilogue, and only it, takes rope arguments")
    rows_per_lane, warps, chunks_per_warp = plan(k, epilogue)
    kernel = gemv_mma_kernel(k, rows_per_lane, warps, chunks_per_warp, epilogue)
    blocks = num_blocks(w.shape[0], rows_per_lane, epilogue)
    args: Any = rope or _no_rope()
    kernel[blocks, 32 * warps, stream](x.view(np.uint64), w.view(np.uint64), out, t, *args)


# The specialisations of Llama-3.2-1B's decode at 2-8 tokens, for the sm_90 compile test.
_ARGS = (
    "uint64[:, ::1], uint64[:, ::1], {out}, int64, int32[::1], float32[:, ::1],"
    " float32[:, ::1], uint16[:, :, :, ::1], uint16[:, :, :, ::1], int32[::1], int64, int64"
)
gemv_mma_qkv_llama32 = gemv_mma_kernel(2048, *plan(2048, "rope"), "rope")
gemv_mma_gate_up_llama32 = gemv_mma_kernel(2048, *plan(2048, "silu"), "silu")
gemv_mma_down_llama32 = gemv_mma_kernel(8192, *plan(8192, "add"), "add")
gemv_mma_lm_head_llama32 = gemv_mma_kernel(2048, *plan(2048, "store"), "store")
SIGNATURES = {
    "gemv_mma_qkv_llama32": [f"void({_ARGS.format(out='float32[:, ::1]')})"],
    "gemv_mma_gate_up_llama32": [f"void({_ARGS.format(out='uint16[:, ::1]')})"],
    "gemv_mma_down_llama32": [f"void({_ARGS.format(out='float32[:, ::1]')})"],
    "gemv_mma_lm_head_llama32": [f"void({_ARGS.format(out='float32[:, ::1]')})"],
}
