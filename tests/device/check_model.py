"""Device check, part 2: the whole model on the cuda backend vs the numpy backend and vs
transformers, greedy agreement, batch invariance, and the eager decode speed.
Writes $OUT/check_model.json. Usage: check_model.py [config ...]"""

from __future__ import annotations

import gc
import logging
import os
import sys
import time

import numpy as np
from common import (
    Results,
    build,
    first_divergence,
    greedy_run,
    hf_greedy,
    hf_model,
    random_bf16_weights,
    relative_errors,
    top2_margin,
)

from gpu import SamplingParams
from gpu.presets import preset_config

NEW_TOKENS = int(os.environ.get("CHECK_NEW_TOKENS", 32))
BATCH_NEW_TOKENS = int(os.environ.get("CHECK_BATCH_NEW_TOKENS", 24))
BATCH_PROMPTS = int(os.environ.get("CHECK_BATCH_PROMPTS", 8))
PROMPT_MAX = int(os.environ.get("CHECK_PROMPT_MAX", 150))
OVERRIDES = (
    {"num_hidden_layers": int(os.environ["CHECK_LAYERS"])} if "CHECK_LAYERS" in os.environ else {}
)


def has_torch() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def free_gpu() -> None:
    gc.collect()
    try:
        import torch

        torch.cuda.empty_cache()
    except ImportError:
        pass
    from numba import cuda

    deallocations = getattr(cuda.current_context(), "deallocations", None)
    if deallocations is not None:  # not in the simulator
        deallocations.clear()


def model_vs_references(name: str) -> dict:
    config = preset_config(name, **OVERRIDES)
    weights = random_bf16_weights(config, seed=0)
    prompt = np.random.default_rng(1).integers(0, config.vocab_size, min(40, PROMPT_MAX)).tolist()
    out: dict = {"prompt_len": len(prompt)}

    gpu = build(config, weights, "cuda", record=True, num_kv_blocks=512, max_num_seqs=8)
    t0 = time.perf_counter()
    gpu_ids, gpu_rows = greedy_run(gpu, prompt, NEW_TOKENS)
    out["cuda_run_s"] = round(time.perf_counter() - t0, 2)
    del gpu
    free_gpu()
    cpu = build(config, weights, "cpu", record=True, num_kv_blocks=512, max_num_seqs=8)
    t0 = time.perf_counter()
    cpu_ids, cpu_rows = greedy_run(cpu, prompt, NEW_TOKENS)
    out["cpu_run_s"] = round(time.perf_counter() - t0, 2)
    del cpu

    first = relative_errors(gpu_rows[0], cpu_rows[0])
    out["last_position_logits_vs_cpu"] = first
    noise = 2 * first["max_abs"]
    out["bf16_noise"] = noise
    out["greedy_vs_cpu"] = first_divergence(gpu_ids, cpu_ids, cpu_rows, noise)
    out["cpu_top2_margins_min"] = min(top2_margin(r) for r in cpu_rows)

    for dtype in ("float32", "bfloat16") if has_torch() else ():
        model = hf_model(config, weights, dtype)
        hf_ids, hf_rows = hf_greedy(model, prompt, NEW_TOKENS)
        del model
        free_gpu()
        out[f"last_position_logits_vs_hf_{dtype}"] = relative_errors(gpu_rows[0], hf_rows[0])
        out[f"hf_{dtype}_vs_cpu"] = relative_errors(hf_rows[0], cpu_rows[0])
        out[f"greedy_vs_hf_{dtype}"] = first_divergence(gpu_ids, hf_ids, list(hf_rows), noise)
    hf = out.get("last_position_logits_vs_hf_float32", {"l2_rel": 0.0})
    out["pass_logits"] = bool(first["l2_rel"] < 2e-2 and hf["l2_rel"] < 2e-2)
    return out


def batch_invariance(name: str, noise: float) -> dict:
    """8 prompts in a busy batch (staggered arrivals, a small token budget forcing chunked
    prefill next to decodes) vs each alone, greedy, on cuda."""
    config = preset_config(name, **OVERRIDES)
    weights = random_bf16_weights(config, seed=2)
    rng = np.random.default_rng(3)
    lengths = rng.integers(min(20, PROMPT_MAX - 1), PROMPT_MAX, BATCH_PROMPTS)
    prompts = [rng.integers(0, config.vocab_size, n).tolist() for n in lengths]
    new = BATCH_NEW_TOKENS
    alone = build(config, weights, "cuda", record=True, num_kv_blocks=1024, max_num_seqs=8)
    alone_runs = [greedy_run(alone, p, new) for p in prompts]
    del alone
    free_gpu()
    busy = build(
        config, weights, "cuda", num_kv_blocks=1024, max_num_seqs=8, max_num_batched_tokens=64
    )
    params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
    pending, ids, results, step = list(enumerate(prompts)), {}, {}, 0
    max_batch = 0
    while pending or busy.has_unfinished_requests():
        if pending and step % 2 == 0:
            i, p = pending.pop(0)
            ids[i] = busy.add_request(p, params)
        for o in busy.step():
            if o.finished:
                results[o.request_id] = list(o.outputs[0].token_ids)
        max_batch = max(max_batch, busy.last_step.batch_size)
        step += 1
    del busy
    free_gpu()
    per_prompt = []
    for i, (want, rows) in enumerate(alone_runs):
        per_prompt.append(first_divergence(results[ids[i]], want, rows, noise))
    return {
        "steps": step,
        "max_batch": max_batch,
        "identical": sum(p["first_diff_step"] is None for p in per_prompt),
        "all_ok": all(p["ok"] for p in per_prompt),
        "per_prompt": per_prompt,
    }


def eager_speed() -> dict:
    """Eager decode (no CUDA graphs yet) of Llama-3.2-1B, KV cache sized from free memory."""
    config = preset_config("llama-3.2-1b")
    weights = random_bf16_weights(config, seed=4)
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    logging.getLogger("gpu.backends.cuda.backend").addHandler(Keep())
    logging.getLogger("gpu.backends.cuda.backend").setLevel(logging.INFO)
    engine = build(config, weights, "cuda", debug=False, max_num_seqs=64, max_model_len=4096)
    out: dict = {"kv_report": records, "kv_blocks": engine.num_kv_blocks}
    rng = np.random.default_rng(5)
    for batch in (1, 64):
        params = SamplingParams(temperature=0, max_tokens=129, ignore_eos=True)
        for _ in range(batch):
            engine.add_request(rng.integers(0, config.vocab_size, 32).tolist(), params)
        engine.step()  # prefill
        times = []
        while engine.has_unfinished_requests():
            t0 = time.perf_counter()
            engine.step()
            times.append(time.perf_counter() - t0)
        steady = sorted(times[5:])[: max(1, len(times) - 10)]
        ms = 1000 * float(np.median(steady))
        out[f"batch_{batch}"] = {"ms_per_step": round(ms, 2), "tok_s": round(batch * 1000 / ms)}
    return out


if __name__ == "__main__":
    names = sys.argv[1:] or ["smollm2-135m", "llama-3.2-1b"]
    results = Results("check_model")
    noise = {}
    for name in names:
        r = results.section(f"model_{name}", model_vs_references, name)
        noise[name] = (r or {}).get("bf16_noise", 0.05)
        free_gpu()
    for name in names:
        results.section(f"batch_invariance_{name}", batch_invariance, name, noise[name])
        free_gpu()
    if "CHECK_SKIP_SPEED" not in os.environ:
        results.section("eager_decode_llama-3.2-1b", eager_speed)
