"""The yardstick: Hugging Face transformers on the same weights and workload (`--compare hf`).

Optional and never a dependency: torch and transformers are imported only when asked for, on a
machine that has them (the GPU machine does). Two ways of running transformers are measured:
"eager" (generate with its dynamic cache) and "static" (its static cache with the forward under
torch.compile — transformers' own fast path). Decode tok/s is (batch x (new - 1)) over the time
of generate(new tokens) minus the time of generate(1 token), i.e. with the prefill taken out.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np


def _model(config: Any, tensors: dict[str, np.ndarray]):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    hf = config.to_dict()
    hf.pop("architectures", None)
    model = LlamaForCausalLM(LlamaConfig(**hf)).to(torch.bfloat16)
    state = {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in tensors.items()}
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    return model.cuda().eval()


def _generate_time(model, batch: int, prompt_len: int, new: int, vocab: int, **kw) -> float:
    import torch

    ids = torch.randint(1000 % vocab, vocab, (batch, prompt_len), device="cuda")
    mask = torch.ones_like(ids)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad():
        model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=0,
            **kw,
        )
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def decode_tok_s(model, batch: int, prompt_len: int, new: int, vocab: int, **kw) -> float:
    for n in (2, new):  # warm-up (and, for the static cache, compilation) of both shapes
        _generate_time(model, batch, prompt_len, n, vocab, **kw)
    prefill = min(_generate_time(model, batch, prompt_len, 1, vocab, **kw) for _ in range(3))
    full = min(_generate_time(model, batch, prompt_len, new, vocab, **kw) for _ in range(2))
    return batch * (new - 1) / max(full - prefill, 1e-9)


def run_hf(
    config: Any,
    tensors: dict[str, np.ndarray] | None,
    args: Any,
    batches: list[int],
    workloads: list[str],
) -> dict:
    """tok/s of transformers for batch 1 and the decode batches, eager and static."""
    if tensors is None:
        return {"error": "--compare hf needs --config (random weights shared with transformers)"}
    try:
        import torch
    except ImportError:
        return {"error": "torch is not installed"}
    model = _model(config, tensors)
    sizes = sorted({1, *batches}) if "decode" in workloads else [1]
    result: dict[str, Any] = {
        "transformers_version": __import__("transformers").__version__,
        "torch_version": torch.__version__,
        "eager": {},
        "static": {},
    }
    v = config.vocab_size
    for b in sizes:
        try:
            result["eager"][f"batch_{b}"] = decode_tok_s(
                model, b, args.prompt_len, args.new_tokens, v
            )
        except Exception as exc:  # e.g. out of memory at a large batch: keep the others
            result["eager"][f"error_batch_{b}"] = f"{type(exc).__name__}: {exc}"[:300]
    # torch.compile's "reduce-overhead" (CUDA graphs) breaks on transformers 5's static cache
    # ("accessing tensor output of CUDAGraphs that has been overwritten", seen on the H200):
    # the default mode compiles the forward without graphs.
    model.forward = torch.compile(model.forward, fullgraph=True)
    for b in [s for s in sizes if s == 1]:  # compiling costs about a minute a shape
        t0 = time.perf_counter()
        try:
            result["static"][f"batch_{b}"] = decode_tok_s(
                model, b, args.prompt_len, args.new_tokens, v, cache_implementation="static"
            )
        except Exception as exc:
            result["static"][f"error_batch_{b}"] = f"{type(exc).__name__}: {exc}"[:300]
        result["static"][f"compile_and_run_s_batch_{b}"] = time.perf_counter() - t0
    del model
    torch.cuda.empty_cache()
    return result
