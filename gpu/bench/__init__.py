"""`tinychat bench`: how fast the engine is, with the roofline floor beside every figure.

    tinychat bench --config llama-3.2-1b --device cuda --compare hf --json results.json
    tinychat bench --model path/to/folder latency decode --sampling all
    tinychat bench startup --config llama-3.2-1b --device cuda

Workloads: latency (batch-1 decode), decode (fixed batches), throughput (256 requests of
random lengths, nano-vllm's workload), chat (sessions streaming through the engine thread,
with the app's default sampling), startup (process start to a ready engine, cold and warm, in
processes of their own), scheduler (the Python cost of a step with the model taken out), serve
(N streaming HTTP clients of `tinychat serve` beside the engine client alone: gpu/bench/serve.py).
Latency, decode and serve run one row per --sampling setting (gpu/bench/sampling.py), each
beside greedy. See BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from typing import Any

from gpu.bench.sampling import DEFAULT as DEFAULT_SAMPLING
from gpu.bench.sampling import SETTINGS, add_ratios, parse_sampling

WORKLOADS = ("latency", "decode", "throughput", "chat", "startup", "scheduler", "serve")
DEFAULT_WORKLOADS = ["latency", "decode", "throughput", "chat"]


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "workloads",
        nargs="*",
        default=[],
        help=f"any of {', '.join(WORKLOADS)} (default: {' '.join(DEFAULT_WORKLOADS)})",
    )
    p.add_argument(
        "--sampling",
        default=DEFAULT_SAMPLING,
        help="sampling settings of the latency, decode and serve rows, comma-separated: "
        f"{', '.join(SETTINGS)}, or all (default: {DEFAULT_SAMPLING}; chat is the app's "
        "defaults; each row's ratio is to greedy's)",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--model", default=None, help="a model folder (or repo id, or .gguf)")
    src.add_argument("--config", default=None, help="llama-3.2-1b | smollm2-135m: random weights")
    p.add_argument("--layers", type=int, default=None, help="override the number of layers")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument(
        "--precision",
        choices=("float32", "q8", "q4"),
        default=None,
        help="cpu: the weights' form of the main run (default q8); with a real model (not "
        "--config), latency/decode on the cpu also compare every cpu path and llama.cpp",
    )
    p.add_argument("--batches", default="1,8,64,256", help="batch sizes of the decode workload")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--num-requests", type=int, default=256, help="throughput workload size")
    p.add_argument("--min-len", type=int, default=100)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--long-prompt", type=int, default=1000)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--enforce-eager", action="store_true", help="cuda: no CUDA graphs")
    p.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="launch each step before reading the previous one's tokens (default: the "
        "engine's, EngineConfig.async_scheduling); --no-async-scheduling: the serial engine",
    )
    p.add_argument(
        "--batch-invariant",
        action="store_true",
        help="cuda: the batch-invariant ops (EngineConfig.batch_invariant)",
    )
    p.add_argument(
        "--capture-at-start",
        action="store_true",
        help="cuda: capture every graph bucket before the workloads (default: lazily)",
    )
    p.add_argument(
        "--compare",
        choices=("hf",),
        default=None,
        help="also run transformers on the same weights (needs torch)",
    )
    p.add_argument("--json", dest="json_path", default=None, help="write the results here")
    from gpu.bench.serve import add_serve_arguments

    add_serve_arguments(p)  # `tinychat bench serve`: HTTP clients beside the engine alone
    p.add_argument("--plot", default=None, help="tok/s against batch size (needs matplotlib)")


def _build(args: argparse.Namespace):
    """The engine under test and, for --config, the random weights (for --compare)."""
    from gpu.bench.fixtures import engine_config

    cfg = engine_config(args)
    if args.config is None:
        from gpu.loader import create_engine

        t0 = time.perf_counter()
        engine = create_engine(args.model, args.device, cfg, progress=_progress(args))
        _progress_done(args)
        return engine, None, args.model or "default", time.perf_counter() - t0
    from gpu.backends import get_backend
    from gpu.loader import build_engine
    from gpu.model_weights import random_hf_tensors
    from gpu.presets import preset_config

    overrides = {"num_hidden_layers": args.layers} if args.layers else {}
    config = preset_config(args.config, **overrides)
    tensors = random_hf_tensors(config, seed=0)
    t0 = time.perf_counter()  # start-up: weights to the device, kernels, KV cache (not the RNG)
    engine = build_engine(
        config,
        tensors.__getitem__,
        get_backend(args.device, cfg.precision, cfg.cpu_threads, cfg.batch_invariant),
        cfg,
        model_name=f"{args.config} (random bf16 weights)",
        progress=_progress(args),
    )
    _progress_done(args)
    return engine, tensors, args.config, time.perf_counter() - t0


def _progress(args: argparse.Namespace):
    """The engine build's progress display the command line hands over (`tinychat bench`
    draws a bar on stderr), or None."""
    return getattr(args, "progress", None)


def _progress_done(args: argparse.Namespace) -> None:
    """End the progress display's line before the bench prints its own."""
    finish = getattr(_progress(args), "finish", None)
    if finish is not None:
        finish()


