"""Paged causal attention on the CPU, one Numba call per layer for the whole batch.

The oracle (CpuBackend.attention) gathers each sequence's blocks and runs a dozen numpy calls
per sequence per layer; at batch 8 on a small model those calls cost more than the arithmetic.
Here prange runs over (sequence, KV head) pairs and each pair walks its own block table once
for the `group` query heads that share that KV head (GQA): each K and V row is loaded once and
used `group` times, and four positions go together (four independent dot products a pass over
q, one update of the output row for four V rows). Scores of all positions first, then one
softmax per head, then the weighted sum of V, in float32 (the order of the sums is the only
difference from the twin). Measured on the 2-core host at context 192 (SmolLM2's 9 / 3 heads,
30 layers' caches in turn, as a decode step reads them): 63 against 116 us at one sequence, 379
against 565-875 us at eight, for a walk per (sequence, query head) and a position at a time.

The caches are head-major within a block, [blocks, kv_heads, block_size, head_dim] (the quantized
path's own layout: CpuQuantBackend.allocate_kv_cache), so a KV head's 16 rows of a block are one
contiguous 4 KB run instead of 16 rows 768 bytes apart: the walk reads its context from DRAM at
a stream's speed (65 against 79 us a layer at one sequence, 354 against 498 at eight).
numpy twin: CpuBackend.attention (on the oracle's [blocks, block_size, kv_heads, head_dim]).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange


@njit(parallel=True, fastmath=True, cache=True, nogil=True, error_model="numpy")
def paged_attention(
    qkv, k_cache, v_cache, query_start_loc, seq_lens, block_tables, num_heads, head_dim,
    group, scale, max_seq_len, out,
):  # fmt: skip  # pragma: no cover - compiled
    """out[t, h*hd:(h+1)*hd] for every query row t: row j of sequence b sits at position
    seq_lens[b] - q_len_b + j and attends to positions 0..that; head h reads KV head h // group.
    k_cache, v_cache: [blocks, kv_heads, block_size, head_dim]."""
    num_seqs = seq_lens.shape[0]
    num_kv = num_heads // group
    for task in prange(num_seqs * num_kv):
        scores = np.empty((group, max_seq_len), np.float32)
        q = np.empty((group, head_dim), np.float32)
        acc = np.empty((group, head_dim), np.float32)
        attend(
            qkv, k_cache, v_cache, query_start_loc, seq_lens, block_tables, task // num_kv,
            task % num_kv, head_dim, group, scale, scores, q, acc, out,
        )  # fmt: skip


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def attend(
    qkv, k_cache, v_cache, query_start_loc, seq_lens, block_tables, b, kvh, head_dim, group,
    scale, scores, q, acc, out,
):  # fmt: skip  # pragma: no cover - compiled
    """paged_attention's task (sequence b, KV head kvh) on the calling thread: the `group`
    query heads of kvh, every query row of b. scores [group, >= context], q and acc
    [group, head_dim]: scratch."""
    block_size = k_cache.shape[2]
    start, end = query_start_loc[b], query_start_loc[b + 1]
    q_len, ctx = end - start, seq_lens[b]
    for j in range(q_len):
        row = start + j
        visible = ctx - q_len + j + 1
        for g in range(group):
            q0 = (kvh * group + g) * head_dim
            for i in range(head_dim):
                q[g, i] = qkv[row, q0 + i] * scale
        c = 0
        while c + 4 <= visible:
            k0 = k_cache[block_tables[b, c // block_size], kvh, c % block_size]
            k1 = k_cache[block_tables[b, (c + 1) // block_size], kvh, (c + 1) % block_size]
            k2 = k_cache[block_tables[b, (c + 2) // block_size], kvh, (c + 2) % block_size]
            k3 = k_cache[block_tables[b, (c + 3) // block_size], kvh, (c + 3) % block_size]
            for g in range(group):
                qg = q[g]
                s0 = s1 = s2 = s3 = np.float32(0.0)
                for i in range(head_dim):
                    qi = qg[i]
                    s0 += qi * k0[i]
                    s1 += qi * k1[i]
                    s2 += qi * k2[i]
                    s3 += qi * k3[i]
                scores[g, c] = s0
                scores[g, c + 1] = s1
                scores[g, c + 2] = s2
                scores[g, c + 3] = s3
            c += 4
        while c < visible:
            k0 = k_cache[block_tables[b, c // block_size], kvh, c % block_size]
            for g in range(group):
                qg = q[g]
                s0 = np.float32(0.0)
                for i in range(head_dim):
                    s0 += qg[i] * k0[i]
                scores[g, c] = s0
            c += 1
        for g in range(group):
            sg = scores[g]
            best = np.float32(-np.inf)
            for c in range(visible):
                best = max(best, sg[c])
            total = np.float32(0.0)
            for c in range(visible):
                e = np.exp(sg[c] - best)
                sg[c] = e
                total += e
            inv = np.float32(1.0) / total
            for c in range(visible):
                sg[c] *= inv
        acc[:, :] = 0.0
        c = 0
        while c + 4 <= visible:
            v0 = v_cache[block_tables[b, c // block_size], kvh, c % block_size]
            v1 = v_cache[block_tables[b, (c + 1) // block_size], kvh, (c + 1) % block_size]
            v2 = v_cache[block_tables[b, (c + 2) // block_size], kvh, (c + 2) % block_size]
            v3 = v_cache[block_tables[b, (c + 3) // block_size], kvh, (c + 3) % block_size]
            for g in range(group):
                p0, p1, p2, p3 = (
                    scores[g, c],
                    scores[g, c + 1],
                    scores[g, c + 2],
                    scores[g, c + 3],
                )
                ag = acc[g]
                for i in range(head_dim):
                    ag[i] += p0 * v0[i] + p1 * v1[i] + p2 * v2[i] + p3 * v3[i]
            c += 4
        while c < visible:
            v0 = v_cache[block_tables[b, c // block_size], kvh, c % block_size]
            for g in range(group):
                p0 = scores[g, c]
                ag = acc[g]
                for i in range(head_dim):
                    ag[i] += p0 * v0[i]
            c += 1
        for g in range(group):
            q0 = (kvh * group + g) * head_dim
            for i in range(head_dim):
                out[row, q0 + i] = acc[g, i]
