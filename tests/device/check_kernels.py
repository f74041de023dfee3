"""Device check, part 1: the machine's ceilings, per-kernel times at Llama-3.2-1B decode shapes,
and every kernel vs its numpy twin on full-size shapes. Writes $OUT/check_kernels.json."""

from __future__ import annotations

import time

import numpy as np
from common import Results, paged, relative_errors
from numba import cuda

from gpu.backends.cpu import CpuBackend
from gpu.backends.cuda import CudaBackend
from gpu.backends.cuda.sampler import DeviceSampler
from gpu.kernels import activation, attention_decode, attention_prefill, embedding, rmsnorm
from gpu.kernels import rope_kv as rope
from gpu.kernels.bf16 import from_bf16_bits, to_bf16_bits
from gpu.presets import preset_config
from gpu.rope import rope_cos_sin
from gpu.sampling import SamplingMetadata
from gpu.sampling.numpy_sampler import sample as numpy_sample

CFG = preset_config("llama-3.2-1b")
H, INTER, V = CFG.hidden_size, CFG.intermediate_size, CFG.vocab_size
NH, NKV, HD = CFG.num_attention_heads, CFG.num_key_value_heads, CFG.head_dim
BS = 16
# Shapes (module globals, so a dry run in the simulator can shrink them).
ROWS = 256  # token rows of the elementwise checks
COPY_BYTES = 4 << 30  # per buffer: far beyond the 60 MB L2
GEMM_SHAPES = [(8192, 8192, 8192), (4096, 16384, 2048)]
DECODE_BATCHES = (1, 64)
CTX = 1024
SAMPLER_ROWS = 256
ATTENTION_CASES = {
    "decode_b1_ctx4000": ([4000], [1]),
    "decode_b8_ctx1000_3000": ([2900, 1000, 1717, 2048, 1999, 1234, 2500, 1001], [1] * 8),
    "decode_b64_ctx500_2000": ([500 + (i * 397) % 1500 for i in range(64)], [1] * 64),
    "decode_b256_ctx50_600": ([50 + (i * 211) % 550 for i in range(256)], [1] * 256),
    "prefill_1x1024_from_2000": ([3024], [1024]),
    "prefill_mixed_4_seqs": ([700, 1, 2500, 333], [700, 1, 97, 333]),
}
cpu = CpuBackend()
rng = np.random.default_rng(0)
backend = CudaBackend(debug=False)
stream = backend.stream


@cuda.jit
def _spin(n):
    for _ in range(n):
        cuda.nanosleep(1000)


def gpu_time_us(fn, reps: int = 20) -> float:
    """GPU time of fn() in microseconds: the stream is kept busy by a sleeping kernel while the
    launches are queued, so Python's launch overhead is not in the measurement."""
    fn()
    stream.synchronize()
    _spin[1, 1, stream](int(reps * 120 + 2000))
    start, end = cuda.event(), cuda.event()
    start.record(stream)
    for _ in range(reps):
        fn()
    end.record(stream)
    end.synchronize()
    return cuda.event_elapsed_time(start, end) * 1000.0 / reps


def dev(a):
    return cuda.to_device(np.ascontiguousarray(a), stream=stream)


def env() -> dict:
    d = cuda.get_current_device()
    import numba
    import numba_cuda

    free, total = cuda.current_context().get_memory_info()
    return {
        "device": str(getattr(d, "name", "?")),
        "compute_capability": d.compute_capability,
        "sms": d.MULTIPROCESSOR_COUNT,
        "memory_gib": round(total / 2**30, 1),
        "free_gib": round(free / 2**30, 1),
        "numba": numba.__version__,
        "numba_cuda": numba_cuda.__version__,
        "numpy": np.__version__,
    }


def bandwidth() -> dict:
    n = COPY_BYTES
    a = cuda.device_array(n, np.uint8, stream=stream)
    b = cuda.device_array(n, np.uint8, stream=stream)
    us = gpu_time_us(lambda: b.copy_to_device(a, stream=stream), reps=10)
    return {
        "copy_gib": n / 2**30,
        "copy_us": round(us, 1),
        "read_plus_write_tb_s": round(2 * n / us / 1e6, 3),
        "read_tb_s": round(n / us / 1e6, 3),
    }


