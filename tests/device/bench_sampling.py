"""Device microbenchmark (issue 22): the sampler alone, at batch 1 / 8 / 64 / 256 x vocabularies
of 128,256 (Llama 3) and 49,152 (SmolLM2), for greedy (argmax.py's two kernels, and the general
sampler's greedy rows), temperature, top-k 50, top-p 0.9, min-p 0.1, and penalties + top-p
(rows with a token state: a 500-token prompt, 200 output tokens, an active ban). Each case is
checked once against the numpy twin (batch <= 8: the twin is slow on 256 rows), then timed.

Timing: the sampler's launches captured into a CUDA graph with programmatic edges (as
the decode step replays them, gpu/backends/cuda/graphs.py), replays queued behind a sleeping
kernel so Python's launch overhead is not measured; CUDA events around each replay, the
median of REPS after a warm-up. Logits are N(0, 3^2) (temperature 1: scores as stored equal
the logits, so every replay does the same work). The budget (module docstring of
gpu/kernels/sampling.py): ~50 us at batch 1 and 8, ~75 at 64, ~100 at 256.

From the repo root on the GPU machine: python3 tests/device/bench_sampling.py [--quick]
[--std S] [--batches 1,8,64,256] [--vocabs 128256,49152] [--breakdown-batches 64,256];
writes $OUT/bench_sampling.json and prints a table last; a first section times each pass
alone (eager launches with events between them) for each truncating case. --std sets the
logits' spread: 3 by default; ~1.3 is the Llama-3.2-1B random weights' at temperature 0.7 (logits
of std ~0.9: flat rows whose top-p nucleus holds ~half the vocabulary), where the candidate
copy overflows and every pass reads the whole row.
"""

from __future__ import annotations

import argparse

import numpy as np
from common import Results
from numba import cuda

from gpu.backends.cuda.graphs import CudaGraph
from gpu.kernels import argmax, sampling
from gpu.sampling import SamplingMetadata
from gpu.sampling import token_state as ts
from gpu.sampling.numpy_sampler import sample as numpy_sample

VOCABS = [128_256, 49_152]
BATCHES = [1, 8, 64, 256]
CASES: dict[str, dict | None] = {
    "argmax": None,  # argmax.py (the all-greedy fast path)
    "greedy": {},
    "temperature": {"temperature": 1.0},
    "top_k_50": {"temperature": 1.0, "top_k": 50},
    "top_p_0.9": {"temperature": 1.0, "top_p": 0.9},
    "min_p_0.1": {"temperature": 1.0, "min_p": 0.1},
    "penalties_top_p": {"temperature": 1.0, "top_p": 0.9, "repetition": 1.1, "presence": 0.5,
                        "frequency": 0.2, "state": True},
}  # fmt: skip
REPS = 30
CHECK_ROWS = 8

stream = cuda.stream()
rng = np.random.default_rng(0)


@cuda.jit
def _spin(n):
    for _ in range(n):
        cuda.nanosleep(1000)


def median_us(fn, reps: int = REPS) -> float:
    fn()
    stream.synchronize()
    events = [cuda.event() for _ in range(reps + 1)]
    _spin[1, 1, stream](reps * 200 + 5000)
    events[0].record(stream)
    for i in range(reps):
        fn()
        events[i + 1].record(stream)
    events[-1].synchronize()
    times = [cuda.event_elapsed_time(events[i], events[i + 1]) for i in range(reps)]
    return round(float(np.median(times)) * 1000.0, 2)


def metadata(rows: int, params: dict) -> SamplingMetadata:
    md = SamplingMetadata.greedy(rows)
    md.temperature = np.full(rows, params.get("temperature", 0.0), np.float32)
    md.top_k = np.full(rows, params.get("top_k", 0), np.int32)
    md.top_p = np.full(rows, params.get("top_p", 1.0), np.float32)
    md.min_p = np.full(rows, params.get("min_p", 0.0), np.float32)
    md.repetition_penalty = np.full(rows, params.get("repetition", 1.0), np.float32)
    md.presence_penalty = np.full(rows, params.get("presence", 0.0), np.float32)
    md.frequency_penalty = np.full(rows, params.get("frequency", 0.0), np.float32)
    md.seed = np.arange(rows, dtype=np.uint64) + 1
    md.step = np.full(rows, 3, np.uint64)
    if params.get("state"):
        md.state_rows = np.arange(rows, dtype=np.int32)
        md.ban_active = np.ones(rows, np.int32)
    return md


