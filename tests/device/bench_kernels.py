"""Device microbenchmark (issue 5): the decode attention at Llama-3.2-1B shapes and the greedy
argmax, each result checked once against its numpy twin. Writes $OUT/bench_kernels.json and
prints a table last. From the repo root on the GPU machine: python3 tests/device/bench_kernels.py
(about 20-30 s, most of it compiling).

Timing: CUDA events around every launch of a run of REPS, queued behind a sleeping kernel so
Python's launch overhead is not measured; the median after a warm-up. Attention is timed two
ways: "cold", each launch reading a different copy of the KV data from a 256 MB pool (what a
decode step sees: the layer's KV was evicted from the 50 MB L2 by the weights streamed in
between), which gives the GB/s figure, and "warm", the same data every launch (L2-resident for
the small cases).
"""

from __future__ import annotations

import time

import numpy as np
from common import Results, relative_errors
from numba import cuda

from gpu.backends.cpu import CpuBackend
from gpu.forward_batch import ForwardBatch
from gpu.kernels import argmax, attention_decode
from gpu.kernels.bf16 import from_bf16_bits, to_bf16_bits
from gpu.presets import preset_config

CFG = preset_config("llama-3.2-1b")
NH, NKV, HD, V = CFG.num_attention_heads, CFG.num_key_value_heads, CFG.head_dim, CFG.vocab_size
BS = 16
# (1, 32): one busy split, no partials; (1, 128): two busy splits merged by the last block;
# (64 / 256, 128): the decode bench's contexts, where batch 256 walks a warp per head.
ATTENTION_CASES = [
    (1, 32), (1, 128), (1, 1024), (1, 4096), (8, 1024), (64, 128), (64, 1024), (256, 128),
    (256, 512), (256, 1024),
]  # fmt: skip
ARGMAX_ROWS = [1, 64]
POOL_BLOCKS = max(b * -(-ctx // BS) for b, ctx in ATTENTION_CASES)  # 8192: 2 x 128 MB
REPS = 50
CHECK_SEQS = 4  # sequences of each case checked against the numpy twin
COPY_TB_S = 4.25  # the measured device copy rate (docs/DESIGN.md)

stream = cuda.stream()
rng = np.random.default_rng(0)


@cuda.jit
def _spin(n):
    for _ in range(n):
        cuda.nanosleep(1000)


def median_us(fn, reps: int = REPS) -> float:
    """Median GPU time of fn(i), i = 0..reps-1, in microseconds (after one warm-up call)."""
    fn(0)
    stream.synchronize()
    events = [cuda.event() for _ in range(reps + 1)]
    _spin[1, 1, stream](reps * 300 + 2000)  # the GPU waits while Python queues the launches
    events[0].record(stream)
    for i in range(reps):
        fn(i)
        events[i + 1].record(stream)
    events[-1].synchronize()
    times = [cuda.event_elapsed_time(events[i], events[i + 1]) for i in range(reps)]
    return round(float(np.median(times)) * 1000.0, 2)


def dev(a):
    return cuda.to_device(np.ascontiguousarray(a), stream=stream)


def bf16_pool() -> np.ndarray:
    """POOL_BLOCKS cache blocks of random bf16 bits: a 1,000,003-value random period tiled
    (quick to make; not a multiple of a row, so no two tokens' rows are equal)."""
    base = to_bf16_bits(rng.standard_normal(1_000_003, np.float32))
    return np.resize(base, (POOL_BLOCKS, BS, NKV, HD))


def attention_case(batch: int, ctx: int, k_pool, v_pool, k_host, v_host, num_sms: int) -> dict:
    per_seq = -(-ctx // BS)
    need = batch * per_seq
    copies = POOL_BLOCKS // need
    # Copy c owns blocks [c * need, (c + 1) * need) of the pool, shuffled among its sequences.
    tables = [
        dev((c * need + rng.permutation(need)).astype(np.int32).reshape(batch, per_seq).ravel())
        for c in range(min(copies, REPS + 1))
    ]
    stride = dev(np.array([per_seq], np.int32))
    qsl = dev(np.arange(batch + 1, dtype=np.int32))
    lens = dev(np.full(batch, ctx, np.int32))
    qkv_host = rng.standard_normal((batch, (NH + 2 * NKV) * HD), np.float32)
    qkv = dev(qkv_host)
    out = cuda.device_array((batch, NH * HD), np.uint16, stream=stream)
    splits = attention_decode.choose_num_splits(batch, NKV, num_sms)
    acc, ml = attention_decode.partial_sizes(batch, NH, HD, splits)
    part_acc = cuda.device_array(max(acc, 1), np.float32, stream=stream)
    part_ml = cuda.device_array(max(ml, 1), np.float32, stream=stream)
    # Zeroed once: every launch leaves the split counters at zero again.
    counters = dev(np.zeros(max(attention_decode.counter_size(batch, NKV, splits), 1), np.int32))
    warp_ctx = attention_decode.choose_warp_heads_ctx(batch, NKV, num_sms, splits, HD, NH // NKV)

    def run(table):
        attention_decode.decode_attention(
            qkv, k_pool, v_pool, table, stride, qsl, lens, batch, NH, HD**-0.5, out,
            part_acc, part_ml, splits, stream, counters=counters, warp_heads_ctx=warp_ctx,
        )  # fmt: skip

    # Correctness, once: the first CHECK_SEQS sequences of copy 0 against the numpy twin.
    run(tables[0])
    first_bits = out.copy_to_host(stream=stream)
    stream.synchronize()
    got = from_bf16_bits(first_bits)
    n = min(batch, CHECK_SEQS)
    blocks = tables[0].copy_to_host()[: n * per_seq]
    want = np.zeros((n, NH * HD), np.float32)
    sub = ForwardBatch(
        num_tokens=n, num_seqs=n, input_ids=None, positions=None, slot_mapping=None,
        query_start_loc=np.arange(n + 1, dtype=np.int32),
        seq_lens=np.full(n, ctx, np.int32),
        block_tables=np.arange(n * per_seq, dtype=np.int32).reshape(n, per_seq),
        logits_indices=None, max_query_len=1, max_seq_len=ctx,
    )  # fmt: skip
    kf, vf = from_bf16_bits(k_host[blocks]), from_bf16_bits(v_host[blocks])
    CpuBackend().attention(qkv_host[:n], kf, vf, sub, NH, NKV, HD, HD**-0.5, want)
    result = {"batch": batch, "context": ctx, "splits": splits, "copies": len(tables)}
    result["warp_per_head"] = 0 < ctx <= warp_ctx
    result["busy_splits"] = attention_decode.busy_splits(ctx, splits, HD)
    result["blocks_per_sm"] = attention_decode.BLOCKS_PER_SM
    result["counters_zero"] = bool((counters.copy_to_host() == 0).all())
    result["check"] = relative_errors(got[:n], want)
    result["check"]["ok"] = bool(
        result["check"]["max_abs"] < 2e-2 and not result["check"]["nan"] and result["counters_zero"]
    )

    kv_bytes = 2 * batch * ctx * NKV * HD * 2
    result["kv_mb"] = round(kv_bytes / 1e6, 2)
    result["us"] = median_us(lambda i: run(tables[i % len(tables)]))
    result["us_warm"] = median_us(lambda i: run(tables[0]))
    # After ~100 launches on the same counters: still zero, and the same bits as the first.
    run(tables[0])
    again = out.copy_to_host(stream=stream)
    stream.synchronize()
    result["repeat_identical"] = bool((again == first_bits).all())
    result["check"]["ok"] &= result["repeat_identical"]
    result["check"]["ok"] &= bool((counters.copy_to_host() == 0).all())
    result["kv_gb_s"] = round(kv_bytes / result["us"] / 1e3, 1)
    result["of_copy_rate"] = round(result["kv_gb_s"] / (COPY_TB_S * 1e3), 3)
    return result


def argmax_case(rows: int) -> dict:
    logits_host = (rng.standard_normal((rows, V)) * 3).astype(np.float32)
    logits_host[:, V // 2 + 1] = logits_host[:, 77] = 50.0  # a tie: the first index wins
    logits = dev(logits_host)
    size = argmax.argmax_scratch_size(rows, V)
    val = cuda.device_array(size, np.float32, stream=stream)
    idx = cuda.device_array(size, np.int32, stream=stream)
    out = cuda.device_array(rows, np.int32, stream=stream)
    argmax.argmax_rows(logits, out, val, idx, stream)
    got = out.copy_to_host(stream=stream)
    stream.synchronize()
    result = {"rows": rows, "vocab": V, "chunks": size // rows}
    result["exact"] = bool((got == np.argmax(logits_host, axis=1)).all())
    result["us"] = median_us(lambda i: argmax.argmax_rows(logits, out, val, idx, stream))
    result["gb_s"] = round(rows * V * 4 / result["us"] / 1e3, 1)
    try:  # the general sampler's greedy path, for comparison
        from gpu.backends.cuda.sampler import DeviceSampler
        from gpu.sampling import SamplingMetadata

        sampler = DeviceSampler(rows, V, stream)
        sampler.stage(SamplingMetadata.greedy(rows))
        sampler.staging.upload()
        result["sample_kernel_greedy_us"] = median_us(lambda i: sampler.launch(logits), 20)
    except Exception as exc:  # noqa: BLE001 - a comparison figure, never a failure
        result["sample_kernel_greedy_us"] = f"{type(exc).__name__}: {exc}"
    return result


def attention_all() -> dict:
    t0 = time.perf_counter()
    k_host, v_host = bf16_pool(), bf16_pool()
    k_pool, v_pool = dev(k_host), dev(v_host)
    num_sms = getattr(cuda.get_current_device(), "MULTIPROCESSOR_COUNT", 4)  # 4: simulator
    out = {"pool_mb": round(2 * k_host.nbytes / 1e6), "setup_s": round(time.perf_counter() - t0)}
    for batch, ctx in ATTENTION_CASES:
        out[f"b{batch}_ctx{ctx}"] = attention_case(
            batch, ctx, k_pool, v_pool, k_host, v_host, num_sms
        )
    return out


def argmax_all() -> dict:
    return {f"rows{r}": argmax_case(r) for r in ARGMAX_ROWS}


def table(data: dict) -> str:
    lines = [
        "decode attention (Llama-3.2-1B: 32 q heads, 8 KV heads, head_dim 64, bf16 KV;"
        f" launch bounds {attention_decode.BLOCKS_PER_SM} blocks/SM)"
    ]
    lines.append(f"{'batch':>5} {'ctx':>5} {'splits':>6} {'busy':>4} {'warp':>4} {'KV MB':>7}"
                 f" {'us':>8} {'us warm':>8} {'GB/s':>7} {'of copy':>7}  check")  # fmt: skip
    for r in (data.get("attention") or {}).values():
        if not isinstance(r, dict) or "us" not in r:
            continue
        lines.append(
            f"{r['batch']:>5} {r['context']:>5} {r['splits']:>6} {r['busy_splits']:>4}"
            f" {'yes' if r.get('warp_per_head') else 'no':>4} {r['kv_mb']:>7} {r['us']:>8}"
            f" {r['us_warm']:>8} {r['kv_gb_s']:>7} {r['of_copy_rate']:>7}"
            f"  {'ok' if r['check']['ok'] else 'FAIL'} (max abs {r['check']['max_abs']:.1e})"
        )
    lines.append("argmax_rows (fp32 logits, vocab 128,256)")
    for r in (data.get("argmax") or {}).values():
        if isinstance(r, dict) and "us" in r:
            lines.append(
                f"  rows {r['rows']:>3}: {r['us']:>7} us, {r['gb_s']:>7} GB/s, exact {r['exact']},"
                f" sample_kernel greedy {r['sample_kernel_greedy_us']} us"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    results = Results("bench_kernels")
    results.section("attention", attention_all)
    results.section("argmax", argmax_all)
    print("\n" + table(results.data), flush=True)
