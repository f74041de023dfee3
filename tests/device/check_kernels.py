"""Device check, part 1: the machine's ceilings, the GPU time of each backend op of a
Llama-3.2-1B decode step (called as gpu/model.py calls it), every kernel vs its numpy twin on
full-size shapes, and the fused ops of a layer vs the cpu backend's compositions at decode and
prefill shapes. Writes $OUT/check_kernels.json."""

from __future__ import annotations

import functools
import time

import numpy as np
from common import Results, paged, relative_errors
from numba import cuda

from gpu.backends.cpu import CpuBackend
from gpu.backends.cuda import CudaBackend
from gpu.backends.cuda.executor import DeviceForwardBatch
from gpu.backends.cuda.sampler import DeviceSampler
from gpu.kernels import activation, attention_decode, embedding, gemv, rmsnorm
from gpu.kernels import rope_kv as rope
from gpu.kernels.bf16 import from_bf16_bits, to_bf16_bits
from gpu.presets import preset_config
from gpu.rope import rope_cos_sin
from gpu.sampling import SamplingMetadata
from gpu.sampling.numpy_sampler import sample as numpy_sample
from gpu.sampling.token_state import new_state, row_state, state_mask, write_states

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
FUSED_TOKENS = (1, 8, 256)  # gemv.py's smallest and largest step, and a prefill (composed) one
LM_HEAD_CHECK_ROWS = 8194  # a slice of the vocabulary (and not a multiple of gemv's block rows)
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
    launches are queued, so Python's launch overhead is not in the measurement (the sleep
    allows ~0.5 ms of Python per call: a backend op is a few launches and some glue)."""
    fn()
    stream.synchronize()
    _spin[1, 1, stream](int(reps * 500 + 2000))
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


def device_batch(batch) -> DeviceForwardBatch:
    """The device twin of a host ForwardBatch, as the executor builds it (flat block table)."""
    return DeviceForwardBatch(
        num_tokens=batch.num_tokens, num_seqs=batch.num_seqs, input_ids=None,
        positions=None, slot_mapping=None, query_start_loc=dev(batch.query_start_loc),
        seq_lens=dev(batch.seq_lens), block_tables=dev(batch.block_tables.ravel()),
        logits_indices=None, max_query_len=batch.max_query_len, max_seq_len=batch.max_seq_len,
        block_table_stride=dev(np.array([batch.block_tables.shape[1]], np.int32)),
    )  # fmt: skip


def attention_case(seq_lens, query_lens, seed=0) -> dict:
    """backend.attention (the decode kernel when every sequence has one query, else prefill)."""
    batch, qkv, k, v = paged(seq_lens, query_lens, seed)
    want = np.zeros((batch.num_tokens, NH * HD), np.float32)
    cpu.attention(qkv, np.nan_to_num(k), np.nan_to_num(v), batch, NH, NKV, HD, HD**-0.5, want)
    out = cuda.to_device(np.full(want.shape, 0x7FC0, np.uint16), stream=stream)
    d_qkv, d_k, d_v = dev(qkv), dev(to_bf16_bits(k)), dev(to_bf16_bits(v))
    d_batch = device_batch(batch)
    n = len(seq_lens)
    decode = max(query_lens) == 1
    splits = attention_decode.choose_num_splits(n, NKV, backend.num_sms) if decode else None

    def run():
        backend.attention(d_qkv, d_k, d_v, d_batch, NH, NKV, HD, HD**-0.5, out)

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

    gu = to_bf16_bits(rng.standard_normal((t, 2 * INTER), np.float32) * 3)
    y = cuda.device_array((t, INTER), np.uint16, stream=stream)
    activation.silu_mul(dev(gu), y, stream)
    want = np.zeros((t, INTER), np.float32)
    cpu.silu_mul(from_bf16_bits(gu), want)
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
    # Token state (penalties, bans): rows of kind 5 and every third row, in reversed rows.
    stateful = (kind == 5) | (np.arange(rows) % 3 == 0)
    md.state_rows = np.where(stateful, rows - 1 - np.arange(rows), -1).astype(np.int32)
    md.ban_active = (np.arange(rows) % 3 == 0).astype(np.int32)
    md.state_writes = [
        (int(md.state_rows[r]), *row_state(
            rng.integers(0, V, 300), rng.integers(0, V, 100), (128001, 128009), V
        ))
        for r in np.nonzero(stateful)[0]
    ]  # fmt: skip
    state = new_state(rows, V)
    write_states(state, md.state_writes)
    sampler = DeviceSampler(rows, V, stream)
    t0 = time.perf_counter()
    got = sampler.sample(dev(logits), md)
    first_s = time.perf_counter() - t0
    want = numpy_sample(logits, md, state)
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
        "state_matches": bool(np.array_equal(sampler.state.copy_to_host(), state)),
        "mask_matches": bool(np.array_equal(sampler.state_mask.copy_to_host(), state_mask(state))),
    }


# The matrices of a Llama-3.2-1B layer and its LM head: (rows N, inputs K), as the model holds
# them (q, k, v merged; gate and up merged).
MATRICES = {
    "qkv": ((NH + 2 * NKV) * HD, H),
    "o_proj": (H, NH * HD),
    "gate_up": (2 * INTER, H),
    "down": (H, INTER),
    "lm_head": (V, H),
}


def random_bf16(n: int, k: int, std: float = 0.02, distinct_rows: int = 4096) -> np.ndarray:
    """An [n, k] bf16-bits matrix of N(0, std) values: `distinct_rows` random rows repeated
    (drawing all of a 128k-row LM head in numpy would take seconds; the time does not care)."""
    block = to_bf16_bits(rng.standard_normal((min(n, distinct_rows), k), np.float32) * std)
    return np.resize(block, (n, k))


@functools.cache
def decode_weights() -> dict:
    """One layer's matrices and the LM head on the device, shared by every timed batch."""
    return {name: backend.weight(random_bf16(n, k), "matrix") for name, (n, k) in MATRICES.items()}


