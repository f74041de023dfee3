"""Where a decode step's wall time goes between graphs (dev-only: uses torch).

trace_step.py replays one graph and sees only its kernels. The engine's real loop adds, per
step: the upload of the step's inputs (one host-to-device copy), the graph launch, the copy
of the sampled ids back, and whatever the host does between them. This script runs the real
loop (`decode_run`, async scheduling, graphs) under torch.profiler, whose CUPTI tracing
records every kernel and copy on the GPU, and splits each
steady-state decode step into:

    period   first kernel of step N -> first kernel of step N+1 (the wall time of a token)
    span     first kernel -> last kernel of the step (what trace_step.py measures)
    gap      last kernel of N -> first kernel of N+1 (copies, the graph launch, idle)
    copies   the step's memcpy durations on the GPU, and when each ran (after the last kernel)

Steps are cut at the embedding kernel, the first kernel of every step.

    python3 tests/device/trace_loop.py --config llama-3.2-1b --batch 1 64
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

from gpu.backends import get_backend
from gpu.bench.workloads import decode_run
from gpu.config import EngineConfig
from gpu.loader import build_engine
from gpu.model_weights import random_hf_tensors
from gpu.presets import preset_config


def profile_events(fn) -> list[dict]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    return json.load(open(path))["traceEvents"]


def split_steps(events: list[dict]) -> dict:
    gpu = sorted(
        (e["ts"], e["ts"] + e["dur"], e.get("cat"), e["name"])
        for e in events
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
    )
    starts = [i for i, g in enumerate(gpu) if g[2] == "kernel" and "embedding_kernel" in g[3]]
    rows = []
    # Skip the first steps (prefill, pipeline start) and the last (drain).
    for a, b in zip(starts[2:-2], starts[3:-1], strict=True):
        step = gpu[a:b]
        kernels = [g for g in step if g[2] == "kernel"]
        copies = [g for g in step if g[2] != "kernel"]
        last_end = max(g[1] for g in kernels)
        nxt = gpu[b][0]
        rows.append(
            {
                "period": nxt - step[0][0],
                "span": last_end - step[0][0],
                "gap": nxt - last_end,
                "copies": [round(c[1] - c[0], 2) for c in copies],
                # after the step's last kernel: (start, end) of each copy, in us
                "after": [(round(c[0] - last_end, 2), round(c[1] - last_end, 2)) for c in copies],
                "kernels": len(kernels),
            }
        )
    if not rows:
        return {"error": "no steady-state decode steps found", "gpu_events": len(gpu)}

    def med(key: str) -> float:
        return round(statistics.median(r[key] for r in rows), 2)

    return {
        "steps": len(rows),
        "period_us": med("period"),
        "span_us": med("span"),
        "gap_us": med("gap"),
        "gap_p90_us": round(sorted(r["gap"] for r in rows)[int(0.9 * (len(rows) - 1))], 2),
        "kernels": rows[0]["kernels"],
        "copies_us": rows[len(rows) // 2]["copies"],
        "copies_after_last_kernel_us": rows[len(rows) // 2]["after"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="llama-3.2-1b")
    p.add_argument("--batch", type=int, nargs="+", default=[1])
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new", type=int, default=48)
    args = p.parse_args()
    config = preset_config(args.config)
    tensors = random_hf_tensors(config, seed=0)
    engine = build_engine(
        config, tensors.__getitem__, get_backend("cuda"), EngineConfig(max_num_seqs=256)
    )
    out = os.environ.get("OUT", "/tmp")
    results = {}
    for batch in args.batch:
        decode_run(engine, batch, args.prompt, args.new)  # compile, capture, warm
        timed = decode_run(engine, batch, args.prompt, args.new)
        events = profile_events(lambda b=batch: decode_run(engine, b, args.prompt, args.new))
        r = split_steps(events)
        r.update(ms_per_step_unprofiled=round(timed.ms_per_step, 4), batch=batch)
        results[batch] = r
        print(f"{args.config} batch {batch}: {json.dumps(r)}", flush=True)
    with open(os.path.join(out, f"trace_loop_{args.config}.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
