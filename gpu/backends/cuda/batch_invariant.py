"""The batch-invariant mode (EngineConfig.batch_invariant): a sequence's tokens do not depend on
the batch it runs in.

Why the default engine is not. Float sums round, and their order decides how: a request's
logits are bit-for-bit the same in two steps only if every op sums that request's numbers in
the same order in both. The default cuda backend picks its kernels by the step's shape, for
speed: a one-token step streams the weights through gemv.py (the RMSNorm in its prologue),
2-8 tokens through gemv_mma.py, more through cuBLAS, whose heuristic picks a kernel (and a
split of K) by the row count; decode attention splits a context into a number of parts chosen
by the batch size; prompt chunks take narrow or wide tiles by their length and the step's
sequence count, split or not. So the same seeded request, alone and among 255 others, differs
in the last bits of its logits, and a sample whose top candidates were that close takes
another token: 190 of 256 seeded streams of 128 tokens differed from their runs alone on an
H100 (`tinychat bench serve --check`, temperature 0.8, top-p 0.95), and 0 of 256 in this mode.

What the mode changes, op by op, so that a row's arithmetic depends on that row alone:

* Matrix products: always cuBLAS, always called with the same shape. InvariantGemm cuts a
  step's rows into chunks of CHUNK_ROWS and runs every chunk as its own product of exactly
  CHUNK_ROWS rows; the last, partial chunk goes through a scratch block of CHUNK_ROWS rows (its
  rows copied in, the result copied out). One shape, one cuBLAS kernel, one order of the sum
  over K for every row wherever it sits; a row's result never reads another row. The ops around
  a product are the basic kernels (rmsnorm, rope + KV write, SiLU, the residual add as cuBLAS's
  beta = 1): row by row, each in one fixed order.
* Attention: every row, decode rows included, through the prefill kernel's wide tiles, unsplit
  (attention_prefill.prefill_attention(invariant=True)): a row walks its KV tiles from
  position 0 in tiles of a fixed size, whatever chunk or step it came in, and the tiles past
  its own position add exactly nothing. Chunked prefill and the prefix cache keep the tokens:
  a token's K and V are row-wise products of its own row, the same in any chunk.
* Sampling: the sampler already is invariant (integer masses, counter-based noise by the
  request's seed and position).

The price: a decode step of one token computes CHUNK_ROWS rows, and decode attention walks each
context in one block per KV head. The mode is for checks and for users who need the same
tokens from the same seed whatever the load, as vLLM's batch-invariant mode is (also opt-in).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import cuda

from gpu.backends.base import ComposedOps
from gpu.backends.cuda.backend import CudaBackend
from gpu.backends.cuda.cublas import check_linear
from gpu.forward_batch import ForwardBatch
from gpu.kernels import attention_prefill

# Rows of every product call. A 64-row product streams the weights once, as a 1-row one does
# (cuBLAS serves batches of 9-64 decode tokens in the default mode too); a prefill step of
# 8,192 tokens makes 128 calls of it.
CHUNK_ROWS = 64


class InvariantGemm:
    """out = x @ w.T (or +=) as products of exactly `rows` rows each: see the module docstring.

    The scratch for the last chunk is sized by `reserve(max_k, max_n)`, which the backend calls
    as the weights arrive (never during a step, which may be under capture)."""

    def __init__(self, gemm: Any, stream: Any, rows: int = CHUNK_ROWS) -> None:
        self.gemm, self.stream, self.rows = gemm, stream, rows
        self.max_k = self.max_n = 0
        self._x = self._out_f32 = self._out_bf16 = None

    def reserve(self, max_k: int, max_n: int) -> None:
        # Zeros: the rows past a partial chunk are computed and dropped; zeros keep them finite.
        c = self.rows
        if max_k > self.max_k:
            self.max_k = max_k
            self._x = cuda.to_device(np.zeros(c * max_k, np.uint16), stream=self.stream)
        if max_n > self.max_n:
            self.max_n = max_n
            self._out_f32 = cuda.to_device(np.zeros(c * max_n, np.float32), stream=self.stream)
            self._out_bf16 = cuda.to_device(np.zeros(c * max_n, np.uint16), stream=self.stream)

    def linear(self, x: Any, w: Any, out: Any, accumulate: bool = False) -> None:
        if not check_linear(x, w, out):
            return
        (t, k), n, c = x.shape, w.shape[0], self.rows
        if x.strides[0] != k * x.dtype.itemsize or out.strides[0] != n * out.dtype.itemsize:
            raise ValueError("the batch-invariant product takes whole rows (contiguous x, out)")
        whole = t - t % c
        for r0 in range(0, whole, c):
            self.gemm.linear(x[r0 : r0 + c], w, out[r0 : r0 + c], accumulate)
        if whole == t:
            return
        if k > self.max_k or n > self.max_n:
            raise ValueError(f"no scratch reserved for a product of K {k}, N {n}")
        r = t - whole
        xs = self._x[: c * k].reshape(c, k)
        scratch = self._out_f32 if out.dtype == np.float32 else self._out_bf16
        outs = scratch[: c * n].reshape(c, n)
        xs[:r].copy_to_device(x[whole:], stream=self.stream)
        if accumulate:
            outs[:r].copy_to_device(out[whole:], stream=self.stream)
        self.gemm.linear(xs, w, outs, accumulate)
        out[whole:].copy_to_device(outs[:r], stream=self.stream)

    def close(self) -> None:
        self.gemm.close()


class BatchInvariantCudaBackend(CudaBackend):
    """The cuda backend with the batch-invariant ops of the module docstring."""

    def __init__(self, debug: bool | None = None) -> None:
        super().__init__(debug)
        self.gemm = InvariantGemm(self.gemm, self.stream)

    def weight(self, array: np.ndarray, kind: str) -> Any:
        if kind in ("matrix", "embedding"):  # an embedding may be the tied LM head
            n, k = array.shape
            self.gemm.reserve(k, n)
        return super().weight(array, kind)

    # Every fused op as its composition: the basic kernels and InvariantGemm.
    def rmsnorm_linear(self, residual, norm_weight, eps, w, out, normed) -> None:
        ComposedOps.rmsnorm_linear(self, residual, norm_weight, eps, w, out, normed)

    def rmsnorm_qkv_rope(self, *args) -> None:
        ComposedOps.rmsnorm_qkv_rope(self, *args)

    def rmsnorm_gate_up_silu(self, residual, norm_weight, eps, w, out, normed, gate_up) -> None:
        ComposedOps.rmsnorm_gate_up_silu(self, residual, norm_weight, eps, w, out, normed, gate_up)

    def linear_residual(self, x: Any, w: Any, residual: Any, scratch: Any) -> None:
        self.gemm.linear(x, w, residual, accumulate=True)
        self.check("linear_residual")

    def attention(
        self, qkv, k_cache, v_cache, batch: ForwardBatch, num_heads, num_kv_heads, head_dim,
        scale, out,
    ) -> None:  # fmt: skip
        """Every row through the prefill kernel's wide tiles, unsplit (decode rows too)."""
        # The split scratch goes unused unsplit; passed so that no step allocates a stand-in.
        attention_prefill.prefill_attention(
            qkv, k_cache, v_cache, batch.block_tables, batch.block_table_stride,
            batch.query_start_loc, batch.seq_lens, batch.num_seqs, batch.max_query_len,
            num_heads, scale, out, self.stream, part_o=self._prefill_o,
            part_ml=self._prefill_ml, invariant=True,
        )  # fmt: skip
        self.check("attention")