def decode_kernel_times() -> dict:
    """GPU time of each backend op of a Llama-3.2-1B decode step at batch 1 and 64 (context
    CTX), and their sum over a step: what a graph-replayed step would cost, launch overhead
    aside. Batch 1 takes gemv.py's fused kernels, batch 64 the compositions and cuBLAS."""
    return {f"batch_{b}": _decode_times(b) for b in DECODE_BATCHES}


def _decode_times(b: int) -> dict:
    """The ops in the order gpu/model.py calls them, on its buffers (the CudaBackend methods,
    so the measurement follows whatever path the backend takes at this batch size)."""
    r: dict = {"path": "gemv" if gemv.serves(b, H) else "composed"}
    per_seq = CTX // BS
    eps = CFG.rms_norm_eps
    w = decode_weights()
    norm = backend.weight((1 + 0.1 * rng.standard_normal(H)).astype(np.float32), "vector")
    residual = dev(rng.standard_normal((b, H), np.float32))
    normed = backend.empty((b, H), "act")
    qkv = backend.empty((b, MATRICES["qkv"][0]), "f32")
    attn_out = backend.empty((b, NH * HD), "act")
    proj_out = backend.empty((b, H), "f32")
    gate_up = backend.empty((b, 2 * INTER), "act")
    mlp_act = backend.empty((b, INTER), "act")
    last_residual = backend.empty((b, H), "f32")
    last_normed = backend.empty((b, H), "act")
    logits = backend.empty((b, V), "f32")

    ids = dev(rng.integers(0, V, b).astype(np.int32))
    emb = backend.empty((b, H), "f32")  # not the residual: its values stay those drawn above
    r["embed"] = gpu_time_us(lambda: backend.embed(ids, w["lm_head"], emb))  # tied embeddings

    cos, sin = rope_cos_sin(HD, CFG.rope_theta, CTX + 1, CFG.rope_scaling)
    dcos, dsin = backend.weight(cos, "vector"), backend.weight(sin, "vector")
    kc = dev(to_bf16_bits(rng.standard_normal((b * per_seq, BS, NKV, HD), np.float32)))
    vc = dev(to_bf16_bits(rng.standard_normal((b * per_seq, BS, NKV, HD), np.float32)))
    pos = dev(np.full(b, CTX - 1, np.int32))
    slots = dev((np.arange(b) * CTX + CTX - 1).astype(np.int32))  # each sequence's last token
    batch = DeviceForwardBatch(
        num_tokens=b, num_seqs=b, input_ids=ids, positions=pos, slot_mapping=slots,
        query_start_loc=dev(np.arange(b + 1, dtype=np.int32)),
        seq_lens=dev(np.full(b, CTX, np.int32)),
        block_tables=dev(np.arange(b * per_seq, dtype=np.int32)),
        logits_indices=dev(np.arange(b, dtype=np.int32)), max_query_len=1, max_seq_len=CTX,
        block_table_stride=dev(np.array([per_seq], np.int32)),
    )  # fmt: skip

    def qkv_rope():
        backend.rmsnorm_qkv_rope(
            residual, norm, eps, w["qkv"], qkv, normed, pos, dcos, dsin, kc, vc, slots,
            NH, NKV, HD,
        )  # fmt: skip

    r["rmsnorm_qkv_rope"] = gpu_time_us(qkv_rope)
    r["attention_splits"] = attention_decode.choose_num_splits(b, NKV, backend.num_sms)
    r["attention"] = gpu_time_us(
        lambda: backend.attention(qkv, kc, vc, batch, NH, NKV, HD, HD**-0.5, attn_out)
    )
    r["linear_residual_o_proj"] = gpu_time_us(
        lambda: backend.linear_residual(attn_out, w["o_proj"], residual, proj_out)
    )
    r["rmsnorm_gate_up_silu"] = gpu_time_us(
        lambda: backend.rmsnorm_gate_up_silu(
            residual, norm, eps, w["gate_up"], mlp_act, normed, gate_up
        )
    )
    r["linear_residual_down"] = gpu_time_us(
        lambda: backend.linear_residual(mlp_act, w["down"], residual, proj_out)
    )
    r["gather_rows"] = gpu_time_us(
        lambda: backend.gather_rows(residual, batch.logits_indices, last_residual)
    )
    r["rmsnorm_linear_lm_head"] = gpu_time_us(
        lambda: backend.rmsnorm_linear(last_residual, norm, eps, w["lm_head"], logits, last_normed)
    )
    sampler = DeviceSampler(b, V, stream)
    r["greedy_argmax"] = gpu_time_us(lambda: sampler.launch_greedy(logits))

    # Weight streaming rate of the ops built around a matrix product.
    for op, name in [
        ("rmsnorm_qkv_rope", "qkv"),
        ("linear_residual_o_proj", "o_proj"),
        ("rmsnorm_gate_up_silu", "gate_up"),
        ("linear_residual_down", "down"),
        ("rmsnorm_linear_lm_head", "lm_head"),
    ]:
        n, k = MATRICES[name]
        r[f"{op}_weight_tb_s"] = round(n * k * 2 / r[op] / 1e6, 2)
    per_layer = ("rmsnorm_qkv_rope", "attention", "linear_residual_o_proj",
                 "rmsnorm_gate_up_silu", "linear_residual_down")  # fmt: skip
    per_step = ("embed", "gather_rows", "rmsnorm_linear_lm_head", "greedy_argmax")
    r["layer_sum_us"] = sum(r[k] for k in per_layer)
    r["step_sum_us"] = sum(r[k] for k in per_step) + CFG.num_hidden_layers * r["layer_sum_us"]
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()}


