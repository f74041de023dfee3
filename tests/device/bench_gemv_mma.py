"""Device microbenchmark: the tensor-core decode GEMV (gpu/kernels/gemv_mma.py) against cuBLAS
on Llama-3.2-1B's matrices at 2 and 8 tokens, sweeping warps a block (and so chunks a warp),
each configuration checked once against numpy. Cold weights (a pool of copies, as in
bench_gemv.py); GB/s counts weight bytes. Prints registers and local memory a thread (a spill
shows as local bytes). Writes $OUT/bench_gemv_mma.json.

    python3 tests/device/bench_gemv_mma.py
"""

from __future__ import annotations

import numpy as np
from bench_gemv import weights
from bench_kernels import median_us, stream
from common import Results, relative_errors
from numba import cuda

from gpu.backends.cuda.cublas import CublasGemm
from gpu.kernels import gemv_mma
from gpu.kernels.bf16 import from_bf16_bits, round_to_bf16, to_bf16_bits
from gpu.kernels.launch import cdiv

rng = np.random.default_rng(0)
# name: (N, K, epilogue): qkv timed with "store" (the same weight stream as "rope")
LLAMA = {
    "qkv": (3072, 2048, "store"),
    "o_proj": (2048, 2048, "add"),
    "gate_up": (16384, 2048, "silu"),
    "down": (2048, 8192, "add"),
    "lm_head": (128256, 2048, "store"),
}


def configs(k: int, epilogue: str) -> list[tuple[int, int, int]]:
    """(rows a lane, warps, chunks a warp): the plan's and its neighbours, at most 32 chunk-rows
    (512 bytes) of weights a thread."""
    chunks = cdiv(k, gemv_mma.CHUNK)
    out = {gemv_mma.plan(k, epilogue)}
    for rows in (1, 2) if epilogue not in gemv_mma.PAIRED else (2,):
        for warps in (2, 4, 8, 16, 32):
            per = cdiv(chunks, warps)
            if per * rows <= 32 and per >= 1:
                out.add((rows, warps, per))
    return sorted(out)


def case(shape, t: int, gemm: CublasGemm) -> dict:
    n, k, epilogue = shape
    pool, w_host = weights(n, k)
    x_host = round_to_bf16(rng.standard_normal((t, k), np.float32))
    x = cuda.to_device(to_bf16_bits(x_host), stream=stream)
    n_out = n // 2 if epilogue == "silu" else n
    out = cuda.device_array((t, n_out), np.uint16 if epilogue == "silu" else np.float32)
    want = x_host @ w_host.T
    if epilogue == "silu":
        gate, up = round_to_bf16(want[:, :n_out]), round_to_bf16(want[:, n_out:])
        want = gate / (1 + np.exp(-gate)) * up
    bytes_ = n * k * 2
    result = {"N": n, "K": k, "tokens": t, "plan": str(gemv_mma.plan(k, epilogue))}
    args = gemv_mma._no_rope()
    for rows, warps, per in configs(k, epilogue):
        kernel = gemv_mma.gemv_mma_kernel(k, rows, warps, per, epilogue)
        blocks = gemv_mma.num_blocks(n, rows, epilogue)

        def run(i, kernel=kernel, blocks=blocks, warps=warps):
            w = pool[i % len(pool)]
            kernel[blocks, 32 * warps, stream](x.view(np.uint64), w.view(np.uint64), out, t, *args)

        if epilogue == "add":
            out.copy_to_device(np.zeros(out.shape, np.float32), stream=stream)
        try:
            run(0)
            got = out.copy_to_host(stream=stream)
            stream.synchronize()
        except Exception as exc:  # e.g. 1,024 threads of more than 64 registers
            result[f"rows{rows}_warps{warps}"] = {"error": f"{type(exc).__name__}"}
            continue
        got = from_bf16_bits(got) if epilogue == "silu" else got
        us = median_us(run)
        regs = kernel.get_regs_per_thread()
        local = kernel.get_local_mem_per_thread()
        result[f"rows{rows}_warps{warps}"] = {
            "us": us,
            "gb_s": round(bytes_ / us / 1e3),
            "max_rel": relative_errors(got, want)["max_rel"],
            "regs": regs if isinstance(regs, int) else max(regs.values()),
            "local": local if isinstance(local, int) else max(local.values()),
        }
    gout = cuda.device_array((t, n), np.float32)
    result["cublas_us"] = median_us(lambda i: gemm.linear(x, pool[i % len(pool)], gout))
    result["cublas_gb_s"] = round(bytes_ / result["cublas_us"] / 1e3)
    return result


def main() -> None:
    results = Results("bench_gemv_mma")
    gemm = CublasGemm(stream)
    for matrix, shape in LLAMA.items():
        for t in (2, 8):
            r = results.section(f"llama/{matrix}/t{t}", case, shape, t, gemm)
            if not r:
                continue
            runs = {c: v for c, v in r.items() if isinstance(v, dict) and "us" in v}
            line = "  ".join(
                f"{c}: {v['us']} us {v['gb_s']} GB/s r{v['regs']} l{v['local']}"
                for c, v in runs.items()
            )
            print(f"SUMMARY {matrix} T={t} cuBLAS {r['cublas_us']} us | {line}", flush=True)


if __name__ == "__main__":
    main()
