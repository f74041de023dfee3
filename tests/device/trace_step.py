"""Where a replayed decode step's GPU time goes, kernel by kernel (dev-only: uses torch).

Builds the engine on a preset config (random bf16 weights), decodes a few tokens at each batch
size so the decode graphs exist, then replays each bucket's graph `--reps` times under
torch.profiler, whose CUPTI tracing records every kernel node of a graph with its start and
end. Prints, per kernel of the step (in launch order, then summed by name): its median
duration and the median gap between the end of the kernel before it and its own start (negative
where programmatic dependent launch overlapped them), and the step's span. Writes the table to
$OUT/trace_<config>_b<batch>.json.

    python3 tests/device/trace_step.py --config llama-3.2-1b --batch 1 8 64
    python3 tests/device/trace_step.py --batch 256 --sampling top-k   # a sampled step's graph

--sampling names a setting of gpu.bench.sampling (greedy by default): a sampled decode step
replays the bucket's non-greedy graph, whose sampler rows are the last step's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import tempfile
from collections import defaultdict

from gpu.backends import get_backend
from gpu.backends.cuda.graphs import bucket_for, pays_to_overlap
from gpu.bench.workloads import decode_run
from gpu.config import EngineConfig
from gpu.loader import build_engine
from gpu.model_weights import random_hf_tensors
from gpu.presets import preset_config


def short_name(name: str) -> str:
    """gpu.kernels' mangled names -> module.function; anything else cut to 48 characters."""
    if name.startswith("_ZN3gpu7kernels"):
        parts, rest = [], name[len("_ZN3gpu7kernels") :]
        while rest[:1].isdigit() and len(parts) < 2:
            n = int(re.match(r"\d+", rest).group())
            digits = len(str(n))
            parts.append(rest[digits : digits + n])
            rest = rest[digits + n :]
        return ".".join(parts)
    return name[:48]


def trace(graph, reps: int) -> list[list[tuple[str, float, float]]]:
    """[(name, start_us, end_us) of each kernel] for each of `reps` replays."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            graph.replay()
        torch.cuda.synchronize()
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    events = json.load(open(path))["traceEvents"]
    kernels = sorted(
        (e["ts"], e["ts"] + e["dur"], e["name"]) for e in events if e.get("cat") == "kernel"
    )
    per = len(kernels) // reps
    return [[(name, s, e) for s, e, name in kernels[r * per : (r + 1) * per]] for r in range(reps)]


def summarise(replays: list[list[tuple[str, float, float]]]) -> dict:
    rows = []
    for i in range(len(replays[0])):
        durs = [rep[i][2] - rep[i][1] for rep in replays]
        gaps = [rep[i][1] - rep[i - 1][2] for rep in replays] if i else [0.0]
        name = short_name(replays[0][i][0])
        rows.append((name, statistics.median(durs), statistics.median(gaps)))
    spans = [rep[-1][2] - rep[0][1] for rep in replays]
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for name, dur, gap in rows:
        by_name[name][0] += 1
        by_name[name][1] += dur
        by_name[name][2] += gap
    return {
        "kernels": len(rows),
        "span_us": statistics.median(spans),
        "busy_us": sum(r[1] for r in rows),
        "gap_us": sum(r[2] for r in rows[1:]),
        "by_name": {
            k: {"n": v[0], "us": round(v[1], 2), "gap_us": round(v[2], 2)}
            for k, v in sorted(by_name.items(), key=lambda kv: -kv[1][1])
        },  # fmt: skip
        "first_layer": [(n, round(d, 2), round(g, 2)) for n, d, g in rows[:16]],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="llama-3.2-1b")
    p.add_argument("--batch", type=int, nargs="+", default=[1])
    p.add_argument("--prompt", type=int, default=96)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--sampling", default="greedy", help="a setting of gpu.bench.sampling")
    args = p.parse_args()
    config = preset_config(args.config)
    tensors = random_hf_tensors(config, seed=0)
    engine = build_engine(
        config, tensors.__getitem__, get_backend("cuda"), EngineConfig(max_num_seqs=256)
    )
    executor = engine.runner.executor
    out = os.environ.get("OUT", "/tmp")
    for batch in args.batch:
        # 16 new tokens: at batch 256 the prompts take several mixed steps, and the first
        # sequences would finish before a pure decode step of all 256 (no graph to trace).
        decode_run(engine, batch, args.prompt, 16, args.sampling)
        greedy = args.sampling == "greedy"
        graph = executor.graphs[("decode", bucket_for(batch, executor.buckets), greedy)]
        result = summarise(trace(graph, args.reps))
        pdl = int(pays_to_overlap(batch))
        result.update(config=args.config, batch=batch, pdl=pdl, context=args.prompt + 16,
                      sampling=args.sampling)  # fmt: skip
        name = f"trace_{args.config}_b{batch}_pdl{pdl}_{args.sampling}.json"
        with open(os.path.join(out, name), "w") as f:
            json.dump(result, f, indent=1)
        print(
            f"{args.config} batch {batch} {args.sampling} PDL {pdl}: {result['kernels']} kernels,"
            f" span"
            f" {result['span_us']:.1f} us, busy {result['busy_us']:.1f},"
            f" gaps {result['gap_us']:.1f}"
        )
        for name, v in list(result["by_name"].items())[:12]:
            print(f"  {name:48s} x{v['n']:<3d} {v['us']:8.1f} us  gaps {v['gap_us']:7.1f}")
        print("  first kernels:", result["first_layer"][:12])


if __name__ == "__main__":
    main()
