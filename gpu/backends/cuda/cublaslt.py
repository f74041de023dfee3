"""Matrix products through cuBLASLt, with the algorithm of each shape chosen by timing.

Why not plain cublasGemmEx (cublas.py)? It asks cuBLAS's heuristic for one algorithm and
trusts it. For the skinny products of a decode step at batch 8-256 (out [T, N] = x [T, K] @
w[N, K].T with T << N, K) the heuristic's pick reads the weights at 0.9-2.1 TB/s on the H200
(bench_gemv: q/k/v 1.3, o_proj 0.9, down 2.1 TB/s at T 1-8), against a 4.3 TB/s copy rate:
with 128-wide output tiles, N = 2048 is only 16 thread blocks on 132 SMs, and the heuristic
rarely splits K to fill the rest. cuBLASLt exposes the same library's candidate list
(cublasLtMatmulAlgoGetHeuristic returns up to MAX_CANDIDATES configurations: tile shapes, split-K,
stages), so each new shape times its candidates once, on the real operands, and keeps the
fastest; cublasGemmEx itself is one more candidate, so a shape is never slower than before.
That is TensorRT's and cuBLASLt's documented autotuning recipe; vLLM leaves it to PyTorch,
which doesn't.

Measured on the H200 (tests/device/bench_gemm.py, `bench_gemm.json`): the hope did not come
true for the small matrices. The heuristic offered 8 candidates for every shape, none of them
faster on o_proj (9.4 us at T = 64, 0.9 TB/s either way) or q/k/v; it did pay on the LM head
(T = 64: 137.7 us against 149.9; T = 512: 359.6 against 406.6), and lost up to 12% on down
at some T, which is why gemm_ex became a candidate. The small matrices need split-K kernels
that this cuBLAS does not offer for them, or a kernel of our own.

The layout trick is the one in cublas.py: cuBLAS is column-major, so the row-major product
out = x @ w.T is computed as its column-major transpose out.T [N, T] = w [K, N]^T @ x.T [K, T],
with A = w (transposed), B = x, C = D = out, leading dimensions from the row strides.

Timing. Each candidate runs TUNE_REPS times behind a write of FLUSH_BYTES (the L2 is 50 MB: a
decode step reads every weight cold, so the tuning does too) and is scored by its median
(CUDA events). A product that accumulates (beta = 1, out += x @ w.T) would be corrupted by
the extra runs, so its output is saved first and restored after. Tuning synchronises, so it
cannot run inside a CUDA graph capture: the executor always runs a step eagerly before
capturing it, which is when every plan of the step is made; a plan missing during a capture
(which would be a bug) falls back to the heuristic's first choice, untimed.

Determinism. The choice is cached per process (module level, keyed by shape, dtypes, beta and
operand alignment), so every engine of a process uses the same algorithm for the same shape:
the eager step a graph is captured from, the graph, and a second engine built to compare
against. Split-K reductions that add into the output in place (REDUCTION_SCHEME_INPLACE, which
may use atomics) are excluded, so each algorithm is bitwise deterministic.

A shape cuBLASLt cannot plan (no candidate, an error) is run by cublasGemmEx instead, with a
warning: never a failed step. The backend uses this class only with TINYCHAT_GEMM=cublaslt
(make_gemm says why gemm_ex is the default).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from dataclasses import dataclass

import numpy as np
from numba import cuda

from gpu.backends.cuda.cublas import (
    CUDA_R_16BF,
    CUDA_R_32F,
    WORKSPACE_BYTES,
    CublasGemm,
    check_linear,
    device_pointer,
)

log = logging.getLogger(__name__)

MAX_CANDIDATES = 16  # algorithms asked of the heuristic per shape
TUNE_REPS = 5  # timed runs per candidate
FLUSH_BYTES = 64 << 20  # written before each timed run: more than the H200's 50 MB L2
REDUCTION_NOT_INPLACE = 0b110  # COMPUTE_TYPE | OUTPUT_TYPE: deterministic split-K only
GEMM_ENV = "TINYCHAT_GEMM"


def make_gemm(stream) -> CublasLtGemm | CublasGemm:
    """The backend's matrix products: plain cuBLAS (gemm_ex), or tuned cuBLASLt with
    TINYCHAT_GEMM=cublaslt. gemm_ex is the default: in the same-session H200 runs the tuned
    products gave whole decode steps no faster (GPU time of a step at batch 8: 1.331 ms against
    1.275, batch 64: 1.480 against 1.457, batch 256: 2.781 against 2.766) and the tuning
    added 14 s to capturing every graph at start."""
    choice = os.environ.get(GEMM_ENV, "cublas").strip().lower()
    if choice not in ("cublaslt", "cublas"):
        raise ValueError(f"{GEMM_ENV} must be cublaslt or cublas, not {choice!r}")
    return CublasLtGemm(stream) if choice == "cublaslt" else CublasGemm(stream)


@dataclass
class Plan:
    """One shape's descriptors and chosen algorithm (kept alive: cuBLASLt reads them by
    address when a call is enqueued)."""

    desc: int
    layouts: tuple[int, int, int]  # A (w), B (x), C = D (out)
    algo: np.ndarray  # one matmul_heuristic_result record; its "algo" field is passed
    us: float  # the winner's median time in the tuning (0.0 when untimed)
    candidates: int
    gemm_ex: bool = False  # cublasGemmEx (a candidate too) was the fastest: it runs the shape


FALLBACK = None  # a shape cuBLASLt could not plan: cublasGemmEx runs it

# (n, t, k, lda, ldb, ldc, out dtype, accumulate, alignments) -> index of the chosen
# candidate, shared by every CublasLtGemm of the process (see Determinism above).
_CHOICES: dict[tuple, int] = {}


def _alignment(ptr: int) -> int:
    """The largest power of two (<= 256) dividing a device address: cuBLASLt's default
    preference assumes 256-byte aligned operands, row slices may be less."""
    align = 256
    while align > 2 and ptr % align:
        align //= 2
    return align


def _is_capturing(stream) -> bool:
    from cuda.bindings import driver as drv

    err, status = drv.cuStreamIsCapturing(drv.CUstream(int(stream.handle)))
    return status != drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


class CublasLtGemm:
    """out = x @ w.T (or out += x @ w.T) through cuBLASLt, the algorithm tuned per shape."""

    def __init__(self, stream) -> None:
        from nvmath.bindings import cublas, cublasLt

        self._lt = cublasLt
        self.stream = stream
        self._stream_handle = int(stream.handle)
        self.handle = cublasLt.create()
        self.workspace = cuda.device_array(WORKSPACE_BYTES, dtype=np.uint8, stream=stream)
        self._workspace_ptr = device_pointer(self.workspace)
        self._one = np.ones(1, dtype=np.float32)
        self._zero = np.zeros(1, dtype=np.float32)
        self._op_t = np.array(int(cublas.Operation.T), np.int32)
        self._op_n = np.array(int(cublas.Operation.N), np.int32)
        self._compute = int(cublas.ComputeType.COMPUTE_32F)
        self._plans: dict[tuple, Plan | None] = {}  # FALLBACK (None): gemm_ex's
        self._fallback: CublasGemm | None = None
        self._flush = None  # FLUSH_BYTES of scratch, made on the first tuning
        self._saved = None  # a copy of an accumulating product's output while tuning
        self.tune_seconds = 0.0

    # --- the product ----------------------------------------------------------------------
    def linear(self, x, w, out, accumulate: bool = False) -> None:
        """out = x @ w.T, or out += x @ w.T with accumulate (beta = 1; out float32)."""
        if not check_linear(x, w, out):
            return
        (t, k), n = x.shape, w.shape[0]
        ptrs = (device_pointer(w), device_pointer(x), device_pointer(out))
        key = (
            n, t, k, w.strides[0] // 2, x.strides[0] // 2, out.strides[0] // out.dtype.itemsize,
            out.dtype.str, accumulate, tuple(_alignment(p) for p in ptrs),
        )  # fmt: skip
        plan = self._plans.get(key)
        if plan is None:
            try:  # plan, and run the product once, checked
                plan = self._make_plan(key, (x, w, out), ptrs)
                self._run(plan, x, w, out, ptrs, accumulate)
                self._plans[key] = plan
                return
            except Exception as exc:  # no algorithm, an unsupported layout: gemm_ex can
                log.warning("cuBLASLt: x [%d, %d] @ w [%d, %d].T falls back to cublasGemmEx"
                            " (%s)", t, k, n, k, exc)  # fmt: skip
                plan = self._plans[key] = FALLBACK
        self._run(plan, x, w, out, ptrs, accumulate)

    def _run(self, plan: Plan | None, x, w, out, ptrs: tuple, accumulate: bool) -> None:
        if plan is FALLBACK or plan.gemm_ex:
            self._gemm_ex().linear(x, w, out, accumulate)
        else:
            self._matmul(plan, ptrs, accumulate, plan.algo["algo"].ctypes.data)

    def _gemm_ex(self) -> CublasGemm:
        if self._fallback is None:
            self._fallback = CublasGemm(self.stream)
        return self._fallback

    def _matmul(self, plan: Plan, ptrs: tuple[int, int, int], accumulate: bool, algo: int):
        a, b, c = plan.layouts
        w_ptr, x_ptr, out_ptr = ptrs
        self._lt.matmul(
            self.handle, plan.desc, self._one.ctypes.data, w_ptr, a, x_ptr, b,
            (self._one if accumulate else self._zero).ctypes.data, out_ptr, c, out_ptr, c,
            algo, self._workspace_ptr, WORKSPACE_BYTES, self._stream_handle,
        )  # fmt: skip

    # --- plans ----------------------------------------------------------------------------
    def _make_plan(self, key: tuple, operands: tuple, ptrs: tuple[int, int, int]) -> Plan:
        lt = self._lt
        n, t, k, lda, ldb, ldc, out_dtype, accumulate, aligns = key
        desc = lt.matmul_desc_create(self._compute, CUDA_R_32F)
        for attr, value in ((lt.MatmulDescAttribute.TRANSA, self._op_t),
                            (lt.MatmulDescAttribute.TRANSB, self._op_n)):  # fmt: skip
            lt.matmul_desc_set_attribute(desc, attr, value.ctypes.data, value.nbytes)
        out_type = CUDA_R_32F if np.dtype(out_dtype) == np.float32 else CUDA_R_16BF
        layouts = (
            lt.matrix_layout_create(CUDA_R_16BF, k, n, lda),  # w as stored: K x N
            lt.matrix_layout_create(CUDA_R_16BF, k, t, ldb),  # x: K x T
            lt.matrix_layout_create(out_type, n, t, ldc),  # out: N x T
        )
        results = self._candidates(desc, layouts, aligns)
        if len(results) == 0:
            raise RuntimeError(f"cuBLASLt has no algorithm for x [{t}, {k}] @ w [{n}, {k}].T")
        plan = Plan(desc, layouts, results[0:1].copy(), 0.0, len(results))
        choice = _CHOICES.get(key)
        if choice is None and not _is_capturing(self.stream):
            x, w, out = operands
            runs = [
                functools.partial(self._matmul, plan, ptrs, accumulate, algo.ctypes.data)
                for algo in results["algo"][:, None]
            ]  # the candidates, then gemm_ex (index len(results))
            runs.append(functools.partial(self._gemm_ex().linear, x, w, out, accumulate))
            span = (t - 1) * ldc + n  # elements of out, first to last
            choice, plan.us = self._tune(runs, ptrs[2], accumulate, out_dtype, span)
            _CHOICES[key] = choice
        if choice is not None and choice < len(results):
            plan.algo = results[choice : choice + 1].copy()
        plan.gemm_ex = choice == len(results)
        return plan

    def _candidates(self, desc: int, layouts: tuple, aligns: tuple) -> np.ndarray:
        lt = self._lt
        pref = lt.matmul_preference_create()
        try:
            settings = [
                (lt.MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES, np.uint64(WORKSPACE_BYTES)),
                (lt.MatmulPreferenceAttribute.REDUCTION_SCHEME_MASK,
                 np.uint32(REDUCTION_NOT_INPLACE)),
                (lt.MatmulPreferenceAttribute.MIN_ALIGNMENT_A_BYTES, np.uint32(aligns[0])),
                (lt.MatmulPreferenceAttribute.MIN_ALIGNMENT_B_BYTES, np.uint32(aligns[1])),
                (lt.MatmulPreferenceAttribute.MIN_ALIGNMENT_C_BYTES, np.uint32(aligns[2])),
                (lt.MatmulPreferenceAttribute.MIN_ALIGNMENT_D_BYTES, np.uint32(aligns[2])),
            ]  # fmt: skip
            for attr, value in settings:
                value = np.array(value)
                lt.matmul_preference_set_attribute(pref, attr, value.ctypes.data, value.nbytes)
            results = np.zeros(MAX_CANDIDATES, dtype=lt.matmul_heuristic_result_dtype)
            count = np.zeros(1, dtype=np.int32)
            a, b, c = layouts
            lt.matmul_algo_get_heuristic(
                self.handle, desc, a, b, c, c, pref, MAX_CANDIDATES,
                results.ctypes.data, count.ctypes.data,
            )  # fmt: skip
        finally:
            lt.matmul_preference_destroy(pref)
        results = results[: int(count[0])]
        return results[results["state"] == 0]  # CUBLAS_STATUS_SUCCESS only

    def _tune(self, runs: list, out_ptr: int, accumulate: bool, out_dtype: str, out_elems: int):
        """Time every candidate (runs[i]() enqueues one product) on the real operands; returns
        (index of the fastest, its median us). Synchronises."""
        t0 = time.perf_counter()
        stream = self.stream
        if self._flush is None:
            self._flush = cuda.device_array(FLUSH_BYTES, dtype=np.uint8, stream=stream)
        out_bytes = out_elems * np.dtype(out_dtype).itemsize
        if accumulate:  # keep the output the extra runs would add into
            if self._saved is None or self._saved.size < out_bytes:
                self._saved = cuda.device_array(out_bytes, dtype=np.uint8, stream=stream)
            _copy(self._saved, out_ptr, out_bytes, stream, to_scratch=True)
        events = []
        for run in runs:
            run()  # warm-up
            timed = []
            for _ in range(TUNE_REPS):
                _memset(self._flush, stream)
                start, end = cuda.event(), cuda.event()
                start.record(stream)
                run()
                end.record(stream)
                timed.append((start, end))
            events.append(timed)
        stream.synchronize()
        medians = [
            float(np.median([cuda.event_elapsed_time(s, e) for s, e in timed])) for timed in events
        ]
        if accumulate:
            _copy(self._saved, out_ptr, out_bytes, stream, to_scratch=False)
            stream.synchronize()
        best = int(np.argmin(medians))
        self.tune_seconds += time.perf_counter() - t0
        log.debug("cublasLt: %d candidates, best #%d %.1f us", len(medians), best, medians[best])
        return best, medians[best] * 1000.0

    def close(self) -> None:
        lt = self._lt
        for plan in self._plans.values():
            if plan is FALLBACK:
                continue
            for layout in plan.layouts:
                lt.matrix_layout_destroy(layout)
            lt.matmul_desc_destroy(plan.desc)
        self._plans.clear()
        if self.handle:
            lt.destroy(self.handle)
            self.handle = 0
        if self._fallback is not None:
            self._fallback.close()


def _memset(array, stream) -> None:
    from cuda.bindings import driver as drv

    drv.cuMemsetD8Async(device_pointer(array), 0, array.size, drv.CUstream(int(stream.handle)))


def _copy(scratch, out_ptr: int, nbytes: int, stream, to_scratch: bool) -> None:
    from cuda.bindings import driver as drv

    src, dst = out_ptr, device_pointer(scratch)
    if not to_scratch:
        src, dst = dst, src
    drv.cuMemcpyDtoDAsync(dst, src, nbytes, drv.CUstream(int(stream.handle)))
