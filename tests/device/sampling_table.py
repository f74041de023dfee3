"""Issue 22's table: decode tok/s for each sampling setting beside greedy, through the engine.

    python3 tests/device/sampling_table.py [--config llama-3.2-1b] [--batches 1,8,64]

Builds an engine on a preset config with random bf16 weights (no download), then for each batch
and setting adds `batch` requests of a 32-token prompt and 512 new tokens (ignore_eos, seeded)
and times the loop of engine.step() from the step that gave every request its first token to
the last. It uses only the public engine API that every version of the tree has (build_engine,
add_request, step), so tests/device/ab_trees.sh can run it on the code before a change and
after it in one call.
Prints one line per (batch, setting) with its ratio to greedy, and writes JSON to
$OUT/sampling_table_<config>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

from gpu.backends import get_backend
from gpu.config import EngineConfig
from gpu.loader import build_engine
from gpu.model_weights import random_hf_tensors
from gpu.presets import preset_config
from gpu.sampling_params import SamplingParams

CHAT = {"temperature": 0.7, "top_p": 0.9, "repetition_penalty": 1.1}  # the app's defaults
SETTINGS: dict[str, dict] = {
    "greedy": {"temperature": 0.0},
    "temperature 0.7": {"temperature": 0.7},
    "top-k 50": {"temperature": 0.7, "top_k": 50},
    "top-p 0.9": {"temperature": 0.7, "top_p": 0.9},
    "min-p 0.05": {"temperature": 0.7, "min_p": 0.05},
    "chat (app defaults)": CHAT,
    "chat + presence/frequency 0.5": {**CHAT, "presence_penalty": 0.5, "frequency_penalty": 0.5},
}


def run(engine, batch: int, setting: dict, prompt_len: int, new_tokens: int, vocab: int) -> float:
    """Decode tok/s once every request has its first token: the prompts' prefill (several
    mixed steps at batch 256, some sequences already decoding) stays out of the window, and
    with it a mixed step's graph captured there the first time its shape comes up."""
    rng = np.random.default_rng(batch)
    for i in range(batch):
        prompt = rng.integers(0, vocab, prompt_len).tolist()
        params = SamplingParams(max_tokens=new_tokens, ignore_eos=True, seed=1000 + i, **setting)
        engine.add_request(prompt, params)
    counts: dict[str, int] = {}  # each request's tokens so far (outputs are cumulative)
    first = None
    at_first = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            counts[out.request_id] = len(out.outputs[0].token_ids) if out.outputs else 0
        if first is None and len(counts) == batch and min(counts.values()) > 0:
            first, at_first = time.perf_counter(), sum(counts.values())
    end = time.perf_counter()
    return (sum(counts.values()) - at_first) / (end - first)


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
    names = [s for s in args.settings.split(",") if s]
    results = []
    for batch in batches:
        # One short warm-up per batch and setting: graphs and kernels of this shape.
        for name in names:
            run(engine, batch, SETTINGS[name], args.prompt_len, 8, config.vocab_size)
        greedy = None
        for name in names:
            rate = run(engine, batch, SETTINGS[name], args.prompt_len, args.new_tokens,
                       config.vocab_size)  # fmt: skip
            if name == "greedy":
                greedy = rate
            ratio = rate / greedy if greedy else float("nan")
            results.append({"batch": batch, "setting": name, "tok_s": rate, "vs_greedy": ratio})
            print(f"batch {batch:4d}  {name:32s} {rate:10.1f} tok/s  {ratio:5.2f}x greedy",
                  flush=True)  # fmt: skip
    out = os.environ.get("OUT")
    if out:
        path = os.path.join(out, f"sampling_table_{args.config}.json")
        with open(path, "w") as f:
            json.dump({"config": args.config, "new_tokens": args.new_tokens, "rows": results}, f)


if __name__ == "__main__":
    main()
