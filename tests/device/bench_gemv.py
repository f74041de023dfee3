"""Device microbenchmark (issue 5): the decode GEMV (gpu/kernels/gemv.py) against cuBLAS on the
matrices of Llama-3.2-1B and SmolLM2-135M, each configuration checked once against numpy.
Writes $OUT/bench_gemv.json and prints a table. From the repo root on the GPU machine:
python3 tests/device/bench_gemv.py [--quick]  (quick: one token, gemv.plan's choice only)

Weights are cold, as in a decode step (the other layers' weights evict them from the 50 MB L2):
each launch reads another copy from a pool of at least 256 MB. GB/s counts weight bytes only.
At one token, (rows per block, threads per block) is swept, which is where gemv.plan's choices
come from; elsewhere gemv.plan's choice is timed ("plan").
"""

from __future__ import annotations

import sys

import numpy as np
from bench_kernels import median_us, stream
from common import Results, relative_errors
from numba import cuda

from gpu.backends.cuda.cublas import CublasGemm
from gpu.kernels import gemv
from gpu.kernels.bf16 import from_bf16_bits, round_to_bf16, to_bf16_bits

POOL_BYTES = 256 << 20
# name: (N, K, prologue, epilogue)
LLAMA = {
    "qkv": (3072, 2048, "rmsnorm", "store"),
    "o_proj": (2048, 2048, "none", "add"),
    "gate_up": (16384, 2048, "rmsnorm", "silu"),
    "down": (2048, 8192, "none", "add"),
    "lm_head": (128256, 2048, "rmsnorm", "store"),
}
SMOL = {
    "qkv": (960, 576, "rmsnorm", "store"),
    "o_proj": (576, 576, "none", "add"),
    "gate_up": (3072, 576, "rmsnorm", "silu"),
    "down": (576, 1536, "none", "add"),
    "lm_head": (49152, 576, "rmsnorm", "store"),
}
SWEEP = [(2, 128), (4, 128), (8, 128), (4, 256), (8, 256), (16, 256)]
rng = np.random.default_rng(0)
NO_ROPE = gemv._no_rope()  # qkv is timed with the "store" epilogue: the same weight stream


def weights(n: int, k: int) -> tuple[list, np.ndarray]:
    """Copies of one random [n, k] bf16 matrix filling POOL_BYTES, and the host values."""
    host = to_bf16_bits(rng.standard_normal((n, k), np.float32) * 0.05)
    copies = max(1, min(16, POOL_BYTES // host.nbytes))
    return [cuda.to_device(host, stream=stream) for _ in range(copies)], from_bf16_bits(host)


def launch(kernel, rows, nthreads, t, n, x64, xres, nw, w, out):
    n_out = n // 2 if out.dtype == np.uint16 else n
    per_block = rows // 2 if out.dtype == np.uint16 else rows
    kernel[-(-n_out // per_block), nthreads, stream](
        x64, xres, nw, 1e-5, w.view(np.uint64), out, t, *NO_ROPE
    )


def case(shape, t: int, configs, gemm: CublasGemm) -> dict:
    n, k, prologue, epilogue = shape
    pool, w_host = weights(n, k)
    x_host = round_to_bf16(rng.standard_normal((t, k), np.float32))
    res_host = rng.standard_normal((t, k), np.float32)
    nw_host = (1 + 0.1 * rng.standard_normal(k)).astype(np.float32)
    x = cuda.to_device(to_bf16_bits(x_host), stream=stream)
    xres, nw = cuda.to_device(res_host, stream=stream), cuda.to_device(nw_host, stream=stream)
    n_out = n // 2 if epilogue == "silu" else n
    out = cuda.device_array((t, n_out), np.uint16 if epilogue == "silu" else np.float32)
    # The twin.
    xin = x_host
    if prologue == "rmsnorm":
        rms = np.sqrt(np.mean(res_host**2, axis=1, keepdims=True) + np.float32(1e-5))
        xin = round_to_bf16(res_host / rms * nw_host)
    want = xin @ w_host.T
    if epilogue == "silu":
        gate, up = want[:, :n_out], want[:, n_out:]
        want = gate / (1 + np.exp(-gate)) * up
    result = {"N": n, "K": k, "tokens": t, "weight_mb": round(n * k * 2 / 1e6, 1)}
    bytes_ = n * k * 2
    planned = gemv.plan(n, k // 4, gemv.bucket(t), prologue == "rmsnorm", epilogue)[:2]
    result["plan"] = f"r{planned[0]}_t{planned[1]}"
    for rows, nthreads in sorted(set(configs) | {planned}):
        name = f"r{rows}_t{nthreads}"
        try:
            kernel = gemv.gemv_kernel(k // 4, gemv.bucket(t), rows, nthreads, prologue, epilogue)
        except ValueError as exc:
            result[name] = str(exc)
            continue
        x64 = x.view(np.uint64)
        if epilogue == "add":
            out.copy_to_device(np.zeros(out.shape, np.float32), stream=stream)
        launch(kernel, rows, nthreads, t, n, x64, xres, nw, pool[0], out)
        got = out.copy_to_host(stream=stream)
        stream.synchronize()
        got = from_bf16_bits(got) if epilogue == "silu" else got
        us = median_us(
            lambda i, kernel=kernel, r=rows, nt=nthreads, x64=x64: launch(
                kernel, r, nt, t, n, x64, xres, nw, pool[i % len(pool)], out
            )
        )
        err = relative_errors(got, want)
        result[name] = {"us": us, "gb_s": round(bytes_ / us / 1e3), "max_rel": err["max_rel"]}
    # cuBLAS on the bf16 input (no norm, no epilogue): the product alone.
    gout = cuda.device_array((t, n), np.float32)
    result["cublas_us"] = median_us(lambda i: gemm.linear(x, pool[i % len(pool)], gout))
    result["cublas_gb_s"] = round(bytes_ / result["cublas_us"] / 1e3)
    return result


def table(data: dict) -> str:
    lines = ["decode GEMV vs cuBLAS (cold weights; GB/s of weights; best gemv config)"]
    lines.append(f"{'model':>6} {'matrix':>8} {'T':>2} {'MB':>6} {'best':>10} {'us':>7}"
                 f" {'GB/s':>6} {'cuBLAS us':>9} {'GB/s':>6} {'max rel':>8}")  # fmt: skip
    for key, r in data.items():
        if not isinstance(r, dict) or "cublas_us" not in r:
            continue
        runs = {c: v for c, v in r.items() if isinstance(v, dict) and "us" in v}
        if not runs:
            continue
        best = min(runs, key=lambda c: runs[c]["us"])
        b = runs[best]
        model, matrix, _ = key.split("/")
        lines.append(
            f"{model:>6} {matrix:>8} {r['tokens']:>2} {r['weight_mb']:>6} {best:>10}"
            f" {b['us']:>7} {b['gb_s']:>6} {r['cublas_us']:>9} {r['cublas_gb_s']:>6}"
            f" {b['max_rel']:>8.1e}"
        )
    return "\n".join(lines)


def main() -> None:
    quick = "--quick" in sys.argv
    results = Results("bench_gemv")
    gemm = CublasGemm(stream)
    for model, shapes in (("llama", LLAMA), ("smol", SMOL)):
        for matrix, shape in shapes.items():
            for t in (1,) if quick else (1, 4, 8):
                sweep = model == "llama" and t == 1 and not quick
                configs = SWEEP if sweep else []
                results.section(f"{model}/{matrix}/t{t}", case, shape, t, configs, gemm)
    print(table(results.data))


if __name__ == "__main__":
    main()
