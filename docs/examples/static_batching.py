"""Static batching against continuous batching, on the real engine and a tiny random model.

Static batching runs a fixed group of requests together until the longest of them is done: a
request that finishes early leaves its row of the batch empty, and the requests waiting behind
the group wait for all of it. Continuous batching (gpu/scheduler.py) refills a row the step
after it frees. Both run here on the same engine with room for 4 sequences a step; the static
way adds the next group only once the engine is empty. Greedy outputs do not depend on the
batch, so both produce the same tokens; what differs is the number of steps.

(The CUDA graphs keep one static idea: a step's batch is padded up to the nearest captured
size, gpu/backends/cuda/graphs.py: bucket_for.)

    python docs/examples/static_batching.py
"""

from __future__ import annotations

import numpy as np
from tiny_model import tiny_engine

from gpu.engine import LLMEngine
from gpu.sampling_params import SamplingParams

ROWS = 4  # sequences a step can hold


def run(engine: LLMEngine, requests: list[tuple[list[int], int]], group: int) -> tuple:
    """Add `group` requests whenever the engine is empty (group = all of them: continuous);
    returns the steps taken, the rows they filled, and each request's tokens."""
    tokens: dict[str, list[int]] = {}
    steps = rows = 0
    pending = list(enumerate(requests))
    while pending or engine.has_unfinished_requests():
        if not engine.has_unfinished_requests():
            for i, (prompt, n) in pending[:group]:
                params = SamplingParams(
                    temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False
                )
                engine.add_request(prompt, params, request_id=str(i))
            pending = pending[group:]
        outputs = engine.step()
        steps += 1
        rows += engine.stats().last_step.batch_size
        for out in outputs:
            if out.finished:
                tokens[out.request_id] = list(out.outputs[0].token_ids)
    return steps, rows, [tokens[str(i)] for i in range(len(requests))]


def main() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 40, size=16)  # new tokens per request, very unequal
    requests = [([int(t) for t in rng.integers(0, 300, size=5)], int(n)) for n in lengths]

    static = run(tiny_engine(max_num_seqs=ROWS, async_scheduling=False), requests, group=ROWS)
    continuous = run(
        tiny_engine(max_num_seqs=ROWS, async_scheduling=False), requests, group=len(requests)
    )
    assert static[2] == continuous[2], "greedy tokens must not depend on the batching"
    assert continuous[0] < static[0]
    for name, (steps, rows, _) in (("static", static), ("continuous", continuous)):
        print(f"{name:10s} {steps:4d} steps, {rows / (steps * ROWS):4.0%} of the batch rows busy")


if __name__ == "__main__":
    main()
