"""The cuda backend: the operations of gpu/backends/base.py as Numba kernels and cuBLAS calls.

Dtypes on the device: weights and the KV cache are bf16 (stored as uint16 bits), norm weights
and rope tables float32, the residual stream, projection outputs and logits float32, and the
inputs of matrix products ("act") bf16. Every op is launched on the backend's one stream, never
allocates (buffers come from `empty`, once), and never waits for the GPU, so a step can be
captured into a CUDA graph. Set `debug=True` (or TINYCHAT_CUDA_DEBUG=1) to synchronise and
surface errors after every op, naming it.

Each op's kernel and its numpy twin: see gpu/kernels/*.py and gpu/backends/cpu.py.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
from numba import cuda

from gpu.backends.base import Ceilings, ComposedOps
from gpu.backends.cuda.cublas import CublasGemm, SimulatorGemm
from gpu.backends.cuda.sampler import DeviceSampler
from gpu.forward_batch import ForwardBatch
from gpu.kernels import (
    activation,
    attention_decode,
    attention_prefill,
    embedding,
    gemv,
    gemv_mma,
    rmsnorm,
)
from gpu.kernels import rope_kv as rope_kernels
from gpu.kernels.bf16 import from_bf16_bits, to_bf16_bits
from gpu.kernels.launch import SIMULATOR
from gpu.sampling import SamplingMetadata

log = logging.getLogger(__name__)

_DTYPES = {"f32": np.float32, "act": np.uint16, "int32": np.int32}
# Room left beside the KV cache for what the executor allocates after it: step inputs, the
# sampler's penalty scratch, split-KV partials, the cuBLAS workspace, CUDA's own needs.
RESERVE_BYTES = 1 << 30
# Steps of up to this many rows may split their short prompt chunks' keys (attention_prefill
# SPLITS); the partials then take 512 x 32 heads x 4 splits x 66 floats = 17 MB at Llama-3.2-1B.
PREFILL_SPLIT_MAX_TOKENS = 512


class CudaBackend(ComposedOps):
    name = "cuda"
    weight_format = "bf16"
    kv_element_bytes = 2

    def __init__(self, debug: bool | None = None) -> None:
        self.debug = os.environ.get("TINYCHAT_CUDA_DEBUG") == "1" if debug is None else debug
        self.stream = cuda.stream()
        self.gemm = SimulatorGemm(self.stream) if SIMULATOR else CublasGemm(self.stream)
        # The simulator runs blocks one after another: pretend to be a 4-SM GPU there, which
        # still splits the KV of small batches.
        self.num_sms = 4 if SIMULATOR else cuda.get_current_device().MULTIPROCESSOR_COUNT
        self.kv_cache_bytes = 0
        self.vocab_size = 0
        self._part_acc = cuda.device_array(1, np.float32)
        self._part_ml = cuda.device_array(1, np.float32)
        self._split_counters = cuda.to_device(np.zeros(1, np.int32))  # zero, and kept zero
        self._prefill_o = cuda.device_array(1, np.float32)  # split prefill partials
        self._prefill_ml = cuda.device_array(1, np.float32)
        self._sampler: DeviceSampler | None = None

    # --- memory -------------------------------------------------------------------------
    def empty(self, shape: tuple[int, ...], dtype: str) -> Any:
        return cuda.device_array(shape, dtype=_DTYPES[dtype], stream=self.stream)

    def weight(self, array: np.ndarray, kind: str) -> Any:
        if kind == "vector":
            if array.dtype == np.uint16:
                array = from_bf16_bits(array)
            host = np.ascontiguousarray(array, dtype=np.float32)
        else:  # "matrix" or "embedding": bf16 bits
            host = array if array.dtype == np.uint16 else to_bf16_bits(array)
            host = np.ascontiguousarray(host)
            if kind == "embedding":
                self.vocab_size = host.shape[0]
        return cuda.to_device(host, stream=self.stream)

    def allocate_kv_cache(
        self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int
    ) -> list[tuple[Any, Any]]:
        """One allocation for all layers, viewed as a (k_cache, v_cache) pair per layer."""
        shape = (num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)
        cache = cuda.device_array(shape, dtype=np.uint16, stream=self.stream)
        self.kv_cache_bytes = cache.nbytes
        return [(cache[i, 0], cache[i, 1]) for i in range(num_layers)]

    def num_kv_blocks(self, bytes_per_block: int, config: Any) -> int:
        """KV blocks that fit in gpu_memory_utilization of the memory free after weights and
        activations, less a reserve for the executor's buffers; logged."""
        if SIMULATOR:
            return 64
        free, total = cuda.current_context().get_memory_info()
        budget = int(free * config.gpu_memory_utilization) - RESERVE_BYTES
        sampler = config.max_num_seqs * max(self.vocab_size, 1) * 4
        blocks = max(1, (budget - sampler) // bytes_per_block)
        log.info(
            "KV cache: %d blocks of %d tokens = %d tokens, %.2f GiB (GPU: %.1f of %.1f GiB free)",
            blocks, config.block_size, blocks * config.block_size,
            blocks * bytes_per_block / 2**30, free / 2**30, total / 2**30,
        )  # fmt: skip
        return int(blocks)

    def create_executor(self, model: Any, config: Any = None) -> Any:
        from gpu.backends.cuda.executor import CudaExecutor

        return CudaExecutor(model, self, config)

    def reserve_attention_scratch(
        self, max_seqs: int, num_heads: int, num_kv_heads: int, head_dim: int
    ) -> None:
        """Allocate the split-KV partials and counters for every decode batch size up to
        max_seqs, now."""
        acc = ml = cnt = 1
        for s in range(1, max_seqs + 1):
            splits = attention_decode.choose_num_splits(s, num_kv_heads, self.num_sms)
            a, m = attention_decode.partial_sizes(s, num_heads, head_dim, splits)
            acc, ml = max(acc, a), max(ml, m)
            cnt = max(cnt, attention_decode.counter_size(s, num_kv_heads, splits))
        if self._part_acc.shape[0] < acc:
            self._part_acc = cuda.device_array(acc, np.float32, stream=self.stream)
        if self._part_ml.shape[0] < ml:
            self._part_ml = cuda.device_array(ml, np.float32, stream=self.stream)
        if self._split_counters.shape[0] < cnt:
            # Zeroed once: the decode kernel leaves every counter it uses at zero again.
            self._split_counters = cuda.to_device(np.zeros(cnt, np.int32))

    def reserve_prefill_scratch(self, max_tokens: int, num_heads: int, head_dim: int) -> None:
        """Allocate the split prefill partials for steps of up to max_tokens rows, now (at
        most PREFILL_SPLIT_MAX_TOKENS: larger steps do not split; their grids are full)."""
        rows = min(max_tokens, PREFILL_SPLIT_MAX_TOKENS)
        o, ml = attention_prefill.split_sizes(rows, num_heads, head_dim, attention_prefill.SPLITS)
        if self._prefill_o.shape[0] < o:
            self._prefill_o = cuda.device_array(o, np.float32, stream=self.stream)
        if self._prefill_ml.shape[0] < ml:
            self._prefill_ml = cuda.device_array(ml, np.float32, stream=self.stream)

    def device_name(self) -> str:
        name = cuda.get_current_device().name
        return name.decode() if isinstance(name, bytes) else str(name)

    def measure_ceilings(self) -> Ceilings:
        """The two ceilings of the roofline, measured here (the bench's floors use them):
        a 1 GiB device-to-device copy (bytes read + written) and a bf16 8192^3 cuBLAS GEMM.
        Random data, not zeros (zeros run faster), timed with CUDA events after a warm-up."""

        def time_us(fn, reps: int) -> float:
            fn()
            start, end = cuda.event(), cuda.event()
            start.record(self.stream)
            for _ in range(reps):
                fn()
            end.record(self.stream)
            end.synchronize()
            return cuda.event_elapsed_time(start, end) * 1e3 / reps

        n = 1 << 30
        a = cuda.device_array(n, np.uint8, stream=self.stream)
        b = cuda.device_array(n, np.uint8, stream=self.stream)
        copy_us = time_us(lambda: b.copy_to_device(a, stream=self.stream), 10)
        m = 8192
        rng = np.random.default_rng(0)
        x = cuda.to_device(to_bf16_bits(rng.standard_normal((m, m), np.float32)), self.stream)
        y = cuda.device_array((m, m), np.float32, stream=self.stream)
        gemm_us = time_us(lambda: self.gemm.linear(x, x, y), 10)
        return Ceilings(2 * n / (copy_us * 1e-6), 2 * m**3 / (gemm_us * 1e-6), self.device_name())

    def to_host(self, array: Any) -> np.ndarray:
        """A host copy; bf16 ("act") arrays come back as float32 values."""
        host = array.copy_to_host(stream=self.stream)
        self.stream.synchronize()
        return from_bf16_bits(host) if host.dtype == np.uint16 else host

    def synchronize(self) -> None:
        self.stream.synchronize()

    def check(self, op: str) -> None:
        """In debug mode, wait for the GPU and name the op that failed."""
        if self.debug:
            try:
                self.stream.synchronize()
            except Exception as exc:
                raise RuntimeError(f"CUDA error in {op}: {exc}") from exc

    # --- the forward --------------------------------------------------------------------
    def embed(
        self, input_ids: Any, table: Any, out: Any, prev_rows: Any = None, sampled_prev: Any = None
    ) -> None:
        embedding.embed(input_ids, table, out, self.stream, prev_rows, sampled_prev)
        self.check("embed")

    def rmsnorm(self, x: Any, weight: Any, eps: float, out: Any) -> None:
        rmsnorm.rmsnorm(x, weight, eps, out, self.stream)
        self.check("rmsnorm")

    # Matrix products: a one-token step streams the weights through gemv.py's kernel with the
    # ops around the product fused in; a step of 2-8 tokens through gemv_mma.py's (tensor
    # cores; the RMSNorm before it a kernel of its own); larger steps go to cuBLAS, with the
    # fused ops composed from the basic kernels (ComposedOps) or folded into cuBLAS (beta = 1).
    def _rmsnorm_mma(
        self, op, residual, norm_weight, eps, normed, w, out, epilogue="store", rope=None
    ) -> None:
        """A fused op of a 2-8-token step: the rmsnorm kernel, then gemv_mma.py's product with
        the op's epilogue."""
        self.rmsnorm(residual, norm_weight, eps, normed)
        gemv_mma.gemv_mma(normed, w, out, epilogue=epilogue, rope=rope, stream=self.stream)
        self.check(op)

    def linear(self, x: Any, w: Any, out: Any) -> None:
        """The plain product: the model reaches it only through the composed ops, i.e. for
        steps the fused kernels do not serve, so it is always cuBLAS."""
        self.gemm.linear(x, w, out)
        self.check("linear")

    def rmsnorm_linear(
        self, residual: Any, norm_weight: Any, eps: float, w: Any, out: Any, normed: Any
    ) -> None:
        if gemv_mma.serves(residual.shape[0], w):
            return self._rmsnorm_mma("rmsnorm_linear", residual, norm_weight, eps, normed, w, out)
        if not gemv.serves(*residual.shape):
            return super().rmsnorm_linear(residual, norm_weight, eps, w, out, normed)
        gemv.gemv(
            None, w, out, residual=residual, norm_weight=norm_weight, eps=eps, stream=self.stream
        )
        self.check("rmsnorm_linear")

    def rmsnorm_qkv_rope(
        self, residual, norm_weight, eps, w, qkv, normed, positions, cos, sin, k_cache, v_cache,
        slot_mapping, num_heads, num_kv_heads, head_dim,
    ) -> None:  # fmt: skip
        rope = gemv.RopeArgs(
            positions, cos, sin, k_cache, v_cache, slot_mapping, num_heads, head_dim
        )
        if gemv_mma.serves(residual.shape[0], w):
            return self._rmsnorm_mma(
                "rmsnorm_qkv_rope", residual, norm_weight, eps, normed, w, qkv, "rope", rope
            )
        if not gemv.serves(*residual.shape):
            return super().rmsnorm_qkv_rope(
                residual, norm_weight, eps, w, qkv, normed, positions, cos, sin, k_cache,
                v_cache, slot_mapping, num_heads, num_kv_heads, head_dim,
            )  # fmt: skip
        gemv.gemv(
            None, w, qkv, epilogue="rope", residual=residual, norm_weight=norm_weight, eps=eps,
            rope=rope, stream=self.stream,
        )  # fmt: skip
        self.check("rmsnorm_qkv_rope")

    def linear_residual(self, x: Any, w: Any, residual: Any, scratch: Any) -> None:
        if gemv.serves(*x.shape):
            gemv.gemv(x, w, residual, epilogue="add", stream=self.stream)
        elif gemv_mma.serves(x.shape[0], w):
            gemv_mma.gemv_mma(x, w, residual, epilogue="add", stream=self.stream)
        else:
            self.gemm.linear(x, w, residual, accumulate=True)
        self.check("linear_residual")

    def rmsnorm_gate_up_silu(
        self,
        residual: Any,
        norm_weight: Any,
        eps: float,
        w: Any,
        out: Any,
        normed: Any,
        gate_up: Any,
    ) -> None:
        if gemv_mma.serves(residual.shape[0], w):
            return self._rmsnorm_mma(
                "rmsnorm_gate_up_silu", residual, norm_weight, eps, normed, w, out, "silu"
            )
        if not gemv.serves(*residual.shape):
            return super().rmsnorm_gate_up_silu(residual, norm_weight, eps, w, out, normed, gate_up)
        gemv.gemv(
            None, w, out, epilogue="silu", residual=residual, norm_weight=norm_weight, eps=eps,
            stream=self.stream,
        )  # fmt: skip
        self.check("rmsnorm_gate_up_silu")

    def rope_kv_write(
        self,
        qkv: Any,
        positions: Any,
        cos: Any,
        sin: Any,
        k_cache: Any,
        v_cache: Any,
        slot_mapping: Any,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
    ) -> None:
        rope_kernels.rope_kv_write(
            qkv, positions, cos, sin, k_cache, v_cache, slot_mapping,
            num_heads, num_kv_heads, head_dim, self.stream,
        )  # fmt: skip
        self.check("rope_kv_write")

    def attention(
        self,
        qkv: Any,
        k_cache: Any,
        v_cache: Any,
        batch: ForwardBatch,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        out: Any,
    ) -> None:
        """The split-KV decode kernel for the sequences with one query row this step, the
        prefill kernel for those with more (a mixed step runs both, each skipping the other's).

        batch must be a DeviceForwardBatch (device arrays, flat block table + stride)."""
        tables, stride = batch.block_tables, batch.block_table_stride
        splits = attention_decode.choose_num_splits(batch.num_seqs, num_kv_heads, self.num_sms)
        acc, ml = attention_decode.partial_sizes(batch.num_seqs, num_heads, head_dim, splits)
        cnt = attention_decode.counter_size(batch.num_seqs, num_kv_heads, splits)
        if (
            acc > self._part_acc.shape[0]
            or ml > self._part_ml.shape[0]
            or cnt > self._split_counters.shape[0]
        ):
            self.reserve_attention_scratch(batch.num_seqs, num_heads, num_kv_heads, head_dim)
        warp_heads_ctx = attention_decode.choose_warp_heads_ctx(
            batch.num_seqs, num_kv_heads, self.num_sms, splits, head_dim, num_heads // num_kv_heads
        )
        attention_decode.decode_attention(
            qkv, k_cache, v_cache, tables, stride, batch.query_start_loc, batch.seq_lens,
            batch.num_seqs, num_heads, scale, out, self._part_acc, self._part_ml,
            splits, self.stream, counters=self._split_counters, warp_heads_ctx=warp_heads_ctx,
        )  # fmt: skip
        if batch.max_query_len > 1:
            attention_prefill.prefill_attention(
                qkv, k_cache, v_cache, tables, stride, batch.query_start_loc, batch.seq_lens,
                batch.num_seqs, batch.max_query_len, num_heads, scale, out, self.stream,
                decode_rows=False, part_o=self._prefill_o, part_ml=self._prefill_ml,
            )  # fmt: skip
        self.check("attention")

    def silu_mul(self, gate_up: Any, out: Any) -> None:
        activation.silu_mul(gate_up, out, self.stream)
        self.check("silu_mul")

    def gather_rows(self, x: Any, indices: Any, out: Any) -> None:
        embedding.gather_rows(x, indices, out, self.stream)
        self.check("gather_rows")

    def sample(self, logits: Any, metadata: SamplingMetadata) -> np.ndarray:
        """Sample on the device (logits are modified in place); returns host int32 ids."""
        rows, vocab = logits.shape
        s = self._sampler
        if s is None or s.max_rows < rows or s.vocab_size != vocab:
            self._sampler = s = DeviceSampler(max(rows, 64), vocab, self.stream)
        ids = s.sample(logits, metadata)
        self.check("sample")
        return ids
