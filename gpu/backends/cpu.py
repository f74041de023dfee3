"""The numpy backend: float32 compute on the CPU.

It is the oracle every CUDA kernel is tested against and the fallback that makes tinychat
work on a machine with no NVIDIA GPU. It uses the GPU's paged KV layout so the engine above it
is the same code on both. Written for clarity first, then for the few places where numpy can
be fast (matrix products through BLAS, attention vectorised over heads).
"""

from __future__ import annotations

import numpy as np

from gpu.backends.base import Array, ComposedOps
from gpu.backends.cpu_threads import resolve_threads, set_cpu_threads
from gpu.forward_batch import ForwardBatch
from gpu.sampling import SamplingMetadata
from gpu.sampling.numpy_sampler import sample as numpy_sample
from gpu.sampling.token_state import new_state, write_states

_DTYPES = {"f32": np.float32, "act": np.float32, "int32": np.int32}

# Up to this many rows, a product runs as one matrix-vector product per row: OpenBLAS's sgemm
# packs the whole weight for a handful of rows, and at 2 rows it took 5x one gemv (0.69 against
# 0.14 ms for a [3072, 576] weight), which made batch 2 slower in total than batch 1.
GEMV_ROWS = 4


def silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-x) = inf for very negative x gives silu = -0
        return x / (np.float32(1.0) + np.exp(-x))


