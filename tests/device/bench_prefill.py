"""Device microbenchmark: prefill attention (gpu/kernels/attention_prefill.py) at Llama-3.2-1B
shapes (32 query heads, 8 KV heads, head_dim 64, bf16 paged cache, block size 16).

For each case: one run checked against the numpy twin (CpuBackend.attention, relative L2
error), then GPU time by CUDA events around each launch (warm-up first; the stream is kept
busy by a sleeping kernel while the launches are queued, so Python's launch cost is not in the
measurement), median of REPS. TFLOP/s counts the useful causal work only: 4 * head_dim FLOPs
per (query head, visible key) pair (QK^T and PV). Then a sweep of tile configurations on the
two cases that matter most (BENCH_PREFILL_SWEEP=0 skips it), and of the narrow-tiles threshold
(NARROW_TOKENS) on the cases it decides. Writes $OUT/bench_prefill.json and prints a table.
Under a minute.

    python3 tests/device/bench_prefill.py
"""

from __future__ import annotations

import os
import statistics

import numpy as np
from common import Results, paged, relative_errors
from numba import cuda

from gpu.backends.cpu import CpuBackend
from gpu.kernels import attention_prefill
from gpu.kernels.attention_prefill import Tiles, choose_tiles
from gpu.kernels.bf16 import from_bf16_bits, to_bf16_bits

NH, NKV, HD, BS = 32, 8, 64, 16
SCALE = HD**-0.5
REPS = 20
CASES = {
    "chunk512_ctx512": ([512], [512]),
    "chunk1024_ctx3024": ([3024], [1024]),
    "chunk2048_ctx2048": ([2048], [2048]),
    "mixed_4x256_ctx600_60dec_ctx800": ([600] * 4 + [800] * 60, [256] * 4 + [1] * 60),
    # A chat's new turn over its cached history while 7 others stream (their decode rows are
    # attention_decode's: skipped here, as in the cuda backend's mixed step).
    "chat_turn48_ctx530_7dec": ([530] + [500] * 7, [48] + [1] * 7),
    "chat_turn128_ctx600_7dec": ([600] + [500] * 7, [128] + [1] * 7),
}
# narrow_tokens settings for the narrow-threshold sweep (0: only chunks of <= BQ rows go narrow)
NARROW_TOKENS_SWEEP = (0, 32, 64, 128, 256)
SPLITS_SWEEP = (1, 2, 4, 8)  # the narrow launch's split-KV (attention_prefill.SPLITS)
NARROW_TOKENS_CASES = (
    "chat_turn48_ctx530_7dec", "chat_turn128_ctx600_7dec", "chunk512_ctx512",
    "mixed_4x256_ctx600_60dec_ctx800",
)  # fmt: skip
WIDE_SWEEP = [Tiles(64, 32, 4, 4), Tiles(64, 32, 8, 4), Tiles(64, 32, 4, 8), Tiles(32, 32, 4, 4),
              Tiles(64, 16, 4, 2)]  # fmt: skip
NARROW_SWEEP = [Tiles(16, 64, 2, 4), Tiles(16, 32, 2, 2), Tiles(32, 32, 4, 4)]
SWEEP_CASES = ("chunk1024_ctx3024", "mixed_4x256_ctx600_60dec_ctx800")

stream = cuda.stream()


@cuda.jit
def _spin(n):
    for _ in range(n):
        cuda.nanosleep(1000)


def dev(a):
    return cuda.to_device(np.ascontiguousarray(a), stream=stream)