def _ceilings(engine):
    backend = getattr(engine.runner.executor.model, "backend", None)
    measure = getattr(backend, "measure_ceilings", None)
    if measure is not None:
        return measure()
    from gpu.bench.roofline import measure_cpu_ceilings

    return measure_cpu_ceilings()


def run_bench(args: argparse.Namespace) -> int:
    from gpu.bench import roofline, workloads

    chosen = args.workloads or DEFAULT_WORKLOADS
    unknown = set(chosen) - set(WORKLOADS)
    if unknown:
        raise ValueError(f"unknown workload(s) {', '.join(sorted(unknown))}: use {WORKLOADS}")
    settings = parse_sampling(args.sampling)
    if "serve" in chosen:  # its own run: an engine core, a server, clients (gpu/bench/serve.py)
        from gpu.bench.serve import run_serve_bench

        return run_serve_bench(args)
    if chosen == ["scheduler"]:
        from gpu.bench.scheduler_overhead import main as scheduler_main

        scheduler_main(settings=tuple(settings))
        return 0

    results: dict[str, Any] = {"model": args.config or args.model or "default"}
    if "startup" in chosen:  # before this process takes the device's memory
        from gpu.bench.startup import measure_startup

        results["startup"] = measure_startup(args)
        results["device"] = results["startup"]["cold"]["device"]
        if set(chosen) <= {"startup", "scheduler"}:
            _save(results, args.json_path)
            print_table(results)
            return 0

    engine, tensors, label, startup_s = _build(args)
    executor = engine.runner.executor
    capture_at_start_s = None
    if args.capture_at_start and hasattr(executor, "capture_all"):
        capture_at_start_s = executor.capture_all()
    config = engine.model_config
    ceilings = _ceilings(engine)
    weight_bytes = 2 if engine.device == "cuda" else _CPU_WEIGHT_BYTES[args.precision or "q8"]
    batches = [int(b) for b in args.batches.split(",") if b]
    batches = [b for b in batches if b <= engine.config.max_num_seqs]
    results.update(
        {
            "model": label,
            "device": engine.device,
            "device_name": _device_name(engine),
            "host": platform.node(),
            "params": roofline.count_params(config),
            "kv_capacity_tokens": engine.kv_capacity_tokens,
            "startup_s": startup_s,
            "async_scheduling": engine.config.async_scheduling,
            "capture_at_start_s": capture_at_start_s,
            "ceilings": dataclasses.asdict(ceilings),
            "sampling": {name: SETTINGS[name].describe() for name in settings},
        }
    )

    def floor(batch: int, context: int) -> dict:
        return roofline.decode_step_floor(
            config, batch, context, weight_bytes, weight_bytes, ceilings
        )

    t0 = time.perf_counter()
    plan = warm_up_plan(chosen, batches, settings, engine.device, args.sessions)
    workloads.warm_up(
        engine, plan, args.prompt_len, seconds=2.0 if engine.device == "cuda" else 0.0
    )
    results["warmup_s"] = time.perf_counter() - t0
    ctx = args.prompt_len + args.new_tokens // 2  # mean context over the decode
    replay = getattr(executor, "replay_ms", None)  # GPU time of a step, from its graph

    def decode_rows(batch_sizes: list[int]) -> list[dict]:
        rows = []
        for b in batch_sizes:
            f = floor(b, ctx)
            for name in settings:
                r = workloads.decode_run(engine, b, args.prompt_len, args.new_tokens, name)
                rows.append(
                    {
                        **dataclasses.asdict(r),
                        "graph_replay_ms": replay(b) if replay else None,
                        "floor_ms": 1e3 * f["floor_s"],
                        "bound": f["bound"],
                        "fraction_of_floor": f["floor_s"] / (r.ms_per_step / 1e3),
                    }
                )
        add_ratios(rows)
        return rows

    if "latency" in chosen:
        results["latency"] = decode_rows([1])
    if "decode" in chosen:
        results["decode"] = decode_rows(batches)
    if "throughput" in chosen:
        r = workloads.throughput_run(engine, args.num_requests, args.min_len, args.max_len)
        results["throughput"] = dataclasses.asdict(r)
    if "chat" in chosen:
        r = workloads.chat_run(engine, args.sessions, args.turns, long_prompt=args.long_prompt)
        results["chat"] = {k: v for k, v in dataclasses.asdict(r).items() if k != "ttfts_ms"}
    results["graph_capture_s"] = getattr(executor, "capture_time_s", None)
    graphs = getattr(executor, "graphs", {})
    results["graph_buckets"] = sorted({k[1] for k in graphs if k[0] == "decode"})
    results["mixed_graph_buckets"] = sorted({k[1:3] for k in graphs if k[0] == "mixed"})
    if engine.device == "cpu" and args.config is None and {"latency", "decode"} & set(chosen):
        from gpu.bench.cpu_paths import compare_cpu_paths

        del engine, executor  # one model in memory at a time
        results["cpu_paths"] = compare_cpu_paths(args, sorted({1, *(b for b in batches if b <= 8)}))
    _save(results, args.json_path)  # ours first: a slow or failing comparison loses nothing
    if args.compare == "hf":
        from gpu.bench.hf_reference import run_hf

        print_table(results)
        print("running transformers on the same weights...", flush=True)
        results["hf"] = run_hf(config, tensors, args, batches, chosen)
        _save(results, args.json_path)
    print_table(results)
    if args.json_path:
        print(f"results written to {args.json_path}")
    if args.plot:
        from gpu.bench.plot import plot_decode

        plot_decode(results, args.plot)
    return 0


