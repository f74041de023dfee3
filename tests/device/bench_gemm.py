"""Device microbenchmark (issue 5): the matrix products of a step through plain cuBLAS
(gemm_ex, the heuristic's one choice), as split-K strided-batched products of S slices
(gpu/backends/cuda/split_k.py: S = 2..8, and what choose_split_k picks), and, with --lt,
through tuned cuBLASLt (gpu/backends/cuda/cublaslt.py), on Llama-3.2-1B's matrices at the token
counts of decode batches and prefill chunks. Writes $OUT/bench_gemm.json and prints tables.
From the repo root on the GPU machine: python3 tests/device/bench_gemm.py [--lt]

Weights are cold, as in a step: each call reads another copy from a pool of >= 256 MB. Each
cuBLASLt result is checked against cuBLAS's (both fp32 sums of bf16 products: they may differ
in summation order only), the accumulating form (out += x @ w.T) included.
"""

from __future__ import annotations

import sys

import numpy as np
from bench_kernels import median_us, stream
from common import Results, relative_errors
from numba import cuda

from gpu.backends.cuda import split_k
from gpu.backends.cuda.cublas import CublasGemm
from gpu.backends.cuda.cublaslt import CublasLtGemm
from gpu.kernels import residual
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
SPLIT_TOKENS = (8, 64, 128, 256)
SPLITS = (2, 3, 4, 6, 8)
rng = np.random.default_rng(0)


def split_case(shape, t: int, plain: CublasGemm, num_sms: int) -> dict:
    """One product as gemm_ex and as split-K products of each S that fits, the partial sums'
    add (add_partials, the unfused bound of what the fused add costs) timed beside it."""
    n, k, accumulate = shape
    host = to_bf16_bits(rng.standard_normal((n, k), np.float32) * 0.05)
    pool = [
        cuda.to_device(host, stream=stream)
        for _ in range(max(1, min(8, POOL_BYTES // host.nbytes)))
    ]
    x = cuda.to_device(to_bf16_bits(rng.standard_normal((t, k), np.float32)), stream=stream)
    out = cuda.device_array((t, n), np.float32, stream=stream)
    plain.linear(x, pool[0], out)
    want = out.copy_to_host(stream=stream)
    result = {"N": n, "K": k, "tokens": t, "gb_s_floor": 4250,
              "auto": split_k.choose_split_k(t, n, k, num_sms)}  # fmt: skip
    result["gemm_ex_us"] = median_us(lambda i: plain.linear(x, pool[i % len(pool)], out))
    for s in SPLITS:
        if not split_k.fits(k, s, 8):
            continue
        partials = cuda.device_array((s, t, n), np.float32, stream=stream)
        plain.linear_split_k(x, pool[0], partials)
        got = partials.copy_to_host(stream=stream).sum(axis=0)
        us = median_us(lambda i, p=partials: plain.linear_split_k(x, pool[i % len(pool)], p))
        add_us = median_us(lambda i, p=partials: residual.add_partials(out, p, stream))
        result[f"s{s}"] = {"us": us, "gb_s": round(n * k * 2 / us / 1e3), "add_us": add_us,
                           "max_rel": relative_errors(got, want)["max_rel"]}  # fmt: skip
    return result


def split_table(data: dict) -> str:
    lines = ["split-K (cold weights): us of the product (GB/s of weights); * = choose_split_k"]
    lines.append(
        f"{'matrix':>8} {'T':>4} {'gemm_ex':>13} "
        + " ".join(f"{'S=' + str(s):>13}" for s in SPLITS)
    )
    for key, r in data.items():
        if not key.startswith("split/") or not isinstance(r, dict) or "gemm_ex_us" not in r:
            continue
        cells = [f"{r['gemm_ex_us']:>6} ({round(r['N'] * r['K'] * 2 / r['gemm_ex_us'] / 1e3):>4})"]
        for s in SPLITS:
            c = r.get(f"s{s}")
            mark = "*" if r["auto"] == s else " "
            cells.append(f"{c['us']:>6} ({c['gb_s']:>4}){mark}" if c else f"{'-':>13}")
        lines.append(
            f"{key.split('/')[1]:>8} {r['tokens']:>4} " + " ".join(f"{c:>13}" for c in cells)
        )
    return "\n".join(lines)


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
    plain = CublasGemm(stream)
    num_sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    for matrix in ("qkv", "o_proj", "down", "gate_up"):
        for t in SPLIT_TOKENS:
            results.section(f"split/{matrix}/t{t}", split_case, LLAMA[matrix], t, plain, num_sms)
    if "--lt" in sys.argv:
        tuned = CublasLtGemm(stream)
        for matrix, shape in LLAMA.items():
            for t in TOKENS:
                results.section(f"{matrix}/t{t}", case, shape, t, plain, tuned)
        results.data["tune_seconds"] = round(tuned.tune_seconds, 2)
        print(table(results.data))
    print(split_table(results.data))


if __name__ == "__main__":
    main()