def gemm_rate() -> dict:
    out = {}
    for m, n, k in GEMM_SHAPES:
        x = cuda.to_device(to_bf16_bits(rng.standard_normal((m, k), np.float32)), stream=stream)
        w = cuda.to_device(to_bf16_bits(rng.standard_normal((n, k), np.float32)), stream=stream)
        y = cuda.device_array((m, n), np.float32, stream=stream)
        us = gpu_time_us(lambda x=x, w=w, y=y: backend.gemm.linear(x, w, y), reps=10)
        out[f"{m}x{n}x{k}_tflop_s"] = round(2 * m * n * k / us / 1e6, 1)
    # Correctness of the transpose trick at an odd shape, vs numpy on the same bf16 inputs.
    x = rng.standard_normal((37, 2048), np.float32)
    w = rng.standard_normal((3072, 2048), np.float32) * 0.02
    y = cuda.device_array((37, 3072), np.float32, stream=stream)
    backend.gemm.linear(dev(to_bf16_bits(x)), dev(to_bf16_bits(w)), y)
    want = from_bf16_bits(to_bf16_bits(x)) @ from_bf16_bits(to_bf16_bits(w)).T
    out["linear_37x3072x2048_vs_numpy"] = relative_errors(backend.to_host(y), want)
    return out


def attention_case(seq_lens, query_lens, seed=0, timing=False) -> dict:
    batch, qkv, k, v = paged(seq_lens, query_lens, seed)
    want = np.zeros((batch.num_tokens, NH * HD), np.float32)
    cpu.attention(qkv, np.nan_to_num(k), np.nan_to_num(v), batch, NH, NKV, HD, HD**-0.5, want)
    out = cuda.to_device(np.full(want.shape, 0x7FC0, np.uint16), stream=stream)
    args = (
        dev(qkv), dev(to_bf16_bits(k)), dev(to_bf16_bits(v)), dev(batch.block_tables.ravel()),
        dev(np.array([batch.block_tables.shape[1]], np.int32)), dev(batch.query_start_loc),
        dev(batch.seq_lens),
    )  # fmt: skip
    n = len(seq_lens)
    if max(query_lens) == 1:
        splits = attention_decode.choose_num_splits(n, NKV, backend.num_sms)
        backend.reserve_attention_scratch(n, NH, NKV, HD)

        def run():
            attention_decode.decode_attention(
                *args, n, NH, HD**-0.5, out, backend._part_acc, backend._part_ml, splits, stream
            )
    else:
        splits = None

        def run():
            attention_prefill.prefill_attention(
                *args, n, max(query_lens), NH, HD**-0.5, out, stream
            )

    run()
    result = relative_errors(backend.to_host(out), want)
    result["splits"] = splits
    result["us"] = round(gpu_time_us(run, reps=5), 1)
    kv_bytes = 2 * sum(seq_lens) * NKV * HD * 2
    result["kv_gb_s"] = round(kv_bytes / result["us"] / 1e3, 1)
    return result


def full_size() -> dict:
    out: dict = {}
    t = ROWS
    x = rng.standard_normal((t, H), np.float32) * 2
    w = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
    y = cuda.device_array((t, H), np.uint16, stream=stream)
    rmsnorm.rmsnorm(dev(x), dev(w), 1e-5, y, stream)
    want = np.zeros_like(x)
    cpu.rmsnorm(x, w, 1e-5, want)
    out["rmsnorm_256x2048"] = relative_errors(backend.to_host(y), want)
    res = rng.standard_normal((t, H), np.float32)
    d_res = dev(res)
    rmsnorm.add_rmsnorm(dev(x), d_res, dev(w), 1e-5, y, stream)
    cpu.add_rmsnorm(x, res, w, 1e-5, want)
    out["add_rmsnorm_256x2048"] = relative_errors(backend.to_host(y), want)
    out["add_rmsnorm_residual"] = relative_errors(backend.to_host(d_res), res)

    gu = rng.standard_normal((t, 2 * INTER), np.float32) * 3
    y = cuda.device_array((t, INTER), np.uint16, stream=stream)
    activation.silu_mul(dev(gu), y, stream)
    want = np.zeros((t, INTER), np.float32)
    cpu.silu_mul(gu, want)
    out["silu_mul_256x8192"] = relative_errors(backend.to_host(y), want)

    table = to_bf16_bits(rng.standard_normal((V, H), np.float32) * 0.02)
    ids = rng.integers(0, V, t).astype(np.int32)
    y = cuda.device_array((t, H), np.float32, stream=stream)
    embedding.embed(dev(ids), dev(table), y, stream)
    out["embedding_exact"] = bool(np.array_equal(backend.to_host(y), from_bf16_bits(table[ids])))

    cos, sin = rope_cos_sin(HD, CFG.rope_theta, 8192, CFG.rope_scaling)
    qkv = rng.standard_normal((t, (NH + 2 * NKV) * HD), np.float32)
    pos = rng.integers(0, 8192, t).astype(np.int32)
    nblk = 64
    slots = rng.choice(nblk * BS, t, replace=False).astype(np.int32)
    kc = np.zeros((nblk, BS, NKV, HD), np.float32)
    vc = np.zeros_like(kc)
    d_qkv, d_k, d_v = dev(qkv), dev(to_bf16_bits(kc)), dev(to_bf16_bits(vc))
    rope.rope_kv_write(
        d_qkv, dev(pos), dev(cos), dev(sin), d_k, d_v, dev(slots), NH, NKV, HD, stream
    )
    cpu.rope_kv_write(qkv, pos, cos, sin, kc, vc, slots, NH, NKV, HD)
    out["rope_qkv"] = relative_errors(backend.to_host(d_qkv), qkv)
    out["rope_k_cache"] = relative_errors(backend.to_host(d_k), kc)
    out["rope_v_cache"] = relative_errors(backend.to_host(d_v), vc)

    for name, (seq_lens, query_lens) in ATTENTION_CASES.items():
        out[name] = attention_case(seq_lens, query_lens)

    out["sampler_256x128256"] = sampler_case()
    return out