def device_params(md: SamplingMetadata):
    n = md.num_rows
    f = np.zeros((6, n + 1), np.float32)
    f[sampling.F_TOP_P, n] = f[sampling.F_REPETITION, n] = 1.0
    f[sampling.F_TEMPERATURE, :n] = md.temperature
    f[sampling.F_TOP_P, :n] = md.top_p
    f[sampling.F_MIN_P, :n] = md.min_p
    f[sampling.F_REPETITION, :n] = md.repetition_penalty
    f[sampling.F_PRESENCE, :n] = md.presence_penalty
    f[sampling.F_FREQUENCY, :n] = md.frequency_penalty
    i = np.zeros((3, n + 1), np.int32)
    i[sampling.I_STATE_ROW, n] = -1
    i[sampling.I_TOP_K, :n] = md.top_k
    i[sampling.I_STATE_ROW, :n] = md.state_rows
    i[sampling.I_BAN_ACTIVE, :n] = md.ban_active
    u = np.zeros((2, n), np.uint64)
    u[sampling.U_SEED] = md.seed
    u[sampling.U_STEP] = md.step
    return [cuda.to_device(a, stream=stream) for a in (f, i, u)]


def state_table(rows: int, vocab: int) -> np.ndarray:
    state = ts.new_state(rows, vocab)
    for r in range(rows):
        tokens, values = ts.row_state(
            rng.integers(0, vocab, 500), rng.integers(0, vocab, 200), [2, 7], vocab
        )
        state[r, tokens] = values
    return state


def case(logits_host: np.ndarray, rows: int, name: str, params: dict | None) -> dict:
    vocab = logits_host.shape[1]
    host = logits_host[:rows]
    logits = cuda.to_device(host, stream=stream)
    out = cuda.device_array(rows, np.int32, stream=stream)
    ring = cuda.device_array((2, rows), np.int32, stream=stream)
    slot = cuda.to_device(np.zeros(1, np.int32), stream=stream)
    result: dict = {"chunks": sampling.chunking(rows, vocab)[0]}
    if params is None:
        size = argmax.argmax_scratch_size(rows, vocab)
        val = cuda.device_array(size, np.float32, stream=stream)
        idx = cuda.device_array(size, np.int32, stream=stream)

        def launch():
            argmax.argmax_rows(logits, out, val, idx, stream, ring, slot)

        want = np.argmax(host, axis=1)
        state_host = None
    else:
        md = metadata(rows, params)
        f, i, u = device_params(md)
        state_host = state_table(rows, vocab) if params.get("state") else ts.new_state(1, vocab)
        state = cuda.to_device(state_host, stream=stream)
        mask = cuda.to_device(ts.state_mask(state_host), stream=stream)
        scratch = sampling.sampler_scratch(rows, vocab, stream)

        def launch():
            sampling.sample(logits, f, i, u, state, mask, scratch, out, stream, ring, slot)

        want = None
        if rows <= CHECK_ROWS:
            want = numpy_sample(host.copy(), md, state_host.copy())
    launch()
    got = out.copy_to_host(stream=stream)
    stream.synchronize()
    if want is not None:
        result["exact"] = bool((got[: len(want)] == want).all())
    if params is not None and rows > CHECK_ROWS:
        result["checked"] = f"first call in range: {bool(((got >= 0) & (got < vocab)).all())}"
    graph = CudaGraph(stream, launch, programmatic=True)
    result["us"] = median_us(graph.replay)
    plain = CudaGraph(stream, launch, programmatic=False)
    result["us_no_pdl"] = median_us(plain.replay)
    result["edges"] = graph.programmatic_edges
    return result


def passes(logits, f, i, u, state, mask, scratch, out, ring, slot) -> list:
    """sampling.sample's launches one by one (the same order and arguments)."""
    rows, vocab = logits.shape
    chunks, chunk_len = sampling.chunking(rows, vocab)
    grid, threads, s = (rows, chunks), sampling.THREADS, scratch
    calls = [
        lambda: sampling.scores_kernel[grid, threads, stream](
            logits,
            chunk_len,
            f,
            i,
            u,
            state,
            mask,
            s.ticket,
            s.best,
            s.winner,
            s.runners,
            s.rowf,
            s.rowi,
            s.hist,
            out,
            ring,
            slot,
        )  # fmt: skip
    ]
    linear = sampling.linear_mass_kernel
    for kernel, digits in ((sampling.radix_count_kernel, (1, 2)), (sampling.radix_mass_kernel,
                                                                   (0, 1, 2))):  # fmt: skip
        if kernel is sampling.radix_mass_kernel:
            calls.append(
                lambda: linear[grid, threads, stream](
                    logits,
                    chunk_len,
                    f,
                    s.ticket,
                    s.hist,
                    s.rowf,
                    s.rowi,
                    s.linear_rows,
                    s.hist_rows,
                )  # fmt: skip
            )
            calls.append(
                lambda: sampling.linear_hist_kernel[grid, threads, stream](
                    logits, f, s.ticket, s.hist, s.rowf, s.rowi, s.linear_rows, s.hist_rows
                )  # fmt: skip
            )
            calls.append(
                lambda: sampling.linear_split_kernel[grid, threads, stream](
                    logits,
                    u,
                    s.ticket,
                    s.best,
                    s.winner,
                    s.rowf,
                    s.rowi,
                    s.cand_val,
                    s.cand_idx,
                    s.linear_rows,
                )  # fmt: skip
            )
        for digit in digits:
            calls.append(
                lambda kernel=kernel, digit=digit: kernel[grid, threads, stream](
                    logits,
                    chunk_len,
                    digit,
                    i,
                    f,
                    s.ticket,
                    s.hist,
                    s.rowf,
                    s.rowi,
                    s.cand_val,
                    s.cand_idx,
                )  # fmt: skip
            )
    calls.append(
        lambda: sampling.gumbel_kernel[grid, threads, stream](
            logits,
            chunk_len,
            i,
            u,
            state,
            mask,
            s.ticket,
            s.best,
            s.rowf,
            s.rowi,
            s.cand_val,
            s.cand_idx,
            out,
            ring,
            slot,
        )  # fmt: skip
    )
    return calls


