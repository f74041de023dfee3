"""The operations a Llama forward is made of: the contract between the model and a backend.

`gpu/model.py` writes the forward once in terms of these; `backends/cpu.py` implements them in
numpy (float32) and is the oracle; `backends/cuda/` implements them with Numba kernels and
cuBLAS. Every op writes into an `out` buffer the caller allocated once with `empty`, so the
same sequence of calls can be captured into a CUDA graph and replayed with no allocation.

Dtypes: the residual stream, projection outputs and logits are float32 ("f32"); the inputs of
matrix products are the backend's activation dtype ("act": float32 on the CPU, bf16 on the
GPU); ids, positions and slots are int32.

KV cache layout, per layer: k_cache and v_cache of shape [num_blocks, block_size, num_kv_heads,
head_dim]. Token t of a sequence lives in block `block_table[t // block_size]` at offset
`t % block_size`; its flat slot is block * block_size + offset (`slot_mapping`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from gpu.forward_batch import ForwardBatch
from gpu.sampling import SamplingMetadata

Array = Any  # a numpy array on the cpu backend, a Numba device array on the cuda backend


class ForwardModel(Protocol):
    """What a backend's executor runs: the model's forward over a prepared batch (gpu/model.py's
    LlamaModel), returning the logits of its sampled rows, and the buffers the executor sizes
    its step inputs from. A protocol, so that a backend never imports the model written
    against it."""

    residual: Array  # [max_tokens, hidden]
    logits: Array  # [max_seqs, vocab]
    kv_caches: list[tuple[Array, Array]]  # per layer: [blocks, block_size, kv_heads, head_dim]
    cos: Array  # the rope table, a row per position the model supports
    weights: Any
    num_heads: int
    num_kv_heads: int
    head_dim: int

    def forward(self, batch: ForwardBatch, num_logits: int) -> Array: ...


class StepResult(Protocol):
    """A launched step: result() waits for its sampled ids (one per sampled row)."""

    def result(self) -> np.ndarray: ...


class ReadyResult:
    """The result of a step computed at launch (the cpu backend, test stubs)."""

    __slots__ = ("tokens",)

    def __init__(self, tokens: np.ndarray) -> None:
        self.tokens = tokens

    def result(self) -> np.ndarray:
        return self.tokens


@dataclass
class Ceilings:
    """A device's two roofline ceilings, as its backend measures them (gpu/bench/roofline.py)."""

    bandwidth_Bps: float  # device copy bandwidth, bytes read + written per second
    matmul_flops: float  # dense matrix-product rate in the compute dtype
    source: str