def rotate_half_inplace(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> None:
    """x [T, heads, hd] rotated in place by cos/sin [T, 1, hd/2] (HF's rotate-half pairing)."""
    half = x.shape[-1] // 2
    x1 = x[..., :half].copy()
    x2 = x[..., half:]
    x[..., :half] = x1 * cos - x2 * sin
    x[..., half:] = x2 * cos + x1 * sin


class CpuBackend(ComposedOps):
    name = "cpu"
    weight_format = "f32"  # weights are upcast to float32 once, at load
    kv_element_bytes = 4
    token_state: np.ndarray | None = None  # the sampler's (reserve_token_state)
    fast_sampling = False  # the oracle samples as numpy_sampler's twin, sorts and all

    def __init__(self, threads: int | None = None) -> None:
        """`threads`: BLAS threads (None: every core this process may use, cpu_threads.py)."""
        self.threads = resolve_threads(threads)
        set_cpu_threads(self.threads)

    def num_kv_blocks(self, bytes_per_block: int, config) -> int:
        """As many blocks as the configured CPU KV space holds (numpy zeros are lazily
        backed by the OS, so unused blocks cost no memory)."""
        return max(1, config.cpu_kv_cache_bytes // bytes_per_block)

    # --- memory -------------------------------------------------------------------------
    def empty(self, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        return np.zeros(shape, dtype=_DTYPES[dtype])

    def weight(self, array: np.ndarray, kind: str) -> np.ndarray:
        if array.dtype == np.uint16:  # bf16 bits -> float32
            array = (array.astype(np.uint32) << 16).view(np.float32)
        return np.ascontiguousarray(array, dtype=np.float32)

    def allocate_kv_cache(
        self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        return [
            (np.zeros(shape, np.float32), np.zeros(shape, np.float32)) for _ in range(num_layers)
        ]

    def to_host(self, array: Array) -> np.ndarray:
        return np.asarray(array)

    def synchronize(self) -> None:
        pass

    # --- the forward --------------------------------------------------------------------
    def embed(
        self,
        input_ids: np.ndarray,
        table: np.ndarray,
        out: np.ndarray,
        prev_rows: np.ndarray | None = None,
        sampled_prev: np.ndarray | None = None,
    ) -> None:
        if prev_rows is not None and prev_rows.size and prev_rows.max() >= 0:
            in_flight = prev_rows >= 0
            input_ids = np.where(
                in_flight, sampled_prev[np.where(in_flight, prev_rows, 0)], input_ids
            )
        np.take(table, input_ids, axis=0, out=out)

    def rmsnorm(self, x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray) -> None:
        variance = np.mean(np.square(x), axis=-1, keepdims=True)
        np.multiply(x / np.sqrt(variance + np.float32(eps)), weight, out=out)

    def linear(self, x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
        if x.shape[0] <= GEMV_ROWS:
            for t in range(x.shape[0]):
                np.matmul(w, x[t], out=out[t])
        else:
            np.matmul(x, w.T, out=out)

    def linear_residual(
        self, x: np.ndarray, w: np.ndarray, residual: np.ndarray, scratch: np.ndarray
    ) -> None:
        self.linear(x, w, scratch)
        residual += scratch

    def rope_kv_write(
        self,
        qkv: np.ndarray,
        positions: np.ndarray,
        cos: np.ndarray,
        sin: np.ndarray,
        k_cache: np.ndarray,
        v_cache: np.ndarray,
        slot_mapping: np.ndarray,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
    ) -> None:
        t = qkv.shape[0]
        q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim
        q = qkv[:, :q_size].reshape(t, num_heads, head_dim)
        k = qkv[:, q_size : q_size + kv_size].reshape(t, num_kv_heads, head_dim)
        v = qkv[:, q_size + kv_size :].reshape(t, num_kv_heads, head_dim)
        c = cos[positions][:, None, :]
        s = sin[positions][:, None, :]
        rotate_half_inplace(q, c, s)
        rotate_half_inplace(k, c, s)
        valid = slot_mapping >= 0
        slots = slot_mapping[valid]
        block_size = k_cache.shape[1]
        blocks, offsets = slots // block_size, slots % block_size
        k_cache[blocks, offsets] = k[valid]
        v_cache[blocks, offsets] = v[valid]

    def attention(
        self,
        qkv: np.ndarray,
        k_cache: np.ndarray,
        v_cache: np.ndarray,
        batch: ForwardBatch,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        out: np.ndarray,
    ) -> None:
        block_size = k_cache.shape[1]
        group = num_heads // num_kv_heads
        qsl, seq_lens = batch.query_start_loc, batch.seq_lens
        for b in range(batch.num_seqs):
            start, end = int(qsl[b]), int(qsl[b + 1])
            q_len, ctx = end - start, int(seq_lens[b])
            if q_len == 0:
                continue
            n_blocks = -(-ctx // block_size)
            blocks = batch.block_tables[b, :n_blocks]
            # [ctx, nkv, hd] -> [nkv, ctx, hd]
            k = k_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:ctx].transpose(1, 0, 2)
            v = v_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:ctx].transpose(1, 0, 2)
            # q [q_len, nh, hd] -> [nkv, group * q_len, hd]: each KV head serves `group` heads.
            q = qkv[start:end, : num_heads * head_dim].reshape(q_len, num_kv_heads, group, head_dim)
            q = q.transpose(1, 2, 0, 3).reshape(num_kv_heads, group * q_len, head_dim)
            scores = np.matmul(q, k.transpose(0, 2, 1)) * np.float32(scale)  # [nkv, g*q, ctx]
            query_pos = ctx - q_len + np.arange(q_len)
            causal = np.arange(ctx)[None, :] > query_pos[:, None]  # [q_len, ctx]
            scores = scores.reshape(num_kv_heads, group, q_len, ctx)
            scores[:, :, causal] = -np.inf
            scores -= scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            o = np.matmul(probs.reshape(num_kv_heads, group * q_len, ctx), v)  # [nkv, g*q, hd]
            o = o.reshape(num_kv_heads, group, q_len, head_dim).transpose(2, 0, 1, 3)
            out[start:end] = o.reshape(q_len, num_heads * head_dim)

    def silu_mul(self, gate_up: np.ndarray, out: np.ndarray) -> None:
        inter = out.shape[-1]
        gate, up = gate_up[:, :inter], gate_up[:, inter:]
        np.multiply(silu(gate), up, out=out)

    def gather_rows(self, x: np.ndarray, indices: np.ndarray, out: np.ndarray) -> None:
        np.take(x, indices, axis=0, out=out)

    def reserve_token_state(self, num_rows: int, vocab: int) -> None:
        """The sampler's token-state table (gpu/sampling/token_state.py): one uint16 row per
        sequence that can run at once."""
        self.token_state = new_state(num_rows, vocab)

    def sample(self, logits: np.ndarray, metadata: SamplingMetadata) -> np.ndarray:
        """The step's state writes, then the numpy sampler, which counts the sampled tokens in
        the rows with state."""
        if self.token_state is None and (metadata.state_writes or metadata.has_state):
            raise RuntimeError("token state used before reserve_token_state")
        write_states(self.token_state, metadata.state_writes)
        return numpy_sample(np.asarray(logits), metadata, self.token_state, self.fast_sampling)
