"""How much Python one engine step costs, with the model taken out.

A stub executor returns a token per row at once, so what is timed is the scheduler, the block
manager, the runner's input preparation (the sampling arrays included) and the output
processing — the part of a step the GPU would wait for. Run: `tinychat bench scheduler
[--sampling greedy,chat]` (or `python -m gpu.bench.scheduler_overhead`): a row per sampling
setting, since every setting but greedy builds the rows' sampling arrays
(gpu/sampling_batch.py).

Python's garbage collector is part of what is timed: a 256-sequence decode step creates about
1,300 tracked objects (mostly the RequestOutput, CompletionOutput and lists it must return), so
the young generation is collected once or twice a step, about a tenth of the step's host time.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np

from gpu.bench.sampling import SETTINGS
from gpu.config import EngineConfig
from gpu.engine import LLMEngine
from gpu.sampling_params import RequestOutputKind


class StubExecutor:
    def execute(self, batch, metadata) -> np.ndarray:
        return np.full(metadata.num_rows, 7, dtype=np.int32)


def measure(
    num_seqs: int,
    steps: int = 200,
    detokenize: bool = False,
    tokenizer=None,
    sampling: str = "greedy",
) -> dict:
    """Median and p90 host time of a decode step with num_seqs running sequences, each with
    the sampling setting `sampling` (a name of gpu.bench.sampling.SETTINGS)."""
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
    params = SETTINGS[sampling].sampling_params(
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
        "sampling": sampling,
        "detokenize": detokenize,
        "median_ms": float(np.median(times_ms)),
        "p90_ms": float(np.percentile(times_ms, 90)),
        "per_seq_us": float(np.median(times_ms) * 1e3 / num_seqs),
    }


def main(
    sizes: tuple[int, ...] = (1, 64, 256),
    tokenizer=None,
    settings: tuple[str, ...] = ("greedy", "chat"),
) -> list[dict]:
    rows = [measure(n, sampling=name) for name in settings for n in sizes]
    if tokenizer is not None:
        rows += [measure(n, detokenize=True, tokenizer=tokenizer) for n in sizes]
    header = ("seqs", "sampling", "detok", "median ms", "p90 ms", "us/seq")
    print("{:>6} {:>12} {:>6} {:>10} {:>8} {:>8}".format(*header))
    for r in rows:
        print(
            f"{r['num_seqs']:>6} {r['sampling']:>12} {str(r['detokenize']):>6} "
            f"{r['median_ms']:>10.3f} {r['p90_ms']:>8.3f} {r['per_seq_us']:>8.2f}"
        )
    return rows


if __name__ == "__main__":
    main()
