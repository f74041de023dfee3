"""Shared pieces of the kernel tests: fresh random inputs, poisoned outputs, paged KV cases.

Every run draws new inputs (the seed is printed in failure messages, so a failure can be
replayed with KERNEL_TEST_SEED=...). Outputs are filled with NaN (bf16 NaN bits for uint16,
a sentinel for int32) before each launch, so an element a kernel forgets to write fails.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass

import numpy as np
from numba import cuda

from gpu.forward_batch import ForwardBatch
from gpu.kernels.bf16 import from_bf16_bits, round_to_bf16, to_bf16_bits
from gpu.kernels.launch import SIMULATOR

BF16_NAN = np.uint16(0x7FC0)
INT_POISON = np.int32(-12345)


def fresh_rng() -> tuple[np.random.Generator, int]:
    seed = int(os.environ.get("KERNEL_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
    return np.random.default_rng(seed), seed


def poisoned(shape, dtype) -> object:
    """A device array filled with NaN (float32 / bf16 bits) or a sentinel (int32)."""
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        host = np.full(shape, np.nan, np.float32)
    elif dtype == np.uint16:
        host = np.full(shape, BF16_NAN, np.uint16)
    else:
        host = np.full(shape, INT_POISON, dtype)
    return cuda.to_device(host)


def synced(array) -> np.ndarray:
    """Wait for the GPU (surfacing any launch error) and copy the array back."""
    cuda.synchronize()
    return array.copy_to_host()


def bf16_values(rng: np.random.Generator, shape, scale: float = 1.0) -> np.ndarray:
    """Random float32 values that are exactly representable in bf16."""
    return round_to_bf16((rng.standard_normal(shape) * scale).astype(np.float32))


def assert_close(actual, expected, rtol: float, atol: float, seed: int, what: str) -> None:
    np.testing.assert_allclose(
        actual, expected, rtol=rtol, atol=atol, err_msg=f"{what} (KERNEL_TEST_SEED={seed})"
    )


@dataclass
class PagedCase:
    """A batch of sequences over a paged bf16 KV cache, as host arrays for both backends."""

    batch: ForwardBatch  # host arrays, 2-D block table (the numpy twin's input)
    qkv: np.ndarray  # [T, (nh + 2 nkv) * hd] float32
    k_cache: np.ndarray  # [NB, bs, nkv, hd] float32 values (bf16-exact; NaN where unused)
    v_cache: np.ndarray
    block_tables_flat: np.ndarray  # [S * width] int32
    num_heads: int
    num_kv_heads: int
    head_dim: int

    @property
    def k_bits(self) -> np.ndarray:
        return to_bf16_bits(self.k_cache)

    @property
    def v_bits(self) -> np.ndarray:
        return to_bf16_bits(self.v_cache)


def paged_case(
    rng: np.random.Generator,
    seq_lens: list[int],
    query_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int = 16,
    extra_blocks: int = 3,
) -> PagedCase:
    """Sequences with context seq_lens[b], whose last query_lens[b] tokens are this step's
    queries. Blocks are shuffled (not contiguous, not in order); every cache slot no sequence
    owns, and every slot past a sequence's length, holds NaN, so reading one fails the test."""
    width = max(-(-n // block_size) for n in seq_lens)
    needed = sum(-(-n // block_size) for n in seq_lens)
    num_blocks = needed + extra_blocks
    order = rng.permutation(num_blocks).astype(np.int32)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = np.full(shape, np.nan, np.float32)
    v_cache = np.full(shape, np.nan, np.float32)
    tables = np.zeros((len(seq_lens), width), np.int32)
    used = 0
    for b, n in enumerate(seq_lens):
        nb = -(-n // block_size)
        tables[b, :nb] = order[used : used + nb]
        used += nb
        for t in range(n):
            blk, off = tables[b, t // block_size], t % block_size
            k_cache[blk, off] = bf16_values(rng, (num_kv_heads, head_dim))
            v_cache[blk, off] = bf16_values(rng, (num_kv_heads, head_dim))
    qkv_width = (num_heads + 2 * num_kv_heads) * head_dim
    total = sum(query_lens)
    qkv = (rng.standard_normal((total, qkv_width))).astype(np.float32)
    qsl = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    positions, slots, last = [], [], []
    for b, (n, q) in enumerate(zip(seq_lens, query_lens, strict=True)):
        for t in range(n - q, n):
            positions.append(t)
            slots.append(tables[b, t // block_size] * block_size + t % block_size)
        last.append(qsl[b + 1] - 1)
    batch = ForwardBatch(
        num_tokens=total,
        num_seqs=len(seq_lens),
        input_ids=np.zeros(total, np.int32),
        positions=np.asarray(positions, np.int32),
        slot_mapping=np.asarray(slots, np.int32),
        query_start_loc=qsl,
        seq_lens=np.asarray(seq_lens, np.int32),
        block_tables=tables,
        logits_indices=np.asarray(last, np.int32),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
    )
    return PagedCase(
        batch, qkv, k_cache, v_cache, tables.reshape(-1).copy(), num_heads, num_kv_heads, head_dim
    )


def _emulated_shfl_xor_sync(self, mask, value, lane_mask):
    """cuda.shfl_xor_sync for the simulator: the value of thread (id ^ lane_mask), exchanged
    through the block (so every thread of the block must call it together)."""
    thread = threading.current_thread()
    store = thread._manager.__dict__.setdefault("_tinychat_shfl", {})
    store[thread.thread_id] = value
    thread.syncthreads()
    other = store[thread.thread_id ^ lane_mask]
    thread.syncthreads()
    return other


@contextlib.contextmanager
def gpu_code_path(*modules):
    """Run the kernels of `modules` on their GPU code path (warp shuffles) in the simulator:
    their SIMULATOR switch is turned off and the simulator gets an emulated shfl_xor_sync. The
    kernels must shuffle with the whole block in step (block-uniform loops). On a GPU this
    changes nothing: the GPU path is the one that runs."""
    if not SIMULATOR:
        yield
        return
    from numba.cuda.simulator.kernelapi import FakeCUDAModule

    saved = [m.SIMULATOR for m in modules]
    FakeCUDAModule.shfl_xor_sync = _emulated_shfl_xor_sync
    for m in modules:
        m.SIMULATOR = False
    try:
        yield
    finally:
        for m, value in zip(modules, saved, strict=True):
            m.SIMULATOR = value
        del FakeCUDAModule.shfl_xor_sync


def cpu_attention(case: PagedCase) -> np.ndarray:
    """The numpy twin's output for the case (NaN-free caches: unused slots zeroed for it)."""
    from gpu.backends.cpu import CpuBackend

    k = np.nan_to_num(case.k_cache, nan=0.0)
    v = np.nan_to_num(case.v_cache, nan=0.0)
    out = np.zeros((case.batch.num_tokens, case.num_heads * case.head_dim), np.float32)
    CpuBackend().attention(
        case.qkv, k, v, case.batch, case.num_heads, case.num_kv_heads, case.head_dim,
        case.head_dim**-0.5, out,
    )  # fmt: skip
    return out


__all__ = [
    "BF16_NAN",
    "INT_POISON",
    "PagedCase",
    "assert_close",
    "bf16_values",
    "cpu_attention",
    "fresh_rng",
    "from_bf16_bits",
    "gpu_code_path",
    "paged_case",
    "poisoned",
    "synced",
]


RTOL, ATOL = 2.0**-7, 2e-3  # attention: bf16 output rounding, fp32 sums in another order


def attention_device_args(case):
    """qkv, caches, block table (flat) + stride, query starts, seq lens of a paged_case."""
    b = case.batch
    return (
        cuda.to_device(case.qkv),
        cuda.to_device(case.k_bits),
        cuda.to_device(case.v_bits),
        cuda.to_device(case.block_tables_flat),
        cuda.to_device(np.array([b.block_tables.shape[1]], np.int32)),
        cuda.to_device(b.query_start_loc),
        cuda.to_device(b.seq_lens),
    )


@dataclass
class RopeEpilogueCase:
    """The inputs of a fused rope + KV-write epilogue (gemv.py, gemv_mma.py) for t tokens, the
    last one a padding row (slot -1, no cache write) when t > 1: host twins and device args."""

    positions: np.ndarray
    slots: np.ndarray
    cos: np.ndarray
    sin: np.ndarray
    k_cache: np.ndarray  # [6, 4, nkv, hd] float32, zeros: the twin's cache
    v_cache: np.ndarray
    args: object  # gemv.RopeArgs over device copies (bf16 caches, zeros)

    def expected(self, qkv: np.ndarray, num_heads: int, num_kv_heads: int, head_dim: int):
        """The composed ops' result: qkv rotated in place, k and v written to the twin cache."""
        from gpu.backends.cpu import CpuBackend

        CpuBackend().rope_kv_write(
            qkv, self.positions, self.cos, self.sin, self.k_cache, self.v_cache, self.slots,
            num_heads, num_kv_heads, head_dim,
        )  # fmt: skip


def rope_epilogue_case(rng, t: int, num_heads: int, num_kv_heads: int, head_dim: int):
    from gpu.kernels.gemv import RopeArgs
    from gpu.rope import rope_cos_sin

    cos, sin = rope_cos_sin(head_dim, 10000.0, 64, None)
    positions = rng.integers(0, 64, t).astype(np.int32)
    slots = rng.permutation(24)[:t].astype(np.int32)
    if t > 1:
        slots[-1] = -1
    shape = (6, 4, num_kv_heads, head_dim)  # 6 blocks of 4 tokens
    d_k = cuda.to_device(np.zeros(shape, np.uint16))
    d_v = cuda.to_device(np.zeros(shape, np.uint16))
    args = RopeArgs(
        cuda.to_device(positions), cuda.to_device(cos), cuda.to_device(sin), d_k, d_v,
        cuda.to_device(slots), num_heads, head_dim,
    )  # fmt: skip
    zeros = np.zeros(shape, np.float32)
    return RopeEpilogueCase(positions, slots, cos, sin, zeros, zeros.copy(), args)