def fused_ops() -> dict:
    """The fused ops of a layer on the cuda backend vs the cpu backend's compositions
    (ComposedOps: the oracle), at Llama-3.2-1B shapes: gemv.py's kernels at 1 and 8 tokens, the
    compositions over cuBLAS at 256. The cpu side keeps the normed rows in float32 where the
    GPU rounds them to bf16: expect l2_rel of a few 1e-3."""
    mats = {}
    for name, (n, k) in MATRICES.items():
        n = LM_HEAD_CHECK_ROWS if name == "lm_head" else n
        bits = to_bf16_bits(rng.standard_normal((n, k), np.float32) * 0.02)
        mats[name] = (backend.weight(bits, "matrix"), from_bf16_bits(bits))
    norm = (1 + 0.1 * rng.standard_normal(H)).astype(np.float32)
    cos, sin = rope_cos_sin(HD, CFG.rope_theta, 8192, CFG.rope_scaling)
    tables = (norm, backend.weight(norm, "vector"), cos, sin, dev(cos), dev(sin))
    return {f"tokens_{t}": _fused_case(t, mats, tables) for t in FUSED_TOKENS}


def _fused_case(t: int, mats: dict, tables: tuple) -> dict:
    norm, d_norm, cos, sin, d_cos, d_sin = tables
    eps = CFG.rms_norm_eps
    out: dict = {"path": "gemv" if gemv.serves(t, H) else "composed"}
    res = rng.standard_normal((t, H), np.float32) * 2
    d_res = dev(res)
    normed, normed_f32 = backend.empty((t, H), "act"), np.zeros((t, H), np.float32)

    def nan_f32(shape):
        return dev(np.full(shape, np.nan, np.float32))

    n = LM_HEAD_CHECK_ROWS
    y, want = nan_f32((t, n)), np.zeros((t, n), np.float32)
    backend.rmsnorm_linear(d_res, d_norm, eps, mats["lm_head"][0], y, normed)
    cpu.rmsnorm_linear(res, norm, eps, mats["lm_head"][1], want, normed_f32)
    out["rmsnorm_linear_lm_head"] = relative_errors(backend.to_host(y), want)

    # rmsnorm_qkv_rope: random distinct slots, the last row a padding row (slot -1) if t > 1.
    nblk = max(64, 2 * t // BS)
    kc = np.zeros((nblk, BS, NKV, HD), np.float32)
    vc = np.zeros_like(kc)
    pos = rng.integers(0, cos.shape[0], t).astype(np.int32)
    slots = rng.choice(nblk * BS, t, replace=False).astype(np.int32)
    if t > 1:
        slots[-1] = -1
    d_k, d_v = dev(to_bf16_bits(kc)), dev(to_bf16_bits(vc))
    qkv_n = MATRICES["qkv"][0]
    d_qkv, qkv = nan_f32((t, qkv_n)), np.zeros((t, qkv_n), np.float32)
    backend.rmsnorm_qkv_rope(
        d_res, d_norm, eps, mats["qkv"][0], d_qkv, normed, dev(pos), d_cos, d_sin, d_k, d_v,
        dev(slots), NH, NKV, HD,
    )  # fmt: skip
    cpu.rmsnorm_qkv_rope(
        res, norm, eps, mats["qkv"][1], qkv, normed_f32, pos, cos, sin, kc, vc, slots,
        NH, NKV, HD,
    )  # fmt: skip
    out["rmsnorm_qkv_rope_qkv"] = relative_errors(backend.to_host(d_qkv), qkv)
    out["rmsnorm_qkv_rope_k_cache"] = relative_errors(backend.to_host(d_k), kc)
    out["rmsnorm_qkv_rope_v_cache"] = relative_errors(backend.to_host(d_v), vc)

    # linear_residual: the error of what was added (the residual itself would hide it).
    for name in ("o_proj", "down"):
        n, k = MATRICES[name]
        x = to_bf16_bits(rng.standard_normal((t, k), np.float32))
        d_r, r = dev(res), res.copy()
        backend.linear_residual(dev(x), mats[name][0], d_r, nan_f32((t, n)))
        cpu.linear_residual(from_bf16_bits(x), mats[name][1], r, np.zeros((t, n), np.float32))
        got = backend.to_host(d_r) - res
        out[f"linear_residual_{name}_added"] = relative_errors(got, r - res)

    d_act = cuda.to_device(np.full((t, INTER), 0x7FC0, np.uint16), stream=stream)
    act = np.zeros((t, INTER), np.float32)
    backend.rmsnorm_gate_up_silu(
        d_res, d_norm, eps, mats["gate_up"][0], d_act, normed, nan_f32((t, 2 * INTER))
    )
    cpu.rmsnorm_gate_up_silu(
        res, norm, eps, mats["gate_up"][1], act, normed_f32, np.zeros((t, 2 * INTER), np.float32)
    )
    out["rmsnorm_gate_up_silu"] = relative_errors(backend.to_host(d_act), act)
    return out


if __name__ == "__main__":
    results = Results("check_kernels")
    results.section("env", env)
    results.section("bandwidth", bandwidth)
    results.section("gemm", gemm_rate)
    results.section("decode_kernel_times_us", decode_kernel_times)
    results.section("full_size_vs_numpy", full_size)
    results.section("fused_ops_vs_numpy", fused_ops)
