"""Split-KV for the narrow prefill launch: a query tile's keys in SPLITS chunks, then a merge.

A chat's new turn is a short chunk over a long history (~50 rows over ~500 cached tokens): at
Llama-3.2-1B shapes its narrow launch is cdiv(48, 4) x 8 = 96 blocks for 132 SMs, each walking
the whole history alone. Cut in SPLITS = 4 chunks of whole KV tiles, it is four times the
blocks; each busy split writes its unnormalised output and (m, l), and merge_kernel, over the
same grid without the splits, combines them (a tile whose keys fit one split writes its output
itself and the merge skips it). Measured with 8 chat sessions on the H200: ITL p99 2.37 ->
2.22 ms, TTFT p99 5.7 -> 5.3 ms. The caller provides the partials' scratch (split_sizes), which
bounds the rows of a split launch.

numpy twin: none of its own (a split launch gives the unsplit result, CpuBackend.attention).
"""

from __future__ import annotations

import math
from functools import cache

from numba import cuda, float32

from gpu.kernels.attention_prefill_tiles import choose_tiles
from gpu.kernels.bf16 import f32_to_bf16
from gpu.kernels.launch import device_function, threads
from gpu.kernels.pdl import grid_dependency_sync

SPLITS = 4  # key chunks per query tile of a split narrow launch
NEG_INF = float32(-math.inf)


def split_range_function(bk: int, splits: int):
    """The device function (ks, ke, busy) = split_range(kv_end, split): split `split` of the
    keys [0, kv_end) of a query tile, cut in `splits` chunks of whole KV tiles (bk keys);
    `busy` splits hold keys, the others are empty. The attention kernel and the merge share it."""

    @device_function
    def split_range(kv_end, split):
        chunk = (kv_end + splits - 1) // splits
        chunk = (chunk + bk - 1) // bk * bk
        busy = (kv_end + chunk - 1) // chunk
        ks = split * chunk
        return ks, min(kv_end, ks + chunk), busy

    return split_range


@cache
def merge_kernel(head_dim: int, group: int, bq: int, bk: int, splits: int):
    """The merge of a split launch: one block per (query tile, KV head, sequence), the grid of
    the attention launch without its splits; a tile whose keys fit one split was written by
    its block directly and is skipped. out = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s over
    the busy splits in order (M = max m_s: finite, split 0 holds key 0 of every row)."""
    split_range = split_range_function(bk, splits)
    nthreads = threads(128)

    def kernel(query_start_loc, seq_lens, q_min, q_max, part_o, part_ml, out):
        grid_dependency_sync()
        kvh = cuda.blockIdx.y
        b = cuda.blockIdx.z
        q_start = query_start_loc[b]
        q_len = query_start_loc[b + 1] - q_start
        if q_len < q_min or q_len > q_max:
            return
        j0 = (cuda.gridDim.x - 1 - cuda.blockIdx.x) * bq
        if j0 >= q_len:
            return
        nq = min(bq, q_len - j0)
        busy = split_range(seq_lens[b] - q_len + j0 + nq, 0)[2]
        if busy == 1:
            return
        num_heads = out.shape[1] // head_dim
        for e in range(cuda.threadIdx.x, nq * group * head_dim, nthreads):
            r = e // head_dim
            d = e - r * head_dim
            j = r // group
            token = q_start + j0 + j
            head = kvh * group + r - j * group
            base = (token * num_heads + head) * splits
            top = NEG_INF
            for k in range(splits):
                if k < busy:
                    top = max(top, part_ml[2 * (base + k)])
            num = float32(0.0)
            den = float32(0.0)
            for k in range(splits):
                if k < busy:
                    w = math.exp(part_ml[2 * (base + k)] - top)
                    num += w * part_o[(base + k) * head_dim + d]
                    den += w * part_ml[2 * (base + k) + 1]
            out[token, head * head_dim + d] = f32_to_bf16(num / den)

    kernel.__name__ = f"prefill_merge_hd{head_dim}_g{group}_q{bq}_s{splits}"
    return cuda.jit(cache=True)(kernel)


# The merge of Llama-3.2-1B's narrow tiles (head_dim 64, group 4), for
# tests/test_kernels_compile.py (sm_90, no GPU).
_LLAMA_NARROW = choose_tiles(64, 4, simulator=False)[1]
prefill_merge_kernel = merge_kernel(64, 4, _LLAMA_NARROW.query_tokens(4), _LLAMA_NARROW.bk, SPLITS)
SIGNATURES = {
    "prefill_merge_kernel": [
        "void(int32[::1], int32[::1], int64, int64, float32[::1], float32[::1], uint16[:, ::1])"
    ],
}


def split_sizes(num_tokens: int, num_heads: int, head_dim: int, splits: int) -> tuple:
    """Elements of the (o, (m, l)) scratch a split narrow launch over num_tokens rows needs."""
    if splits == 1:
        return 0, 0
    return num_tokens * num_heads * splits * head_dim, num_tokens * num_heads * splits * 2
