"""The fast CPU path: the numpy backend with block-quantized weights and Numba products.

A decode step on a CPU is bound by its weights. The oracle (`cpu.py`) multiplies float32 copies
(4 bytes a weight); here every matrix, the embedding table (the tied LM head) included, is
quantized once at load into per-row int8 (q8) or Q4_1 blocks (q4) and multiplied by the Numba
kernels of gpu/kernels/cpu/quant_gemm.py, which dequantize in registers. Norms, RoPE, SiLU and
paged attention are Numba twins of the oracle's ops (one call each instead of many small numpy
calls) and sampling is the oracle's sampler with its `fast` option (the same draws), so the
engine above it (paged KV, prefix cache, continuous batching) is the same. The oracle stays
float32 and unchanged: every kernel here is tested against it.

On q8, a decode step (every row a decode row) runs its layers and LM head as one Numba
parallel region (`decode_forward`, gpu/kernels/cpu/decode_step.py): the second thread wakes
once a step instead of for each of its 151 products and attention calls (~13 us each, a fifth
of a batch-1 step). The default model on 2 cores, against the ops one by one: 95.8-105.6
against 64.1-69.7 tok/s at batch 1, 249-294 against 217-226 at batch 8; with a busy process
beside it, 49.8 against 55.9 at batch 1 (its threads sleep between steps and yield at a
barrier: no collapse). Prefill and q4 run the ops one by one.

q4 keeps the embedding table in per-row int8: in Q4_1 it cost the default model 3.5% of
perplexity (58.48 against float32's 56.49; 56.48 with the table in int8), and its
[49152, 576] head product takes 3.6 ms a token in Q4_1 against 1.2 ms in int8 (the default
model's GGUF holds that table as Q8_0 too).

Quantized once: loading a model folder (`use_weight_cache`), the quantized matrices are kept
in a file beside it (weights/quant_cache.py) and read back on the next load instead of being
quantized again (q4 took 0.9-1.1 s a load on the default model, q8 0.26 s).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

import numba
import numpy as np

from gpu.backends.cpu import CpuBackend
from gpu.backends.cpu_threads import set_cpu_threads
from gpu.kernels.cpu import elementwise as ew
from gpu.kernels.cpu import quant_gemm as qg
from gpu.kernels.cpu.attention import paged_attention
from gpu.kernels.cpu.barrier import new_state
from gpu.kernels.cpu.decode_step import decode_forward
from weights.quant_cache import load_quantized, save_quantized

log = logging.getLogger(__name__)
PRECISIONS = ("q8", "q4")  # the quantized CPU paths (float32: the oracle, cpu.py)
LAYOUT_VERSION = 4  # of the quantized arrays (quant_gemm.py): a change makes caches stale
CHECK_IN_CYCLES = 2_000_000_000  # ~1 s: a fused step's threads that have not all come by then
# were not given one share each (decode_step.py): the step runs op by op instead


@dataclass
class QuantizedMatrix:
    """A [N, K] weight, quantized (layouts: quant_gemm.py)."""

    fmt: str  # "q8" (per-row int8) | "q4" (Q4_1 blocks)
    shape: tuple[int, int]
    qs: np.ndarray
    d: np.ndarray
    m: np.ndarray | None = None  # Q4_1's block minimum

    @classmethod
    def quantize(cls, w: np.ndarray, fmt: str) -> QuantizedMatrix:
        if fmt == "q8":
            return cls(fmt, w.shape, *qg.quantize_q8(w))
        if fmt == "q4":
            return cls(fmt, w.shape, *qg.quantize_q4_1(w))
        raise ValueError(f"unknown quantized precision {fmt!r}: use {', '.join(PRECISIONS)}")

    def arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """Its arrays by name, for the cache file (from_arrays reads them back)."""
        out = {prefix + "qs": self.qs, prefix + "d": self.d, prefix + "shape": np.array(self.shape)}
        if self.m is not None:
            out[prefix + "m"] = self.m
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], prefix: str) -> QuantizedMatrix:
        shape = tuple(int(v) for v in arrays[prefix + "shape"])
        m = arrays.get(prefix + "m")
        fmt = "q8" if m is None else "q4"
        return cls(fmt, shape, arrays[prefix + "qs"], arrays[prefix + "d"], m)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.qs, self.d, self.m) if a is not None)

    def dequantize_rows(self, rows: np.ndarray) -> np.ndarray:
        """float32 [len(rows), K]: the embedding lookup."""
        if self.fmt == "q8":
            full = qg.dequantize_q8(self.qs[rows], self.d[rows])
        else:
            full = qg.dequantize_q4_1(self.qs[rows], self.d[rows], self.m[rows])
        return full[:, : self.shape[1]]

    def matmul(self, x: np.ndarray, out: np.ndarray, accumulate: bool) -> None:
        """out (+)= x @ W.T for x [T, K] float32 (C-contiguous) and out [T, N]."""
        if self.fmt == "q8":
            qg.gemm_q8(x, self.qs, self.d, out, accumulate)
        else:
            qg.gemm_q4_1(x, self.qs, self.d, self.m, out, accumulate, qg.HALF)


class CpuQuantBackend(CpuBackend):
    """`precision` "q8" or "q4"; `threads`: Numba's threads for the products. OpenBLAS runs
    only attention's small products here, one thread each: threading them costs more than it
    saves, and spinning BLAS threads are what a shared machine punishes. Sampling skips the
    twin's full-row sort and noise (numpy_sampler's `fast`): the same draws."""

    fast_sampling = True
    jit_kernels = True  # Numba kernels: the loader's warm-up compiles them (model_runner.py)
    # Weights come as stored (bf16 bits of a bf16 checkpoint), upcast only when quantized: a
    # load from the cache reads no matrix of the model folder but the merged ones.
    weight_format = "stored"

    def __init__(self, precision: str = "q8", threads: int = 1) -> None:
        if precision not in PRECISIONS:
            raise ValueError(f"unknown precision {precision!r}: use float32, q8 or q4")
        self.precision = precision
        self.threads = threads
        self._configured_thread: int | None = None
        self._cache_folder: Path | None = None
        self._cached: dict[str, np.ndarray] | None = None
        self._made: list[QuantizedMatrix] = []  # the matrices of this load, in order
        self._kv: tuple[np.ndarray, np.ndarray] | None = None  # every layer's caches, stacked
        self._stacked: DecodeWeights | None = None

    def use_weight_cache(self, folder: Path) -> None:
        """Take the quantized matrices of the model in `folder` from its cache file if one
        matches the folder's files (else quantize them, and weights_loaded() writes it)."""
        self._cache_folder = folder
        self._cached = load_quantized(folder, self.precision, LAYOUT_VERSION)
        self._made = []

    def weights_loaded(self) -> None:
        """The model's weights are all made: write the cache file if they were quantized."""
        if self._cache_folder is not None and self._cached is None and self._made:
            arrays: dict[str, np.ndarray] = {}
            for i, m in enumerate(self._made):
                arrays.update(m.arrays(f"{i}."))
            save_quantized(self._cache_folder, self.precision, LAYOUT_VERSION, arrays)
        self._cache_folder, self._cached, self._made = None, None, []

    def weight(self, array: np.ndarray, kind: str):
        if kind not in ("matrix", "embedding"):
            return super().weight(array, kind)
        m = self._from_cache(f"{len(self._made)}.", array.shape)
        if m is None:
            fmt = "q8" if kind == "embedding" else self.precision  # see the module docstring
            m = QuantizedMatrix.quantize(super().weight(array, kind), fmt)
        self._made.append(m)
        return m

    def _from_cache(self, prefix: str, shape: tuple[int, ...]) -> QuantizedMatrix | None:
        """The cached matrix, or None; one that is missing or of another shape makes the whole
        cache file one to write again (weights_loaded)."""
        if self._cached is None:
            return None
        if prefix + "shape" in self._cached:
            m = QuantizedMatrix.from_arrays(self._cached, prefix)
            if m.shape == tuple(shape):
                return m
        log.warning("quantized weights cache of %s does not fit its model: quantizing again",
                    self._cache_folder)  # fmt: skip
        self._cached = None
        return None

    def allocate_kv_cache(
        self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Head-major blocks, [blocks, kv_heads, block_size, head_dim]: a KV head's rows of a
        block are contiguous (gpu/kernels/cpu/attention.py); only this backend's rope_kv_write
        and attention read or write them."""
        shape = (num_layers, num_blocks, num_kv_heads, block_size, head_dim)
        self._kv = (np.zeros(shape, np.float32), np.zeros(shape, np.float32))  # decode_forward's
        return [(self._kv[0][i], self._kv[1][i]) for i in range(num_layers)]

    def _use_threads(self) -> None:
        """Numba's thread count is per calling thread: set it in the thread that runs steps
        (the engine's thread or process), once."""
        me = threading.get_ident()
        if self._configured_thread != me:
            set_cpu_threads(1, self.threads)
            self._configured_thread = me

    def embed(self, input_ids, table, out, prev_rows=None, sampled_prev=None) -> None:
        self._use_threads()
        if not isinstance(table, QuantizedMatrix):
            return super().embed(input_ids, table, out, prev_rows, sampled_prev)
        if prev_rows is not None and prev_rows.size and prev_rows.max() >= 0:
            in_flight = prev_rows >= 0
            input_ids = np.where(
                in_flight, sampled_prev[np.where(in_flight, prev_rows, 0)], input_ids
            )
        out[...] = table.dequantize_rows(np.asarray(input_ids))

    def rmsnorm(self, x, weight, eps, out) -> None:
        ew.rmsnorm(x, weight, np.float32(eps), out)

    def rope_kv_write(
        self, qkv, positions, cos, sin, k_cache, v_cache, slot_mapping, num_heads,
        num_kv_heads, head_dim,
    ) -> None:  # fmt: skip
        ew.rope_kv_write(
            qkv, positions, cos, sin, k_cache, v_cache, slot_mapping, num_heads,
            num_kv_heads, head_dim,
        )  # fmt: skip

    def silu_mul(self, gate_up, out) -> None:
        ew.silu_mul(gate_up, out)

    def attention(
        self, qkv, k_cache, v_cache, batch, num_heads, num_kv_heads, head_dim, scale, out
    ) -> None:
        """One Numba call for the batch (gpu/kernels/cpu/attention.py) instead of the oracle's
        dozen numpy calls per sequence."""
        paged_attention(
            qkv, k_cache, v_cache, batch.query_start_loc, batch.seq_lens, batch.block_tables,
            num_heads, head_dim, num_heads // num_kv_heads, np.float32(scale),
            int(batch.max_seq_len), out,
        )  # fmt: skip

    def linear(self, x: np.ndarray, w, out: np.ndarray) -> None:
        if isinstance(w, QuantizedMatrix):
            w.matmul(np.ascontiguousarray(x), out, accumulate=False)
        else:
            super().linear(x, w, out)

    def linear_residual(self, x: np.ndarray, w, residual: np.ndarray, scratch: np.ndarray) -> None:
        if isinstance(w, QuantizedMatrix):
            w.matmul(np.ascontiguousarray(x), residual, accumulate=True)
        else:
            super().linear_residual(x, w, residual, scratch)

    def decode_forward(self, model, batch, logits: np.ndarray) -> bool:
        """A q8 decode step's layers and LM head in one parallel region (decode_step.py): the
        second thread wakes once a step instead of once a product. False (nothing done: the
        model runs the ops one by one) for prefill, q4, or a model it cannot stack."""
        t = batch.num_tokens
        if self.precision != "q8" or batch.max_query_len != 1 or logits.shape[0] != t:
            return False
        stacked = self._decode_weights(model)
        if stacked is None or self._kv is None or model.kv_caches[0][0].base is not self._kv[0]:
            return False
        qkv_w, o_w, gate_up_w, down_w = stacked.matrices
        widths = [w[0].shape[2] for w in stacked.matrices] + [stacked.head.qs.shape[1]]
        shares = self.threads
        if numba.get_num_threads() != shares:  # prange(shares) would not be one share a thread
            return False
        h = model.residual.shape[1]
        done = decode_forward(
            shares, new_state(), CHECK_IN_CYCLES, model.residual[:t], stacked.input_norms,
            stacked.post_norms, model.weights.norm, np.float32(model.eps), *qkv_w, *o_w,
            *gate_up_w, *down_w, stacked.head.qs, stacked.head.d, *self._kv,
            batch.positions, batch.slot_mapping, model.cos, model.sin,
            batch.query_start_loc, batch.seq_lens, batch.block_tables, model.num_heads,
            model.num_kv_heads, model.head_dim, np.float32(model.scale),
            int(batch.max_seq_len), model.qkv[:t], model.attn_out[:t], model.gate_up[:t],
            model.mlp_act[:t], logits, np.empty((shares, t, h), np.float32),
            np.empty((shares, t, max(widths)), np.int16), np.empty((shares, t), np.float32),
            qg.HAS_PMADDWD,
        )  # fmt: skip
        return bool(done)

    def _decode_weights(self, model) -> DecodeWeights | None:
        """The layers' matrices stacked [L, N, Kp] for decode_forward, made at its first call;
        each layer's QuantizedMatrix then holds views of the stack (no second copy)."""
        if self._stacked is not None and self._stacked.of is model.weights:
            return self._stacked
        layers = model.weights.layers
        kinds = [[lw.qkv_proj, lw.o_proj, lw.gate_up_proj, lw.down_proj] for lw in layers]
        head = model.weights.lm_head
        every = [m for ms in kinds for m in ms] + [head]
        if not all(isinstance(m, QuantizedMatrix) and m.fmt == "q8" for m in every):
            return None
        if layers[0].gate_up_proj.shape[0] % 4:  # gate's and up's rows must start even
            return None
        matrices = []
        for j in range(4):
            qs = np.stack([ms[j].qs for ms in kinds])
            d = np.stack([ms[j].d for ms in kinds])
            for i, ms in enumerate(kinds):
                ms[j].qs, ms[j].d = qs[i], d[i]
            matrices.append((qs, d))
        self._stacked = DecodeWeights(
            of=model.weights,
            matrices=matrices,
            input_norms=np.stack([lw.input_layernorm for lw in layers]),
            post_norms=np.stack([lw.post_attention_layernorm for lw in layers]),
            head=head,
        )
        return self._stacked


@dataclass
class DecodeWeights:
    """decode_forward's view of the model's weights."""

    of: object  # the LlamaWeights they are of
    matrices: list[tuple[np.ndarray, np.ndarray]]  # qkv, o, gate_up, down: qs [L, N, Kp], d
    input_norms: np.ndarray  # [L, H]
    post_norms: np.ndarray
    head: QuantizedMatrix
