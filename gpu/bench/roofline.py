"""The two numbers of every figure: bytes over bandwidth and FLOPs over the matrix rate.

A decode step must read every weight once (and each sequence's KV cache); at batch 1 nothing
else matters, so weight bytes / copy bandwidth is the fastest any engine can decode on this
device. At large batches the FLOPs (2 per weight per token) take over. The bench prints, beside
each figure, the larger of the two floors and the fraction of it reached.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gpu.backends.base import Ceilings

__all__ = ["Ceilings", "count_params", "decode_step_floor", "measure_cpu_ceilings"]


def count_params(config: Any) -> int:
    h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
    hd, nh, nkv = config.head_dim, config.num_attention_heads, config.num_key_value_heads
    per_layer = h * (nh + 2 * nkv) * hd + nh * hd * h + 3 * h * i + 2 * h
    head = 0 if config.tie_word_embeddings else v * h
    return config.num_hidden_layers * per_layer + v * h + head + h


def decode_step_floor(
    config: Any, batch: int, context: int, weight_bytes: int, kv_bytes: int, ceilings: Ceilings
) -> dict:
    """Seconds a decode step cannot beat, and which term decides it."""
    params = count_params(config)
    # The embedding table is gathered (a few rows), not read: leave it out of the bytes unless
    # it doubles as the output layer.
    embedding = config.vocab_size * config.hidden_size
    read_params = params - (0 if config.tie_word_embeddings else embedding)
    kv_per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
    bytes_moved = read_params * weight_bytes + batch * context * kv_per_token * kv_bytes
    flops = 2 * params * batch
    t_bytes = bytes_moved / ceilings.bandwidth_Bps
    t_flops = flops / ceilings.matmul_flops
    return {
        "floor_s": max(t_bytes, t_flops),
        "bound": "memory" if t_bytes >= t_flops else "compute",
        "bytes": bytes_moved,
        "flops": flops,
    }


def measure_cpu_ceilings() -> Ceilings:
    """numpy's copy bandwidth and float32 GEMM rate on this machine (a few hundred ms)."""
    a = np.ones(64 << 20, dtype=np.uint8)
    b = np.empty_like(a)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(b, a)
        times.append(time.perf_counter() - t0)
    bandwidth = 2 * a.nbytes / min(times)
    x = np.random.default_rng(0).standard_normal((1024, 1024), dtype=np.float32)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        x @ x
        times.append(time.perf_counter() - t0)
    return Ceilings(bandwidth, 2 * 1024**3 / min(times), "numpy on the host")