class Backend(Protocol):
    name: str  # "cpu" | "cuda"

    # --- memory -------------------------------------------------------------------------
    def empty(self, shape: tuple[int, ...], dtype: str) -> Array:
        """A buffer of "f32", "act" or "int32" elements, allocated once."""

    def weight(self, array: np.ndarray, kind: str) -> Array:
        """Place a float32 (or bf16-bits uint16) host array on the backend.

        kind "matrix": a [N, K] projection (stored as "act"); "vector": a norm weight (f32);
        "embedding": the [V, H] token table (stored as "act").
        """

    def allocate_kv_cache(
        self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int
    ) -> list[tuple[Array, Array]]:
        """One (k_cache, v_cache) pair per layer."""

    def to_host(self, array: Array) -> np.ndarray: ...

    def synchronize(self) -> None: ...

    # --- the forward --------------------------------------------------------------------
    def embed(
        self,
        input_ids: Array,
        table: Array,
        out: Array,
        prev_rows: Array | None = None,
        sampled_prev: Array | None = None,
    ) -> None:
        """out[t] = table[token] (as float32), token = sampled_prev[prev_rows[t]] where
        prev_rows[t] >= 0 (a token the previous step sampled on the device: async scheduling),
        else input_ids[t]. prev_rows None: every token is input_ids[t]."""

    def rmsnorm(self, x: Array, weight: Array, eps: float, out: Array) -> None:
        """out = x / sqrt(mean(x**2) + eps) * weight, row by row."""

    def linear(self, x: Array, w: Array, out: Array) -> None:
        """out = x @ w.T for x [T, K] and w [N, K] (PyTorch's nn.Linear layout)."""

    # The fused ops of a layer (ComposedOps below spells out what each computes).
    def rmsnorm_linear(
        self, residual: Array, norm_weight: Array, eps: float, w: Array, out: Array, normed: Array
    ) -> None:
        """out = rmsnorm(residual) * norm_weight @ w.T (`normed`: scratch [T, K] "act")."""

    def rmsnorm_qkv_rope(
        self,
        residual: Array,
        norm_weight: Array,
        eps: float,
        w: Array,
        qkv: Array,
        normed: Array,
        positions: Array,
        cos: Array,
        sin: Array,
        k_cache: Array,
        v_cache: Array,
        slot_mapping: Array,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
    ) -> None:
        """qkv = rmsnorm(residual) * norm_weight @ w.T, then rope_kv_write on it."""

    def linear_residual(self, x: Array, w: Array, residual: Array, scratch: Array) -> None:
        """residual += x @ w.T (`scratch`: [T, N] "f32")."""

    def rmsnorm_gate_up_silu(
        self,
        residual: Array,
        norm_weight: Array,
        eps: float,
        w: Array,
        out: Array,
        normed: Array,
        gate_up: Array,
    ) -> None:
        """out = silu_mul(rmsnorm(residual) * norm_weight @ w.T) for w = [gate; up] [2I, K]
        (`normed`, `gate_up`: scratch)."""

    def rope_kv_write(
        self,
        qkv: Array,
        positions: Array,
        cos: Array,
        sin: Array,
        k_cache: Array,
        v_cache: Array,
        slot_mapping: Array,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
    ) -> None:
        """Rotate q and k of each row of qkv [T, (nh + 2 nkv) * hd] in place (rotate-half), and
        write k and v into the caches at slot_mapping (rows with a negative slot are skipped)."""

    def attention(
        self,
        qkv: Array,
        k_cache: Array,
        v_cache: Array,
        batch: ForwardBatch,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        out: Array,
    ) -> None:
        """Causal attention of the q part of qkv over each sequence's paged context.

        Query row j of sequence b sits at position seq_lens[b] - q_len_b + j and attends to
        context positions 0..that position. GQA: query head h reads KV head h // (nh // nkv).
        out [T, nh * hd].
        """

    def silu_mul(self, gate_up: Array, out: Array) -> None:
        """out = silu(gate) * up where gate_up [T, 2I] = [gate | up]."""

    def gather_rows(self, x: Array, indices: Array, out: Array) -> None:
        """out[i] = x[indices[i]]."""

    def sample(self, logits: Array, metadata: SamplingMetadata) -> np.ndarray:
        """One token id per row of logits [S, V]; returns a host int32 array."""

    def decode_forward(self, model: ForwardModel, batch: ForwardBatch, logits: Array) -> bool:
        """A decode step after embed, every layer and the LM head in one call, into logits;
        False where the backend has no such path (ComposedOps: the model runs the ops)."""


class ComposedOps:
    """The fused ops of a layer as compositions of the basic ones.

    This is what a fused kernel must compute (the cpu backend, the oracle, runs exactly this),
    and the path a backend falls back to for shapes its fused kernels do not serve (the cuda
    backend's prefill steps).
    """

    def rmsnorm_linear(self, residual, norm_weight, eps, w, out, normed) -> None:
        self.rmsnorm(residual, norm_weight, eps, normed)
        self.linear(normed, w, out)

    def rmsnorm_qkv_rope(
        self, residual, norm_weight, eps, w, qkv, normed, positions, cos, sin, k_cache, v_cache,
        slot_mapping, num_heads, num_kv_heads, head_dim,
    ) -> None:  # fmt: skip
        self.rmsnorm_linear(residual, norm_weight, eps, w, qkv, normed)
        self.rope_kv_write(
            qkv, positions, cos, sin, k_cache, v_cache, slot_mapping,
            num_heads, num_kv_heads, head_dim,
        )  # fmt: skip

    def rmsnorm_gate_up_silu(self, residual, norm_weight, eps, w, out, normed, gate_up) -> None:
        self.rmsnorm(residual, norm_weight, eps, normed)
        self.linear(normed, w, gate_up)
        self.silu_mul(gate_up, out)

    def decode_forward(self, model, batch, logits) -> bool:
        return False
