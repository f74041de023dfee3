"""A few steps of a small model on the cuda backend, to run under compute-sanitizer memcheck:
a chunked prefill of three sequences (mixed with decodes: the composed ops over cuBLAS), then
decode steps at batch 3 and 1 (gemv.py's fused kernels, split-KV attention), with penalties and
bans in the sampler. Prints the tokens."""

from __future__ import annotations

import numpy as np
from common import build, random_bf16_weights

from gpu import SamplingParams
from gpu.presets import preset_config

if __name__ == "__main__":
    config = preset_config("smollm2-135m", num_hidden_layers=2)
    weights = random_bf16_weights(config, seed=0, use_torch=False)  # no torch under the sanitizer
    engine = build(config, weights, "cuda", num_kv_blocks=64, max_num_seqs=4,
                   max_num_batched_tokens=32, max_model_len=512)  # fmt: skip
    rng = np.random.default_rng(0)
    params = [
        SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
        SamplingParams(
            temperature=0.8,
            top_k=20,
            top_p=0.9,
            max_tokens=5,
            min_tokens=2,
            repetition_penalty=1.2,
            frequency_penalty=0.3,
            seed=1,
        ),  # fmt: skip
        SamplingParams(temperature=1.0, min_p=0.1, max_tokens=8, ignore_eos=True, seed=2),
    ]
    for n, p in zip((37, 5, 20), params, strict=True):
        engine.add_request(rng.integers(0, config.vocab_size, n).tolist(), p)
    steps = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                print(out.request_id, out.outputs[0].token_ids, flush=True)
        steps += 1
    print(f"sanitize_decode: {steps} steps done", flush=True)
