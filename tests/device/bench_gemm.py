"""Device microbenchmark (issue 5): the matrix products of a step through plain cuBLAS
(gemm_ex, the heuristic's one choice) and through tuned cuBLASLt (gpu/backends/cuda/cublaslt.py),
on Llama-3.2-1B's matrices at the token counts of decode batches and prefill chunks. Writes
$OUT/bench_gemm.json and prints a table. From the repo root on the GPU machine:
python3 tests/device/bench_gemm.py

Weights are cold, as in a step: each call reads another copy from a pool of >= 256 MB. Each
cuBLASLt result is checked against cuBLAS's (both fp32 sums of bf16 products: they may differ
in summation order only), the accumulating form (out += x @ w.T) included.
"""

from __future__ import annotations

import numpy as np
from bench_kernels import median_us, stream
from common import Results, relative_errors
from numba import cuda

from gpu.backends.cuda.cublas import CublasGemm
from gpu.backends.cuda.cublaslt import CublasLtGemm
from gpu.kernels.bf16 import to_bf16_bits

POOL_BYTES = 256 << 20
# name: (N, K, accumulate)
LLAMA = {
    "qkv": (3072, 2048, False),
    "o_proj": (2048, 2048, True),
    "gate_up": (16384, 2048, False),
    "down": (2048, 8192, True),
    "lm_head": (128256, 2048, False),
}
TOKENS = (1, 8, 16, 64, 128, 256, 512)
rng = np.random.default_rng(0)


def case(shape, t: int, plain: CublasGemm, tuned: CublasLtGemm) -> dict:
    n, k, accumulate = shape
    host = to_bf16_bits(rng.standard_normal((n, k), np.float32) * 0.05)
    copies = max(1, min(8, POOL_BYTES // host.nbytes))
    pool = [cuda.to_device(host, stream=stream) for _ in range(copies)]
    x = cuda.to_device(to_bf16_bits(rng.standard_normal((t, k), np.float32)), stream=stream)
    start = rng.standard_normal((t, n), np.float32)
    want_out = cuda.to_device(start, stream=stream)
    got_out = cuda.to_device(start, stream=stream)
    plain.linear(x, pool[0], want_out, accumulate)
    tuned.linear(x, pool[0], got_out, accumulate)  # tunes (and must keep `start` when adding)
    want, got = want_out.copy_to_host(), got_out.copy_to_host()
    stream.synchronize()
    bytes_ = n * k * 2
    flops = 2 * t * n * k
    key = next(p for p in tuned._plans if p[0] == n and p[1] == t)
    plan = tuned._plans[key]
    result = {
        "N": n, "K": k, "tokens": t, "accumulate": accumulate,
        "candidates": plan.candidates, "tuned_us": round(plan.us, 2),
        "vs_cublas": relative_errors(got, want),
    }  # fmt: skip
    for name, gemm in (("cublas", plain), ("cublaslt", tuned)):
        us = median_us(lambda i, g=gemm: g.linear(x, pool[i % len(pool)], got_out, accumulate))
        result[f"{name}_us"] = us
        result[f"{name}_gb_s"] = round(bytes_ / us / 1e3)
        result[f"{name}_tflop_s"] = round(flops / us / 1e6, 1)
    result["speedup"] = round(result["cublas_us"] / result["cublaslt_us"], 2)
    return result


def table(data: dict) -> str:
    lines = ["cuBLAS gemm_ex vs tuned cuBLASLt (cold weights; GB/s of weights)"]
    lines.append(f"{'matrix':>8} {'T':>4} {'cuBLAS us':>9} {'GB/s':>6} {'Lt us':>7} {'GB/s':>6}"
                 f" {'TFLOP/s':>7} {'x':>5} {'cands':>5} {'max rel':>8}")  # fmt: skip
    for key, r in data.items():
        if not isinstance(r, dict) or "cublaslt_us" not in r:
            continue
        lines.append(
            f"{key.split('/')[0]:>8} {r['tokens']:>4} {r['cublas_us']:>9} {r['cublas_gb_s']:>6}"
            f" {r['cublaslt_us']:>7} {r['cublaslt_gb_s']:>6} {r['cublaslt_tflop_s']:>7}"
            f" {r['speedup']:>5} {r['candidates']:>5} {r['vs_cublas']['max_rel']:>8.1e}"
        )
    return "\n".join(lines)


def main() -> None:
    results = Results("bench_gemm")
    plain, tuned = CublasGemm(stream), CublasLtGemm(stream)
    for matrix, shape in LLAMA.items():
        for t in TOKENS:
            results.section(f"{matrix}/t{t}", case, shape, t, plain, tuned)
    results.data["tune_seconds"] = round(tuned.tune_seconds, 2)
    print(table(results.data))


if __name__ == "__main__":
    main()
