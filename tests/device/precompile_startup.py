"""Cold and warm start of the cuda engine with the precompile, and compiles after ready.

    python3 tests/device/precompile_startup.py [config] [layers] [max_num_seqs] [max_tokens]

Runs two fresh processes on one new, empty NUMBA_CACHE_DIR (cold: every kernel compiles; warm:
every kernel loads from the cache). Each builds an engine (the preset's shapes, random weights
made once per shape so the RNG costs nothing), reports the PrecompileReport and the seconds
from process start to ready, then runs replies of batches 1-8 with every sampling setting and
counts the kernels compiled after ready (must be 0). Prints one JSON line per process and
writes $OUT/precompile_startup.json.
"""

from __future__ import annotations

import time

T_START = time.time()

import dataclasses  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
MARK = "precompile-startup: "


def shared_tensors(config_name: str):
    """get_tensor for the config's names: one random array per shape, shared by all layers."""
    import re

    from gpu.model_weights import random_hf_tensors
    from gpu.presets import preset_config

    one = random_hf_tensors(preset_config(config_name, num_hidden_layers=1), seed=0, std=0.02)
    return lambda name: one[re.sub(r"layers\.\d+\.", "layers.0.", name)]


def child(config_name: str, layers: int, max_num_seqs: int, max_tokens: int) -> None:
    import gpu.loader
    from gpu import LLM, EngineConfig, SamplingParams
    from gpu.backends.cuda import CudaBackend
    from gpu.backends.cuda.precompile import count_compiled_kernels
    from gpu.loader import build_engine
    from gpu.presets import preset_config

    errors = {}
    warm_up = gpu.loader.warm_up_request

    def recorded_warm_up(engine):  # a failure there is reported, not fatal, here
        try:
            warm_up(engine)
        except Exception as exc:
            errors["warm_up"] = f"{type(exc).__name__}: {exc}"

    gpu.loader.warm_up_request = recorded_warm_up
    overrides = {"num_hidden_layers": layers} if layers else {}
    config = preset_config(config_name, **overrides)
    get = shared_tensors(config_name)
    imported = time.time()
    stages = []
    engine = build_engine(
        config, get, CudaBackend(),
        EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_tokens),
        progress=lambda stage, done, total: stages.append((round(time.time() - T_START, 2),
                                                           stage, done, total)),
    )  # fmt: skip
    ready = time.time()
    report = engine.runner.executor.precompile_report
    before = count_compiled_kernels()
    llm = LLM(engine=engine)
    settings = {
        "greedy": SamplingParams(temperature=0.0),
        "temperature": SamplingParams(temperature=0.7),
        "top_k": SamplingParams(temperature=0.7, top_k=50),
        "top_p": SamplingParams(temperature=0.7, top_p=0.9),
        "min_p": SamplingParams(temperature=0.7, min_p=0.05),
        "chat": SamplingParams(temperature=0.7, top_p=0.9, repetition_penalty=1.1),
        "penalties": SamplingParams(
            temperature=0.7, presence_penalty=0.5, frequency_penalty=0.5, min_tokens=4
        ),
    }
    after_by = {}
    t_replies = time.time()
    for name, params in settings.items():
        params = dataclasses.replace(params, max_tokens=12, ignore_eos=True, seed=1)
        for batch in range(1, min(8, max_num_seqs) + 1):
            prompts = [[(7 * b + 3 * i) % config.vocab_size for i in range(5 + 9 * b)]
                       for b in range(batch)]  # fmt: skip
            try:
                llm.generate(prompts, params)
            except Exception as exc:
                errors[f"{name}/{batch}"] = f"{type(exc).__name__}: {exc}"
                break
        after_by[name] = count_compiled_kernels() - before
    result = {
        "config": config_name,
        "layers": layers or config.num_hidden_layers,
        "imports_s": round(imported - T_START, 2),
        "ready_s": round(ready - T_START, 2),
        "build_s": round(ready - imported, 2),
        "report": dataclasses.asdict(report) if report else None,
        "compiles_after_ready": after_by,
        "errors": errors,
        "replies_s": round(time.time() - t_replies, 2),
        "graphs": len(engine.runner.executor.graphs),
        "stages": stages[:3] + stages[-3:],
    }
    print(MARK + json.dumps(result), flush=True)


def main() -> None:
    args = sys.argv[1:] or []
    config = args[0] if args else "llama-3.2-1b"
    layers = int(args[1]) if len(args) > 1 else 0
    seqs = int(args[2]) if len(args) > 2 else 256
    tokens = int(args[3]) if len(args) > 3 else 4096
    out = Path(os.environ.get("OUT", "/tmp/tinychat-device-out"))
    out.mkdir(parents=True, exist_ok=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="precompile-") as tmp:
        env = dict(os.environ, NUMBA_CACHE_DIR=os.path.join(tmp, "numba"))
        for run in ("cold", "warm"):
            t0 = time.time()
            try:
                proc = subprocess.run(
                    [sys.executable, __file__, "--child", config, str(layers), str(seqs),
                     str(tokens)],
                    env=env, capture_output=True, text=True, timeout=230,
                )  # fmt: skip
            except subprocess.TimeoutExpired as exc:
                tail = (exc.stderr or b"")[-3000:]
                print(run, "TIMED OUT", tail.decode(errors="replace") if tail else "", flush=True)
                results.append({"run": run, "failed": "timed out"})
                continue
            lines = [x for x in proc.stdout.splitlines() if x.startswith(MARK)]
            if proc.returncode or not lines:
                print(run, "FAILED", proc.returncode, proc.stderr[-3000:], flush=True)
                results.append({"run": run, "failed": proc.stderr[-3000:]})
                continue
            r = {
                "run": run,
                "wall_s": round(time.time() - t0, 2),
                **json.loads(lines[-1][len(MARK) :]),
            }
            print(json.dumps(r), flush=True)
            results.append(r)
    (out / "precompile_startup.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