def sampler_case() -> dict:
    rows = SAMPLER_ROWS
    logits = (rng.standard_normal((rows, V), np.float32) * 2.5).astype(np.float32)
    md = SamplingMetadata.greedy(rows)
    kind = np.arange(rows) % 8
    md.temperature = np.where(kind == 0, 0.0, 0.6 + 0.1 * (kind % 5)).astype(np.float32)
    md.top_k = np.where(kind == 2, 50, np.where(kind == 6, 1000, 0)).astype(np.int32)
    md.top_p = np.where((kind == 3) | (kind == 6), 0.9, 1.0).astype(np.float32)
    md.min_p = np.where((kind == 4) | (kind == 6), 0.05, 0.0).astype(np.float32)
    md.repetition_penalty = np.where(kind == 5, 1.3, 1.0).astype(np.float32)
    md.frequency_penalty = np.where(kind == 5, 0.4, 0.0).astype(np.float32)
    md.presence_penalty = np.where(kind == 5, 0.2, 0.0).astype(np.float32)
    md.seed = rng.integers(0, 2**63, rows).astype(np.uint64)
    md.step = rng.integers(0, 500, rows).astype(np.uint64)
    md.prompt_token_ids = [rng.integers(0, V, 300).astype(np.int32) for _ in range(rows)]
    md.output_token_ids = [rng.integers(0, V, 100).astype(np.int32) for _ in range(rows)]
    md.banned_token_ids = [(128001, 128009) if r % 3 == 0 else () for r in range(rows)]
    sampler = DeviceSampler(rows, V, stream)
    t0 = time.perf_counter()
    got = sampler.sample(dev(logits), md)
    first_s = time.perf_counter() - t0
    want = numpy_sample(logits, md)
    mismatch = np.nonzero(got != want)[0]
    d_logits = dev(logits)
    md_plain = SamplingMetadata.greedy(rows)
    sampler.stage(md_plain)
    sampler.staging.upload()
    greedy_us = gpu_time_us(lambda: sampler.launch(d_logits), reps=10)
    return {
        "rows": rows,
        "mismatches": len(mismatch),
        "mismatch_rows_kind": [int(kind[r]) for r in mismatch[:10]],
        "first_call_s": round(first_s, 2),
        "greedy_256_rows_us": round(greedy_us, 1),
        "counts_clean": not sampler.counts.copy_to_host().any(),
    }


def decode_kernel_times() -> dict:
    """GPU time of each op of a Llama-3.2-1B decode step at batch 1 and 64 (context CTX), and
    their sum over a step: what a graph-replayed step would cost, launch overhead aside."""
    return {f"batch_{b}": _decode_times(b) for b in DECODE_BATCHES}


