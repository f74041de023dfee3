"""`tinychat bench startup`: seconds from process start to a ready engine, cold and warm.

Each measurement is a fresh Python process (this module run as a script) that builds the
engine through the public entry, `LLM(...)`, so whatever the loader does before it reports
ready (kernel compiles, a precompile step, graph captures) is counted, and then samples one
token with the app's defaults. "cold" runs with empty cache folders (NUMBA_CACHE_DIR and
TINYCHAT_HOME point into a new temporary folder: whichever the kernel cache lives in, it starts
empty); "warm" is a second process on the same folders. The model is resolved once, in the
parent, so an empty TINYCHAT_HOME does not fetch the default model again. With --config the
preset's random weights are written once as a bf16 safetensors folder
(fixtures.cached_random_model_folder) and loaded from it, as a user's model is: drawn in the
measured process, float32 weights would be rounded to bf16 there, which no user load does.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

_MARK = "tinychat-startup: "
# EngineConfig fields of the bench's options that shape the engine under test.
_ENGINE_ARGS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "gpu_memory_utilization",
    "enforce_eager",
    "async_scheduling",
    "precision",
)


def measure_startup(args: argparse.Namespace, timeout_s: float = 600.0) -> dict[str, Any]:
    """Cold then warm start-up of the bench's model/config on its device."""
    spec: dict[str, Any] = {
        "device": args.device,
        "engine": {k: getattr(args, k) for k in _ENGINE_ARGS if getattr(args, k) is not None},
    }
    if args.config is None:
        from weights import resolve_model

        spec["model"] = str(resolve_model(args.model))
    else:
        from gpu.bench.fixtures import cached_random_model_folder

        spec["model"] = str(cached_random_model_folder(args.config, args.layers))
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tinychat-startup-") as tmp:
        env = dict(os.environ)
        env["NUMBA_CACHE_DIR"] = os.path.join(tmp, "numba")
        env["TINYCHAT_HOME"] = os.path.join(tmp, "home")
        for run in ("cold", "warm"):
            result[run] = _child(spec, env, timeout_s)
    return result


def _child(spec: dict[str, Any], env: dict[str, str], timeout_s: float) -> dict[str, Any]:
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "gpu.bench.startup", json.dumps({**spec, "t0": t0})],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        preexec_fn=_die_with_parent,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith(_MARK)]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        raise RuntimeError(
            f"the start-up process failed (status {proc.returncode}): " + " | ".join(tail)
        )
    return json.loads(lines[-1][len(_MARK) :])


def _die_with_parent() -> None:
    """Linux: the child is killed with its parent (a `timeout` around the bench must not leave
    a process holding the GPU)."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _child_main(spec: dict[str, Any]) -> None:
    """In the measured process: build, report ready, sample one token, report it. The
    loader's progress stages (weights, kernels, warm-up) are noted when each first starts."""
    stages: dict[str, float] = {}

    def progress(stage: str, done: int, total: int) -> None:
        stages.setdefault(stage, time.time())

    from gpu import LLM

    llm = LLM(model=spec["model"], device=spec["device"], progress=progress, **spec["engine"])
    ready = time.time()
    from gpu.sampling_presets import chat_sampling_params

    engine = llm.llm_engine
    prompt = [(1000 + i) % engine.vocab_size for i in range(8)]
    engine.add_request(prompt, chat_sampling_params(max_tokens=1, seed=0, detokenize=False))
    while engine.has_unfinished_requests():
        engine.step()
    first = time.time()
    t0 = spec["t0"]
    report = {
        "ready_s": ready - t0,
        "first_token_s": first - t0,
        "device": engine.device,
        # When each stage of the build started, in seconds from the process's start.
        "stages_s": {k: v - t0 for k, v in stages.items()},
    }
    print(_MARK + json.dumps(report), flush=True)


if __name__ == "__main__":
    _child_main(json.loads(sys.argv[1]))
