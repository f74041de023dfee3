"""The small ops of a layer on the CPU as single Numba calls: RMSNorm, RoPE + KV write, SiLU-mul.

At decode sizes (a few rows of 576) each numpy call costs more than its arithmetic, and the
oracle spends 4-20 of them per op; one compiled loop each removes that. Not parallel: a few rows
are less work than waking a thread. numpy twins: CpuBackend.rmsnorm, .rope_kv_write (whose
caches are [blocks, block_size, kv_heads, head_dim]), .silu_mul.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def rmsnorm(x, weight, eps, out):  # pragma: no cover - compiled
    t_count, h = x.shape
    for t in range(t_count):
        ss = np.float32(0.0)
        for i in range(h):
            ss += x[t, i] * x[t, i]
        inv = np.float32(1.0) / np.sqrt(ss / np.float32(h) + eps)
        for i in range(h):
            out[t, i] = x[t, i] * inv * weight[i]


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def rope_kv_write(
    qkv, positions, cos, sin, k_cache, v_cache, slot_mapping, num_heads, num_kv_heads, head_dim
):  # pragma: no cover - compiled
    """Rotate-half RoPE on q and k of each row in place; k, v to their slots (slot < 0: none)
    in caches laid out [blocks, kv_heads, block_size, head_dim] (attention.py says why)."""
    group = num_heads // num_kv_heads
    for t in range(qkv.shape[0]):
        for kvh in range(num_kv_heads):
            rope_kv_head(
                qkv, t, positions[t], cos, sin, k_cache, v_cache, slot_mapping[t], kvh,
                group, num_heads, num_kv_heads, head_dim,
            )  # fmt: skip


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def rope_kv_head(
    qkv, t, p, cos, sin, k_cache, v_cache, slot, kvh, group, num_heads, num_kv_heads, head_dim
):  # fmt: skip  # pragma: no cover - compiled
    """rope_kv_write's share of KV head kvh in row t (at position p): its `group` query heads
    and its k rotated, its k and v written to `slot`."""
    half = head_dim // 2
    k_off = num_heads * head_dim
    v_off = k_off + num_kv_heads * head_dim
    for h in range(kvh * group, (kvh + 1) * group):
        _rotate(qkv, t, h * head_dim, p, cos, sin, half)
    _rotate(qkv, t, k_off + kvh * head_dim, p, cos, sin, half)
    if slot < 0:
        return
    block_size = k_cache.shape[2]
    blk, off = slot // block_size, slot % block_size
    for i in range(head_dim):
        k_cache[blk, kvh, off, i] = qkv[t, k_off + kvh * head_dim + i]
        v_cache[blk, kvh, off, i] = qkv[t, v_off + kvh * head_dim + i]


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def _rotate(qkv, t, o, p, cos, sin, half):  # pragma: no cover - compiled
    for i in range(half):
        x1, x2 = qkv[t, o + i], qkv[t, o + half + i]
        c, s = cos[p, i], sin[p, i]
        qkv[t, o + i] = x1 * c - x2 * s
        qkv[t, o + half + i] = x2 * c + x1 * s


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def silu_mul(gate_up, out):  # pragma: no cover - compiled
    # np.int64: a literal 0 would compile silu_mul_columns a second time, specialised on it
    silu_mul_columns(gate_up, out, np.int64(0), out.shape[1])


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def silu_mul_columns(gate_up, out, lo, hi):  # pragma: no cover - compiled
    """out[:, lo:hi] of silu_mul (gate_up [T, 2I] = [gate | up], out [T, I])."""
    inter = out.shape[1]
    for t in range(out.shape[0]):
        for i in range(lo, hi):
            g = gate_up[t, i]
            out[t, i] = g / (np.float32(1.0) + np.exp(-g)) * gate_up[t, inter + i]
