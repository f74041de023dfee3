"""How much Python one engine step costs, with the model taken out.

A stub executor returns a token per row at once, so what is timed is the scheduler, the block
manager, the runner's input preparation and the output processing — the part of a step the
GPU would wait for. Run: `tinychat bench scheduler` (or `python -m gpu.bench.scheduler_overhead`).

Python's garbage collector is part of what is timed: a 256-sequence decode step creates about
1,300 tracked objects (mostly the RequestOutput, CompletionOutput and lists it must return), so
the young generation is collected once or twice a step, about a tenth of the step's host time.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np

from gpu.config import EngineConfig
from gpu.engine import LLMEngine
from gpu.sampling_params import RequestOutputKind, SamplingParams


class StubExecutor:
    def execute(self, batch, metadata) -> np.ndarray:
        return np.full(metadata.num_rows, 7, dtype=np.int32)


def measure(num_seqs: int, steps: int = 200, detokenize: bool = False, tokenizer=None) -> dict:
    """Median and p90 host time of a decode step with num_seqs running sequences."""
    config = SimpleNamespace(vocab_size=32000, max_position_embeddings=1 << 16)
    engine_cfg = EngineConfig(max_num_seqs=num_seqs, max_num_batched_tokens=max(num_seqs, 2048))
    engine = LLMEngine(
        StubExecutor(),
        tokenizer,
        config,
        num_kv_blocks=num_seqs * 64,
        max_model_len=1 << 15,
        config=engine_cfg,
    )
    params = SamplingParams(
        temperature=0,
        max_tokens=steps + 10,
        ignore_eos=True,
        detokenize=detokenize,
        output_kind=RequestOutputKind.DELTA,  # what a streaming client (the app) asks for
    )
    rng = np.random.default_rng(0)
    for _ in range(num_seqs):
        engine.add_request(list(map(int, rng.integers(0, 32000, 200))), params)
    while any(s.num_output_tokens == 0 for s in engine.requests.values()):
        engine.step()  # prefill everyone first
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    times_ms = np.array(times) * 1e3
    return {
        "num_seqs": num_seqs,
        "detokenize": detokenize,
        "median_ms": float(np.median(times_ms)),
        "p90_ms": float(np.percentile(times_ms, 90)),
        "per_seq_us": float(np.median(times_ms) * 1e3 / num_seqs),
    }


def main(sizes: tuple[int, ...] = (1, 64, 256), tokenizer=None) -> list[dict]:
    rows = [measure(n) for n in sizes]
    if tokenizer is not None:
        rows += [measure(n, detokenize=True, tokenizer=tokenizer) for n in sizes]
    print(f"{'seqs':>6} {'detok':>6} {'median ms':>10} {'p90 ms':>8} {'us/seq':>8}")
    for r in rows:
        print(
            f"{r['num_seqs']:>6} {str(r['detokenize']):>6} {r['median_ms']:>10.3f} "
            f"{r['p90_ms']:>8.3f} {r['per_seq_us']:>8.2f}"
        )
    return rows


if __name__ == "__main__":
    main()
