"""Shared pieces of the device checks (tests/device/run_all.sh): results files, random bf16
weights made on the GPU, engines on either backend, transformers models on the same weights.

Dev-only: torch and transformers are imported here (they exist on the GPU machine), never in
the product.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

OUT = Path(os.environ.get("OUT", "/tmp/tinychat-device-out"))
OUT.mkdir(parents=True, exist_ok=True)


class Results:
    """Sections of results, written to $OUT/<name>.json after every section."""

    def __init__(self, name: str) -> None:
        self.path = OUT / f"{name}.json"
        self.data: dict[str, Any] = {}

    def section(self, key: str, fn, *args, **kwargs) -> Any:
        print(f"\n=== {key}", flush=True)
        start = time.perf_counter()
        try:
            value = fn(*args, **kwargs)
            self.data[key] = value
            print(json.dumps(value, indent=1, default=str)[:3000], flush=True)
        except Exception as exc:
            value = None
            self.data[key] = {"error": f"{type(exc).__name__}: {exc}"}
            traceback.print_exc()
        self.data.setdefault("_seconds", {})[key] = round(time.perf_counter() - start, 1)
        self.path.write_text(json.dumps(self.data, indent=1, default=str))
        return value


def relative_errors(got: np.ndarray, want: np.ndarray) -> dict[str, float]:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    diff = got - want
    return {
        "l2_rel": float(np.linalg.norm(diff) / max(np.linalg.norm(want), 1e-30)),
        "max_rel": float(np.abs(diff).max() / max(np.abs(want).max(), 1e-30)),
        "max_abs": float(np.abs(diff).max()),
        "nan": int(np.isnan(got).sum()),
    }


def random_bf16_weights(
    config: Any, seed: int = 0, std: float = 0.02, use_torch: bool = True
) -> dict[str, np.ndarray]:
    """HF-named random weights as bf16 bits (uint16), drawn on the GPU with torch (seconds for
    Llama-3.2-1B, where numpy would take a minute). Matrices N(0, std), norms 1 + 0.1 N(0, 1).
    Without torch (or use_torch=False: under compute-sanitizer), numpy's random_hf_tensors."""
    from gpu.model_weights import hf_tensor_names

    try:
        if not use_torch:
            raise ImportError
        import torch
    except ImportError:
        from gpu.kernels.bf16 import to_bf16_bits
        from gpu.model_weights import random_hf_tensors

        return {k: to_bf16_bits(v) for k, v in random_hf_tensors(config, seed, std).items()}

    h, i, hd = config.hidden_size, config.intermediate_size, config.head_dim
    nh, nkv, v = config.num_attention_heads, config.num_key_value_heads, config.vocab_size
    shapes = {
        "embed_tokens": (v, h), "lm_head": (v, h), "q_proj": (nh * hd, h),
        "k_proj": (nkv * hd, h), "v_proj": (nkv * hd, h), "o_proj": (h, nh * hd),
        "gate_proj": (i, h), "up_proj": (i, h), "down_proj": (h, i),
    }  # fmt: skip
    gen = torch.Generator(device="cuda").manual_seed(seed)
    out = {}
    for name in hf_tensor_names(config.num_hidden_layers, config.tie_word_embeddings):
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(h, generator=gen, device="cuda")
        else:
            key = name.split(".")[-2]
            t = torch.randn(shapes[key], generator=gen, device="cuda") * std
        out[name] = t.to(torch.bfloat16).cpu().view(torch.int16).numpy().view(np.uint16)
    return out


def hf_model(config: Any, weights: dict[str, np.ndarray], dtype: str):
    """transformers' LlamaForCausalLM on the same (bf16-valued) weights, in float32 or bf16."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = {k: v for k, v in config.to_dict().items() if k != "architectures"}
    torch_dtype = torch.float32 if dtype == "float32" else torch.bfloat16
    with torch.device("cuda"):
        model = LlamaForCausalLM(LlamaConfig(**cfg)).to(torch_dtype)
    state = {
        k: torch.from_numpy(v.view(np.int16)).view(torch.bfloat16).to(torch_dtype)
        for k, v in weights.items()
    }
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    return model.cuda().eval()


def hf_greedy(model, prompt: list[int], new_tokens: int) -> tuple[list[int], np.ndarray]:
    """Argmax loop with transformers' KV cache; returns the ids and each step's logits."""
    import torch

    ids, rows = [], []
    x = torch.tensor([prompt], device="cuda")
    past = None
    with torch.no_grad():
        for _ in range(new_tokens):
            result = model(input_ids=x, past_key_values=past, use_cache=True)
            past = result.past_key_values
            logits = result.logits[0, -1].float()
            rows.append(logits.cpu().numpy())
            token = int(torch.argmax(logits))
            ids.append(token)
            x = torch.tensor([[token]], device="cuda")
    return ids, np.stack(rows)


class RecordLogits:
    """Wraps an executor: keeps a host copy of every step's logits rows (before sampling)."""

    def __init__(self, executor) -> None:
        self.executor = executor
        self.model = executor.model
        self.steps: list[np.ndarray] = []
        self.enabled = True

    def execute(self, batch, metadata):
        if not self.enabled or metadata.num_rows == 0:
            return self.executor.execute(batch, metadata)
        # Run the forward through the wrapped executor, then read the logits: greedy sampling
        # leaves them untouched.
        tokens = self.executor.execute(batch, metadata)
        backend = self.model.backend
        self.steps.append(backend.to_host(self.model.logits[: metadata.num_rows]).copy())
        return tokens


