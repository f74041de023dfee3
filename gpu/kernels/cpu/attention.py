"""Paged causal attention on the CPU, one Numba call per layer for the whole batch.

The oracle (CpuBackend.attention) gathers each sequence's blocks and runs a dozen numpy calls
per sequence per layer; at batch 8 on a small model those calls cost more than the arithmetic.
Here prange runs over (sequence, query head) pairs and each pair walks its own block table:
scores for every visible position, softmax, then the weighted sum of V, in float32 (the order
of the sums is the only difference from the twin). numpy twin: CpuBackend.attention.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(parallel=True, fastmath=True, cache=True, nogil=True)
def paged_attention(
    qkv, k_cache, v_cache, query_start_loc, seq_lens, block_tables, num_heads, head_dim,
    group, scale, max_seq_len, out,
):  # fmt: skip  # pragma: no cover - compiled
    """out[t, h*hd:(h+1)*hd] for every query row t: row j of sequence b sits at position
    seq_lens[b] - q_len_b + j and attends to positions 0..that; head h reads KV head h // group."""
    num_seqs = seq_lens.shape[0]
    block_size = k_cache.shape[1]
    for task in prange(num_seqs * num_heads):
        b, h = task // num_heads, task % num_heads
        kvh = h // group
        start, end = query_start_loc[b], query_start_loc[b + 1]
        q_len, ctx = end - start, seq_lens[b]
        scores = np.empty(max_seq_len, np.float32)
        acc = np.empty(head_dim, np.float32)
        q0 = h * head_dim
        for j in range(q_len):
            row = start + j
            visible = ctx - q_len + j + 1
            best = np.float32(-np.inf)
            for c in range(visible):
                kv = k_cache[block_tables[b, c // block_size], c % block_size, kvh]
                s = np.float32(0.0)
                for i in range(head_dim):
                    s += qkv[row, q0 + i] * kv[i]
                s *= scale
                scores[c] = s
                best = max(best, s)
            total = np.float32(0.0)
            for c in range(visible):
                e = np.exp(scores[c] - best)
                scores[c] = e
                total += e
            acc[:] = 0.0
            for c in range(visible):
                vv = v_cache[block_tables[b, c // block_size], c % block_size, kvh]
                p = scores[c]
                for i in range(head_dim):
                    acc[i] += p * vv[i]
            inv = np.float32(1.0) / total
            for i in range(head_dim):
                out[row, q0 + i] = acc[i] * inv