def _decode_times(b: int) -> dict:
    r: dict = {}
    per_seq = CTX // BS
    x = dev(rng.standard_normal((b, H), np.float32))
    res = dev(rng.standard_normal((b, H), np.float32))
    w = dev(np.ones(H, np.float32))
    act = cuda.device_array((b, H), np.uint16, stream=stream)
    r["rmsnorm"] = gpu_time_us(lambda: rmsnorm.rmsnorm(x, w, 1e-5, act, stream))
    r["add_rmsnorm"] = gpu_time_us(lambda: rmsnorm.add_rmsnorm(x, res, w, 1e-5, act, stream))
    for name, n, k in [
        ("qkv", (NH + 2 * NKV) * HD, H),
        ("o_proj", H, NH * HD),
        ("gate_up", 2 * INTER, H),
        ("down", H, INTER),
        ("lm_head", V, H),
    ]:
        r[f"linear_{name}"] = us = _linear_time(b, n, k)
        r[f"linear_{name}_weight_tb_s"] = round(n * k * 2 / us / 1e6, 2)
    gu = dev(rng.standard_normal((b, 2 * INTER), np.float32))
    mact = cuda.device_array((b, INTER), np.uint16, stream=stream)
    r["silu_mul"] = gpu_time_us(lambda: activation.silu_mul(gu, mact, stream))
    ids = dev(rng.integers(0, V, b).astype(np.int32))
    table = cuda.device_array((V, H), np.uint16, stream=stream)
    emb = cuda.device_array((b, H), np.float32, stream=stream)
    r["embed"] = gpu_time_us(lambda: embedding.embed(ids, table, emb, stream))
    cos, sin = rope_cos_sin(HD, CFG.rope_theta, CTX + 1, CFG.rope_scaling)
    dcos, dsin = dev(cos), dev(sin)
    qkv = dev(rng.standard_normal((b, (NH + 2 * NKV) * HD), np.float32))
    kc = dev(to_bf16_bits(rng.standard_normal((b * per_seq, BS, NKV, HD), np.float32)))
    vc = dev(to_bf16_bits(rng.standard_normal((b * per_seq, BS, NKV, HD), np.float32)))
    pos = dev(np.full(b, CTX - 1, np.int32))
    slots = dev((np.arange(b) * CTX + CTX - 1).astype(np.int32))
    r["rope_kv"] = gpu_time_us(
        lambda: rope.rope_kv_write(qkv, pos, dcos, dsin, kc, vc, slots, NH, NKV, HD, stream)
    )
    tables = dev(np.arange(b * per_seq, dtype=np.int32))
    stride = dev(np.array([per_seq], np.int32))
    qsl = dev(np.arange(b + 1, dtype=np.int32))
    lens = dev(np.full(b, CTX, np.int32))
    att = cuda.device_array((b, NH * HD), np.uint16, stream=stream)
    splits = attention_decode.choose_num_splits(b, NKV, backend.num_sms)
    backend.reserve_attention_scratch(b, NH, NKV, HD)
    part_acc, part_ml = backend._part_acc, backend._part_ml
    args = (qkv, kc, vc, tables, stride, qsl, lens, b, NH, HD**-0.5, att, part_acc, part_ml)
    r["decode_attention_splits"] = splits
    r["decode_attention"] = gpu_time_us(
        lambda: attention_decode.decode_attention(*args, splits, stream)
    )
    logits = dev(rng.standard_normal((b, V), np.float32))
    sampler = DeviceSampler(b, V, stream)
    sampler.stage(SamplingMetadata.greedy(b))
    sampler.staging.upload()
    r["sample_greedy"] = gpu_time_us(lambda: sampler.launch(logits))
    per_layer = ("linear_qkv", "rope_kv", "decode_attention", "linear_o_proj", "add_rmsnorm",
                 "linear_gate_up", "silu_mul", "linear_down", "add_rmsnorm")  # fmt: skip
    layer = sum(r[k] for k in per_layer)
    step = r["embed"] + r["rmsnorm"] + CFG.num_hidden_layers * layer
    r["step_sum_us"] = step + r["linear_lm_head"] + r["sample_greedy"]
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()}


def _linear_time(b: int, n: int, k: int) -> float:
    wm = cuda.device_array((n, k), np.uint16, stream=stream)
    xin = dev(to_bf16_bits(rng.standard_normal((b, k), np.float32)))
    yo = cuda.device_array((b, n), np.float32, stream=stream)
    return gpu_time_us(lambda: backend.gemm.linear(xin, wm, yo))


if __name__ == "__main__":
    results = Results("check_kernels")
    results.section("env", env)
    results.section("bandwidth", bandwidth)
    results.section("gemm", gemm_rate)
    results.section("decode_kernel_times_us", decode_kernel_times)
    results.section("full_size_vs_numpy", full_size)