def build(config: Any, weights: dict[str, np.ndarray], device: str, record: bool = False, **kw):
    """An LLMEngine over the weights on 'cpu' or 'cuda' (debug=True: errors after every op)."""
    from gpu import EngineConfig
    from gpu.backends.cpu import CpuBackend
    from gpu.loader import build_engine

    if device == "cpu":
        backend = CpuBackend()
    else:
        from gpu.backends.cuda import CudaBackend

        backend = CudaBackend(debug=kw.pop("debug", True))
    kw.setdefault("max_model_len", 4096)
    engine = build_engine(config, weights.__getitem__, backend, EngineConfig(**kw))
    if record:
        engine.runner.executor = RecordLogits(engine.runner.executor)
    return engine


def greedy_run(engine, prompt: list[int], new_tokens: int) -> tuple[list[int], list[np.ndarray]]:
    """One request alone, greedy; returns its ids and (if recording) each step's logits row."""
    from gpu import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    rec = engine.runner.executor
    start = len(getattr(rec, "steps", []))
    rid = engine.add_request(prompt, params)
    ids: list[int] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == rid and out.finished:
                ids = list(out.outputs[0].token_ids)
    rows = [s[0] for s in getattr(rec, "steps", [])[start:]]
    return ids, rows


def top2_margin(logits: np.ndarray) -> float:
    top = np.partition(logits, -2)[-2:]
    return float(top[1] - top[0])


def first_divergence(
    got: list[int], want: list[int], want_logits: list[np.ndarray], noise: float
) -> dict[str, Any]:
    """Where two greedy runs part, and whether the reference's top-2 margin there is within
    the noise (then the split is rounding, not a bug)."""
    n = min(len(got), len(want))
    for i in range(n):
        if got[i] != want[i]:
            margin = top2_margin(want_logits[i]) if i < len(want_logits) else float("nan")
            return {
                "agree_steps": i,
                "of": n,
                "first_diff_step": i,
                "ref_top2_margin": margin,
                "noise": noise,
                "ok": bool(margin <= noise),
            }
    return {"agree_steps": n, "of": n, "first_diff_step": None, "noise": noise, "ok": True}


# Llama-3.2-1B attention shapes: 32 query heads, 8 KV heads, head_dim 64, 16-token blocks.
PAGED_NH, PAGED_NKV, PAGED_HD, PAGED_BS = 32, 8, 64, 16


def paged(seq_lens, query_lens, seed=0):
    """A Llama-3.2-1B-shaped paged attention case: shuffled blocks, random bf16 K/V, NaN in
    every slot no sequence owns. Returns (ForwardBatch, qkv, k, v)."""
    from gpu.forward_batch import ForwardBatch
    from gpu.kernels.bf16 import from_bf16_bits, to_bf16_bits

    r = np.random.default_rng(seed)
    nblocks = [math.ceil(n / PAGED_BS) for n in seq_lens]
    total_blocks = sum(nblocks) + 4
    order = r.permutation(total_blocks).astype(np.int32)
    width = max(nblocks)
    tables = np.zeros((len(seq_lens), width), np.int32)
    shape = (total_blocks, PAGED_BS, PAGED_NKV, PAGED_HD)
    k = from_bf16_bits(to_bf16_bits(r.standard_normal(shape, np.float32)))
    v = from_bf16_bits(to_bf16_bits(r.standard_normal(shape, np.float32)))
    used = 0
    for b, (n, nb) in enumerate(zip(seq_lens, nblocks, strict=True)):
        tables[b, :nb] = order[used : used + nb]
        used += nb
        k[tables[b, nb - 1], n - (nb - 1) * PAGED_BS :] = np.nan
        v[tables[b, nb - 1], n - (nb - 1) * PAGED_BS :] = np.nan
    k[order[used:]] = np.nan
    v[order[used:]] = np.nan
    total = sum(query_lens)
    qkv = r.standard_normal((total, (PAGED_NH + 2 * PAGED_NKV) * PAGED_HD), np.float32)
    qsl = np.concatenate([[0], np.cumsum(query_lens)]).astype(np.int32)
    batch = ForwardBatch(
        num_tokens=total, num_seqs=len(seq_lens), input_ids=None, positions=None,
        slot_mapping=None, query_start_loc=qsl, seq_lens=np.asarray(seq_lens, np.int32),
        block_tables=tables, logits_indices=None, max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
    )  # fmt: skip
    return batch, qkv, k, v
