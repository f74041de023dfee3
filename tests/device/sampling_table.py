"""Issue 22's table: decode tok/s for each sampling setting beside greedy, through the engine.

    python3 tests/device/sampling_table.py [--config llama-3.2-1b] [--batches 1,8,64]

Builds an engine on a preset config with random bf16 weights (no download), then for each batch
and setting adds `batch` requests of a 32-token prompt and 512 new tokens (ignore_eos, seeded)
and times the loop of engine.step() from the step that gave every request its first token to
the last. Outputs are DELTA, as the app streams them: cumulative ones copied every request's
whole token list each step, host work the app does not do (0.12 ms a step at batch 256 on the
2-core host, engine with a stub executor).
The settings are gpu.bench.sampling's (chat: the app's defaults); the heap is frozen after the
build, as the engine core process does (gpu/engine_core/heap.py). It uses the public
engine API (build_engine, add_request, step), so tests/device/ab_trees.sh can run it on the code
before a change and after it in one call.
Prints one line per (batch, setting) with its ratio to greedy, the longest step of the window
and any collector pause in it (a stall of hundreds of ms there is the collector, not the
sampler), and writes JSON to $OUT/sampling_table_<config>.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time

import numpy as np

from gpu.backends import get_backend
from gpu.bench.sampling import SETTINGS  # the app's defaults ("chat") defined once there
from gpu.config import EngineConfig
from gpu.engine_core.heap import freeze_startup_heap
from gpu.loader import build_engine
from gpu.model_weights import random_hf_tensors
from gpu.presets import preset_config
from gpu.sampling_params import RequestOutputKind

DELTA = RequestOutputKind.DELTA  # what the app streams: each step's new tokens only


def run(engine, batch: int, setting: str, prompt_len: int, new_tokens: int, vocab: int) -> float:
    """Decode tok/s once every request has its first token: the prompts' prefill (several
    mixed steps at batch 256, some sequences already decoding) stays out of the window, and
    with it a mixed step's graph captured there the first time its shape comes up."""
    rng = np.random.default_rng(batch)
    for i in range(batch):
        prompt = rng.integers(0, vocab, prompt_len).tolist()
        params = SETTINGS[setting].sampling_params(
            max_tokens=new_tokens, ignore_eos=True, seed=1000 + i, output_kind=DELTA
        )
        engine.add_request(prompt, params)
    counts: dict[str, int] = {}  # each request's tokens so far (the sum of its deltas)
    first = None
    at_first = 0
    longest = 0.0
    pauses.clear()
    while engine.has_unfinished_requests():
        t = time.perf_counter()
        for out in engine.step():
            delta = len(out.outputs[0].token_ids) if out.outputs else 0
            counts[out.request_id] = counts.get(out.request_id, 0) + delta
        if first is not None:
            longest = max(longest, time.perf_counter() - t)
        if first is None and len(counts) == batch and min(counts.values()) > 0:
            first, at_first = time.perf_counter(), sum(counts.values())
            pauses.clear()
    end = time.perf_counter()
    window["longest_step_ms"] = 1e3 * longest
    window["gc"] = [(g, round(1e3 * d, 2)) for g, d in pauses if d > 0.002]
    return (sum(counts.values()) - at_first) / (end - first)


# Collector pauses inside the timed window (generation, seconds): a stall of a few hundred ms
# in one row is a full collection, not the sampler.
pauses: list[tuple[int, float]] = []
window: dict = {}
_gc_start = [0.0]


def _on_gc(phase: str, info: dict) -> None:
    if phase == "start":
        _gc_start[0] = time.perf_counter()
    else:
        pauses.append((info["generation"], time.perf_counter() - _gc_start[0]))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", default="llama-3.2-1b")
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--settings", default=",".join(SETTINGS))
    args = p.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    config = preset_config(args.config)
    tensors = random_hf_tensors(config, seed=0)
    t0 = time.perf_counter()
    cfg = EngineConfig(max_num_seqs=max(batches), max_model_len=4096)
    engine = build_engine(config, tensors.__getitem__, get_backend("cuda"), cfg)
    print(f"engine built in {time.perf_counter() - t0:.1f} s", flush=True)
    freeze_startup_heap()  # as the engine core process does
    names = [s for s in args.settings.split(",") if s]
    gc.callbacks.append(_on_gc)
    results = []
    for batch in batches:
        # One short warm-up per batch and setting: graphs and kernels of this shape.
        for name in names:
            run(engine, batch, name, args.prompt_len, 8, config.vocab_size)
        greedy = None
        for name in names:
            rate = run(engine, batch, name, args.prompt_len, args.new_tokens,
                       config.vocab_size)  # fmt: skip
            if name == "greedy":
                greedy = rate
            ratio = rate / greedy if greedy else float("nan")
            results.append({"batch": batch, "setting": name, "tok_s": rate, "vs_greedy": ratio,
                            **window})  # fmt: skip
            print(f"batch {batch:4d}  {name:10s} {rate:10.1f} tok/s  {ratio:5.2f}x greedy"
                  f"  longest step {window['longest_step_ms']:7.2f} ms  gc {window['gc']}",
                  flush=True)  # fmt: skip
    out = os.environ.get("OUT")
    if out:
        path = os.path.join(out, f"sampling_table_{args.config}.json")
        with open(path, "w") as f:
            json.dump({"config": args.config, "new_tokens": args.new_tokens, "rows": results}, f)


if __name__ == "__main__":
    main()