def breakdown(rows: int, vocab: int, params: dict) -> dict:
    """Each pass's time (events between eager launches queued behind a sleeping kernel)."""
    logits = cuda.to_device((rng.standard_normal((rows, vocab)) * STD).astype(np.float32))
    md = metadata(rows, params)
    f, i, u = device_params(md)
    state_host = state_table(rows, vocab) if params.get("state") else ts.new_state(1, vocab)
    state = cuda.to_device(state_host, stream=stream)
    mask = cuda.to_device(ts.state_mask(state_host), stream=stream)
    scratch = sampling.sampler_scratch(rows, vocab, stream)
    out = cuda.device_array(rows, np.int32, stream=stream)
    ring = cuda.device_array((2, rows), np.int32, stream=stream)
    slot = cuda.to_device(np.zeros(1, np.int32), stream=stream)
    calls = passes(logits, f, i, u, state, mask, scratch, out, ring, slot)
    for call in calls:
        call()
    stream.synchronize()
    reps = 10
    events = [[cuda.event() for _ in range(len(calls) + 1)] for _ in range(reps)]
    _spin[1, 1, stream](reps * len(calls) * 100 + 5000)
    for r in range(reps):
        events[r][0].record(stream)
        for k, call in enumerate(calls):
            call()
            events[r][k + 1].record(stream)
    stream.synchronize()
    names = ["scores", "count1", "count2", "linear_mass", "linear_hist", "linear_split"]
    names += [f"mass{d}" for d in range(3)] + ["gumbel"]
    return {
        name: round(
            float(np.median([cuda.event_elapsed_time(e[k], e[k + 1]) for e in events])) * 1e3, 1
        )
        for k, name in enumerate(names)
    }


STD = 3.0  # the logits' standard deviation (--std)
BREAKDOWN_CASES = ["top_k_50", "top_p_0.9", "min_p_0.1", "penalties_top_p"]


def breakdowns(batches: list[int]) -> dict:
    return {
        f"{name} b{rows}": breakdown(rows, 128_256, CASES[name])
        for name in BREAKDOWN_CASES
        for rows in batches
    }


def run_vocab(vocab: int, batches: list[int]) -> dict:
    logits_host = (rng.standard_normal((max(batches), vocab)) * STD).astype(np.float32)
    data = {}
    for rows in batches:
        for name, params in CASES.items():
            data[f"b{rows}_{name}"] = case(logits_host, rows, name, params)
    return data


def table(data: dict) -> str:
    lines = []
    for vocab_key, cases in data.items():
        if not isinstance(cases, dict) or not vocab_key.startswith("vocab"):
            continue
        lines.append(f"\n{vocab_key}: us per call (graph with PDL edges / without)")
        names = list(CASES)
        lines.append("batch  " + "".join(f"{n:>20}" for n in names))
        for rows in BATCHES:
            cells = []
            for n in names:
                r = cases.get(f"b{rows}_{n}")
                if not isinstance(r, dict) or "us" not in r:
                    cells.append(f"{'-':>20}")
                    continue
                mark = "" if r.get("exact", True) else "!"
                cells.append(f"{r['us']:>11.1f} / {r['us_no_pdl']:>5.1f}{mark:1}")
            lines.append(f"{rows:<7}" + "".join(cells))
    passes_us = data.get("breakdown")
    if isinstance(passes_us, dict):
        lines.append(f"\nus per pass (eager), vocab 128,256, logits std {STD}:")
        for case_batch, times in passes_us.items():
            lines.append(f"{case_batch:<22} {times}")
    return "\n".join(lines)


def main() -> None:
    global STD
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="batches 1 and 8 only")
    p.add_argument("--std", type=float, default=3.0)
    p.add_argument("--batches", default=",".join(map(str, BATCHES)))
    p.add_argument("--vocabs", default=",".join(map(str, VOCABS)))
    p.add_argument("--breakdown-batches", default="1,8,64,256")
    args = p.parse_args()
    STD = args.std
    batches = [1, 8] if args.quick else [int(b) for b in args.batches.split(",")]
    results = Results("bench_sampling")
    results.section("breakdown", breakdowns, [int(b) for b in args.breakdown_batches.split(",")])
    for vocab in (int(v) for v in args.vocabs.split(",")):
        results.section(f"vocab{vocab}", run_vocab, vocab, batches)
    print(table(results.data))


if __name__ == "__main__":
    main()
