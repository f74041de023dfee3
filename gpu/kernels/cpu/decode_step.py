"""A whole q8 decode step (every layer, then the final norm and the LM head) in one parallel
region: each of Numba's threads takes one share of every op and the shares meet at barriers
(barrier.py) instead of at the end of a parallel loop.

A batch-1 step of the default model runs 151 parallel loops (30 layers x 5 ops, and the head),
and each loop wakes the sleeping second thread (OMP_WAIT_POLICY=PASSIVE: cpu_threads.py says
why it sleeps): ~13 us a loop, ~2 ms of a ~10 ms step. Here it wakes once a step, and waits at
a barrier (~0.25 us when both are there) between ops.

A share, for every layer:
    rmsnorm (each share its own copy of the small normed vector: no barrier) -> its rows of qkv
    | RoPE + KV write + attention for its (sequence, KV head) tasks
    | its rows of o_proj into the residual
    | rmsnorm -> its rows of gate and the matching rows of up -> SiLU * up on them
    | its rows of down into the residual |
then the final norm and its rows of the LM head ("|" is a barrier). The inner functions are the
per-op kernels' own (quant_gemm.py, attention.py, elementwise.py), so the numbers are the
per-op path's; only who computes which rows differs. numpy twin: the model's per-op forward.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from gpu.kernels.cpu.attention import attend
from gpu.kernels.cpu.barrier import GO, barrier_wait, check_in
from gpu.kernels.cpu.elementwise import rmsnorm, rope_kv_head, silu_mul_columns
from gpu.kernels.cpu.quant_gemm import ROWS_PER_TASK, int16_round, q8_float_rows, q8_int16_rows


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def _rows(n_rows, share, n_shares):  # pragma: no cover - compiled
    """A share's rows of a product: whole tasks of ROWS_PER_TASK, split as evenly as may be."""
    tasks = (n_rows + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    lo = share * tasks // n_shares * ROWS_PER_TASK
    hi = (share + 1) * tasks // n_shares * ROWS_PER_TASK
    return lo, min(hi, n_rows)


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def _product(x, xq, sx, qs, d, out, lo, hi, accumulate, use_int16):  # pragma: no cover
    """Rows lo..hi - 1 of out (+)= x @ W.T, the way gemm_q8 computes them."""
    if use_int16:
        int16_round(x, xq, sx)
        q8_int16_rows(xq, sx, qs, d, out, lo, hi, accumulate)
    else:
        q8_float_rows(x, qs, d, out, lo, hi, accumulate)


@njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def _share(
    share, n_shares, state, timeout_cycles, residual, input_norms, post_norms, final_norm, eps,
    qkv_qs, qkv_d, o_qs, o_d, gate_up_qs, gate_up_d, down_qs, down_d, head_qs, head_d,
    k_caches, v_caches, positions, slot_mapping, cos, sin, query_start_loc, seq_lens,
    block_tables, num_heads, num_kv_heads, head_dim, scale, max_seq_len,
    qkv, attn_out, gate_up, mlp_act, logits, normed, xq, sx, use_int16,
):  # fmt: skip  # pragma: no cover - compiled
    if not check_in(state, n_shares, timeout_cycles):
        return
    # The flags as runtime bools (a literal True or False argument would compile the product a
    # second time, specialised on it: seconds more of a first start, and the same code).
    put, add = np.bool_(False), np.bool_(True)
    group = num_heads // num_kv_heads
    inter = mlp_act.shape[1]
    scores = np.empty((group, max_seq_len), np.float32)
    q = np.empty((group, head_dim), np.float32)
    acc = np.empty((group, head_dim), np.float32)
    tasks = seq_lens.shape[0] * num_kv_heads
    task_lo, task_hi = share * tasks // n_shares, (share + 1) * tasks // n_shares
    qkv_lo, qkv_hi = _rows(qkv.shape[1], share, n_shares)
    hid_lo, hid_hi = _rows(residual.shape[1], share, n_shares)
    mlp_lo, mlp_hi = _rows(inter, share, n_shares)
    sense = np.int64(0)  # not a literal 0, which would compile barrier_wait a second time
    for layer in range(qkv_qs.shape[0]):
        k_cache, v_cache = k_caches[layer], v_caches[layer]
        rmsnorm(residual, input_norms[layer], eps, normed)
        w, s = qkv_qs[layer], qkv_d[layer]
        _product(normed, xq, sx, w, s, qkv, qkv_lo, qkv_hi, put, use_int16)
        sense = barrier_wait(state, n_shares, sense)
        for task in range(task_lo, task_hi):
            b, kvh = task // num_kv_heads, task % num_kv_heads
            row = np.int64(query_start_loc[b])  # int64, as rope_kv_write passes: one rope_kv_head
            rope_kv_head(
                qkv, row, positions[row], cos, sin, k_cache, v_cache, slot_mapping[row], kvh,
                group, num_heads, num_kv_heads, head_dim,
            )  # fmt: skip
            attend(
                qkv, k_cache, v_cache, query_start_loc, seq_lens, block_tables, b, kvh,
                head_dim, group, scale, scores, q, acc, attn_out,
            )  # fmt: skip
        sense = barrier_wait(state, n_shares, sense)
        w, s = o_qs[layer], o_d[layer]
        _product(attn_out, xq, sx, w, s, residual, hid_lo, hid_hi, add, use_int16)
        sense = barrier_wait(state, n_shares, sense)
        rmsnorm(residual, post_norms[layer], eps, normed)
        w, s = gate_up_qs[layer], gate_up_d[layer]
        _product(normed, xq, sx, w, s, gate_up, mlp_lo, mlp_hi, put, use_int16)
        if use_int16:  # the rows of up: the activations are rounded already
            q8_int16_rows(xq, sx, w, s, gate_up, inter + mlp_lo, inter + mlp_hi, put)
        else:
            q8_float_rows(normed, w, s, gate_up, inter + mlp_lo, inter + mlp_hi, put)
        silu_mul_columns(gate_up, mlp_act, mlp_lo, mlp_hi)
        sense = barrier_wait(state, n_shares, sense)
        w, s = down_qs[layer], down_d[layer]
        _product(mlp_act, xq, sx, w, s, residual, hid_lo, hid_hi, add, use_int16)
        sense = barrier_wait(state, n_shares, sense)
    rmsnorm(residual, final_norm, eps, normed)
    head_lo, head_hi = _rows(logits.shape[1], share, n_shares)
    _product(normed, xq, sx, head_qs, head_d, logits, head_lo, head_hi, put, use_int16)


@njit(parallel=True, fastmath=True, cache=True, nogil=True, error_model="numpy")
def decode_forward(
    n_shares, state, timeout_cycles, residual, input_norms, post_norms, final_norm, eps,
    qkv_qs, qkv_d, o_qs, o_d, gate_up_qs, gate_up_d, down_qs, down_d, head_qs, head_d,
    k_caches, v_caches, positions, slot_mapping, cos, sin, query_start_loc, seq_lens,
    block_tables, num_heads, num_kv_heads, head_dim, scale, max_seq_len,
    qkv, attn_out, gate_up, mlp_act, logits, normed, xq, sx, use_int16,
):  # fmt: skip  # pragma: no cover - compiled
    """One decode step (a query row a sequence, rows in sequence order) from the embedded
    residual [T, H] to logits [T, V]; the layers' matrices stacked [L, N, Kp] (scales [L, N]),
    caches [L, blocks, kv_heads, block_size, head_dim]; normed [S, T, H], xq [S, T, >= Kp]
    and sx [S, T]: each share's scratch. Returns False, having written nothing, when a share
    did not arrive within timeout_cycles (Numba did not run one share a thread); `state`:
    barrier.new_state(). The caller checks that Numba's thread count is n_shares (a prange of
    n_shares then runs one share a thread)."""
    for share in prange(n_shares):  # an int64 share: prange's index is uint64 when lowered,
        _share(  # and a second type would compile _share a second time
            np.int64(share), n_shares, state, timeout_cycles, residual, input_norms, post_norms,
            final_norm, eps, qkv_qs, qkv_d, o_qs, o_d, gate_up_qs, gate_up_d, down_qs, down_d,
            head_qs, head_d, k_caches, v_caches, positions, slot_mapping, cos, sin,
            query_start_loc, seq_lens, block_tables, num_heads, num_kv_heads, head_dim, scale,
            max_seq_len, qkv, attn_out, gate_up, mlp_act, logits, normed[share], xq[share],
            sx[share], use_int16,
        )  # fmt: skip
    return state[GO] == 1