# Bytes a weight costs on the cpu: float32, per-row int8 (a scale a row: ~1), Q4_1 (24 bytes a
# block of 32).
_CPU_WEIGHT_BYTES = {"float32": 4, "q8": 1, "q4": 24 / 32}


def warm_up_plan(
    chosen: list[str], batches: list[int], settings: list[str], device: str, sessions: int = 8
) -> list[tuple[int, str]]:
    """The (batch, sampling) pairs to warm up: those the chosen workloads run, no more
    (throughput: greedy at every batch; chat: the app's defaults up to one batch of
    sessions). On the cpu backend batch 1 of each setting is enough: numpy compiles nothing
    and captures no graph, and a warm-up at batch 256 there costs a minute."""
    pairs: set[tuple[int, str]] = set()
    if "latency" in chosen:
        pairs |= {(1, name) for name in settings}
    if "decode" in chosen:
        pairs |= {(b, name) for b in batches for name in settings}
    if "throughput" in chosen:
        pairs |= {(b, "greedy") for b in [1, *batches]}
    if "chat" in chosen:
        pairs |= {(b, "chat") for b in [1, *batches] if b <= sessions}
    if device != "cuda":
        pairs = {(1, name) for _, name in pairs}
    order = list(SETTINGS)
    return sorted(pairs, key=lambda p: (p[0], order.index(p[1])))


def _ms(value: float | None) -> str:
    """The GPU-time column: one graph replay of the step's bucket (blank without graphs)."""
    return f"{value:>8.3f}" if value else f"{'':>8}"


def _save(results: dict, path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=1, default=float)


def _device_name(engine) -> str:
    backend = getattr(engine.runner.executor.model, "backend", None)
    name = getattr(backend, "device_name", None)
    return name() if callable(name) else platform.processor() or "cpu"


def chat_summary(x: dict) -> str:
    """The chat workload's figures (a ChatResult as a dict), two lines."""
    return (
        f"chat ({x['sessions']} sessions x {x['turns']} turns, the app's sampling): TTFT p50 "
        f"{x['ttft_p50_ms']:.1f} ms p99 {x['ttft_p99_ms']:.1f} ms; ITL p50 "
        f"{x['itl_p50_ms']:.2f} ms p99 {x['itl_p99_ms']:.2f} ms (alone: p50 "
        f"{x['single_itl_p50_ms']:.2f} p99 {x['single_itl_p99_ms']:.2f}); a "
        f"{x['long_prompt_tokens']}-token prompt: first token in "
        f"{x['long_prompt_ttft_ms']:.1f} ms\n"
        f"  engine steps, by the step they wait for: decode p50 {x['decode_step_p50_ms']:.2f}"
        f" p99 {x['decode_step_p99_ms']:.2f} ms, with prompt tokens ({x['mixed_steps']}) p50 "
        f"{x['mixed_step_p50_ms']:.2f} p99 {x['mixed_step_p99_ms']:.2f} ms; "
        f"{x['gc_pauses']} GC pauses, longest {x['gc_max_ms']:.2f} ms"
    )