def causal_flops(seq_lens, query_lens) -> int:
    """4 * HD * NH per visible (query, key) pair; query j of a chunk sees p0 + j + 1 keys."""
    pairs = sum(q * (n - q) + q * (q + 1) // 2 for n, q in zip(seq_lens, query_lens, strict=True))
    return 4 * HD * NH * pairs


def gpu_ms(fn, reps: int = REPS) -> float:
    """Median GPU time of fn() in ms, one event pair per call, after a warm-up."""
    for _ in range(3):
        fn()
    stream.synchronize()
    _spin[1, 1, stream](reps * 300 + 3000)
    events = [(cuda.event(), cuda.event()) for _ in range(reps)]
    for start, end in events:
        start.record(stream)
        fn()
        end.record(stream)
    events[-1][1].synchronize()
    return statistics.median(cuda.event_elapsed_time(s, e) for s, e in events)


class Case:
    def __init__(self, name, seq_lens, query_lens):
        self.name = name
        self.seq_lens, self.query_lens = seq_lens, query_lens
        batch, qkv, k, v = paged(seq_lens, query_lens)
        self.want = np.zeros((batch.num_tokens, NH * HD), np.float32)
        CpuBackend().attention(
            qkv, np.nan_to_num(k), np.nan_to_num(v), batch, NH, NKV, HD, SCALE, self.want
        )
        self.out = dev(np.full(self.want.shape, 0x7FC0, np.uint16))
        # The split narrow launch's partials, as the cuda backend reserves them (up to 8 splits)
        o_size, ml_size = attention_prefill.split_sizes(batch.num_tokens, NH, HD, max(SPLITS_SWEEP))
        self.part_o = cuda.device_array(o_size, np.float32)
        self.part_ml = cuda.device_array(ml_size, np.float32)
        self.args = (
            dev(qkv), dev(to_bf16_bits(k)), dev(to_bf16_bits(v)), dev(batch.block_tables.ravel()),
            dev(np.array([batch.block_tables.shape[1]], np.int32)), dev(batch.query_start_loc),
            dev(batch.seq_lens),
        )  # fmt: skip
        self.n, self.max_q = len(seq_lens), max(query_lens)
        self.flops = causal_flops(seq_lens, query_lens)
        # Chat cases: the decode rows are left to attention_decode, as in a mixed step.
        self.decode_rows = not name.startswith("chat_")
        starts = batch.query_start_loc
        self.checked = np.concatenate([
            np.arange(starts[b], starts[b + 1]) for b, q in enumerate(query_lens)
            if self.decode_rows or q > 1
        ])  # fmt: skip

    def run(self, tiles=None, narrow_tokens=None, splits=None):
        attention_prefill.prefill_attention(
            *self.args, self.n, self.max_q, NH, SCALE, self.out, stream, tiles=tiles,
            decode_rows=self.decode_rows, narrow_tokens=narrow_tokens, part_o=self.part_o,
            part_ml=self.part_ml, splits=splits,
        )  # fmt: skip

    def measure(self, tiles=None, narrow_tokens=None, splits=None) -> dict:
        self.out.copy_to_device(np.full(self.want.shape, 0x7FC0, np.uint16), stream=stream)
        self.run(tiles, narrow_tokens, splits)
        got = from_bf16_bits(self.out.copy_to_host(stream=stream))
        stream.synchronize()
        errors = relative_errors(got[self.checked], self.want[self.checked])
        ms = gpu_ms(lambda: self.run(tiles, narrow_tokens, splits))
        return {
            "ms": round(ms, 4),
            "tflop_s": round(self.flops / ms / 1e9, 2),
            "gflop": round(self.flops / 1e9, 3),
            "l2_rel": errors["l2_rel"],
            "nan": errors["nan"],
        }


def env() -> dict:
    d = cuda.get_current_device()
    wide, narrow = choose_tiles(HD, NH // NKV)
    return {
        "device": str(getattr(d, "name", "?")),
        "sms": d.MULTIPROCESSOR_COUNT,
        "default_wide": str(wide),
        "default_narrow": str(narrow),
        "reps": REPS,
    }


def run_cases(cases: dict) -> dict:
    return {name: case.measure() for name, case in cases.items()}


def sweep(cases: dict) -> dict:
    """Other tile configurations (each one compiled here: a few seconds each)."""
    group = NH // NKV
    default_wide, default_narrow = choose_tiles(HD, group)
    out = {}
    for name in SWEEP_CASES:
        case = cases[name]
        for wide in WIDE_SWEEP:
            if wide.fits(HD, group) and wide != default_wide:
                out[f"{name} wide={wide}"] = case.measure((wide, default_narrow))
        if min(case.query_lens) == 1:
            for narrow in NARROW_SWEEP:
                if narrow.fits(HD, group) and narrow != default_narrow:
                    out[f"{name} narrow={narrow}"] = case.measure((default_wide, narrow))
    return out


def narrow_sweep(cases: dict) -> dict:
    """The narrow-tiles threshold (attention_prefill.NARROW_TOKENS) on the cases it decides."""
    return {
        f"{name} narrow_tokens={n}": cases[name].measure(narrow_tokens=n)
        for name in NARROW_TOKENS_CASES
        for n in NARROW_TOKENS_SWEEP
    }


def splits_sweep(cases: dict) -> dict:
    """The narrow launch's split-KV on the chat cases (short chunks over a long history)."""
    return {
        f"{name} splits={n}": cases[name].measure(splits=n)
        for name in cases
        if name.startswith("chat_")
        for n in SPLITS_SWEEP
    }


def table(results: Results) -> None:
    print(f"\n{'case':74s} {'ms':>9s} {'TFLOP/s':>8s} {'l2_rel':>9s}")
    for section in ("cases", "splits", "narrow", "sweep"):
        for name, r in (results.data.get(section) or {}).items():
            if isinstance(r, dict) and "ms" in r:
                print(f"{name:74s} {r['ms']:9.3f} {r['tflop_s']:8.2f} {r['l2_rel']:9.2e}")


if __name__ == "__main__":
    results = Results("bench_prefill")
    results.section("env", env)
    built = results.section("build", lambda: {n: Case(n, *c) for n, c in CASES.items()})
    if built:
        results.data["build"] = {n: {"gflop": round(c.flops / 1e9, 3)} for n, c in built.items()}
        results.section("cases", run_cases, built)
        results.section("splits", splits_sweep, built)
        results.section("narrow", narrow_sweep, built)
        if os.environ.get("BENCH_PREFILL_SWEEP", "1") != "0":  # 0: skip the tile sweep
            results.section("sweep", sweep, built)
    table(results)