def startup_summary(x: dict) -> str:
    """The startup workload's figures, one line."""
    cold, warm = x["cold"], x["warm"]
    return (
        f"start-up (process start to engine ready / to the first token): cold "
        f"{cold['ready_s']:.1f} / {cold['first_token_s']:.1f} s, warm {warm['ready_s']:.1f} / "
        f"{warm['first_token_s']:.1f} s"
    )


def _ratio(value: float | None) -> str:
    return f"{value:>8.2f}x" if value is not None else f"{'':>9}"


def print_table(r: dict) -> None:
    out = sys.stdout
    if "params" not in r:  # the startup workload alone: no engine in this process
        out.write(f"\n{r['model']} ({r['device']})\n{startup_summary(r['startup'])}\n")
        out.flush()
        return
    out.write(
        f"\n{r['model']} on {r['device_name']} ({r['device']}), {r['params'] / 1e6:.0f}M "
        f"params, KV {r['kv_capacity_tokens']} tokens, start-up {r['startup_s']:.1f} s, "
        f"warm-up {r['warmup_s']:.1f} s\n"
    )
    c = r["ceilings"]
    out.write(
        f"ceilings: copy {c['bandwidth_Bps'] / 1e9:.0f} GB/s, matmul "
        f"{c['matmul_flops'] / 1e12:.1f} TFLOP/s ({c['source']})\n"
    )
    for name, words in r.get("sampling", {}).items():
        if name != "greedy" and ("latency" in r or "decode" in r):
            out.write(f"  {name}: {words}\n")
    hf = r.get("hf", {})
    out.write(
        f"{'workload':<26}{'tok/s':>9}{'x greedy':>9}{'ms/step':>9}{'GPU ms':>8}{'floor ms':>9}"
        f"{'of floor':>9}{'hf eager':>10}{'hf static':>10}{'x eager':>8}{'x static':>9}\n"
    )

    def hf_cols(key: str, ours: float) -> str:
        e, s = hf.get("eager", {}).get(key), hf.get("static", {}).get(key)
        cols = f"{e:>10.0f}" if e else f"{'':>10}"
        cols += f"{s:>10.0f}" if s else f"{'':>10}"
        cols += f"{ours / e:>8.1f}" if e else f"{'':>8}"
        cols += f"{ours / s:>9.1f}" if s else f"{'':>9}"
        return cols

    rows = [("latency", x) for x in r.get("latency", [])]
    rows += [("decode", x) for x in r.get("decode", [])]
    for workload, x in rows:
        name = f"{workload} b{x['batch_size']} {x['sampling']}"
        hf_part = (  # transformers runs greedy only
            hf_cols(f"batch_{x['batch_size']}", x["decode_tok_s"])
            if x["sampling"] == "greedy"
            else ""
        )
        out.write(
            f"{name:<26}{x['decode_tok_s']:>9.0f}{_ratio(x.get('vs_greedy'))}"
            f"{x['ms_per_step']:>9.3f}{_ms(x.get('graph_replay_ms'))}"
            f"{x['floor_ms']:>9.3f}{x['fraction_of_floor']:>8.0%} {hf_part}".rstrip()
            + "\n"
        )
    if "throughput" in r:
        x = r["throughput"]
        out.write(
            f"{'throughput (greedy)':<26}{x['output_tok_s']:>9.0f}   ({x['num_requests']} "
            f"requests, {x['output_tokens']} output tokens in {x['total_time_s']:.1f} s)\n"
        )
        if x.get("decode_steps"):
            out.write(
                f"  steps: {x['decode_steps']} decode ({x['decode_s']:.2f} s, mean batch"
                f" {x['mean_decode_batch']:.0f}), {x['mixed_steps']} with prompt tokens"
                f" ({x['mixed_s']:.2f} s)\n"
            )
    if "chat" in r:
        out.write(chat_summary(r["chat"]) + "\n")
    if "startup" in r:
        out.write(startup_summary(r["startup"]) + "\n")
    out.flush()
    if "cpu_paths" in r:
        from gpu.bench.cpu_paths import print_cpu_paths

        print_cpu_paths(r["cpu_paths"])
