"""`tinychat bench serve`: N concurrent streaming clients through HTTP, beside the engine alone.

    tinychat bench serve --config llama-3.2-1b --device cuda --clients 64 --json F
    tinychat bench serve --model M --clients 256 --check      # no lost or mixed-up tokens
    tinychat bench serve --url http://host:8000/v1 --clients 64   # any running server

One run, one engine core: first the requests go to the engine client directly (the engine
alone), then the same kind of requests (prompts of their own, same lengths) go through
`tinychat serve`'s app (uvicorn in a thread of this process, as `tinychat serve` runs it) from
N clients in processes of their own (serve_clients.py), like `vllm bench serve`. Each reports
time to first token, the gap between text chunks (p50/p99) and output tok/s; the HTTP row's
ratio to the engine's is the server's cost. Requests are completions of random token ids
(fixed prompt and output lengths, ignore_eos, seeded), one pair of rows per --sampling setting
(the bench's default: greedy and the app's defaults, "chat"): both paths do the same work. Each
path runs once untimed first, with its own way of arriving, so that the timed runs meet few
shapes whose CUDA graph is still to capture.

--check: every client samples (temperature 0.8, top-p 0.95) with a seed of its own and asks
for its token ids (vLLM's `return_token_ids`), while the server's engine client records what
the engine gave each request. Each stream must then be whole and unmixed: its ids exactly
max_tokens long, equal to the engine's own output for that request in that run, and its text
equal to the tokenizer's decoding of them; a lost, duplicated or interleaved token breaks one
of the three. The same requests are also run alone, one at a time, and the streams that differ
from their run alone are counted (with the first differing token): on the cpu backend, which
is batch-invariant, they must not differ, nor on the GPU with --batch-invariant
(gpu/backends/cuda/batch_invariant.py); without it a batch of 64 and a batch of one round
differently (GEMM vs GEMV), so a seeded sample may take another token where the top two were
within rounding, and that is reported, not failed. The exit status is 1 if the check fails.

--config writes the preset's random bf16 weights as a model folder (the engine core loads a
folder), with a tokenizer whose every id decodes to a short ASCII word, so that every token
is text on the wire.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from gpu.sampling_presets import SamplingPreset

CHECK_TEMPERATURE, CHECK_TOP_P = 0.8, 0.95
_OFF = asdict(SamplingPreset())  # a preset's fields at their off values


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--clients", type=int, default=64, help="serve: concurrent streams")
    p.add_argument("--url", default=None, help="serve: bench this running server instead")
    p.add_argument("--api-key", default=None, help="serve: the --url server's key")
    p.add_argument(
        "--check",
        action="store_true",
        help="serve: seeded streams, each compared with the same request run alone",
    )


def run_serve_bench(args: argparse.Namespace) -> int:
    if args.url:
        return _bench_url(args)
    folder = _model_folder(args)
    t0 = time.perf_counter()
    client = _engine_client(args, folder)
    ready_s = time.perf_counter() - t0
    try:
        results = _bench(args, client)
    finally:
        client.shutdown()
    results["model"] = args.config or args.model or "default"
    results["engine_ready_s"] = ready_s  # start to ready, graphs captured (as `tinychat serve`)
    _report(args, results)
    return 0 if not results.get("check") or results["check"]["ok"] else 1


def _report(args: argparse.Namespace, results: dict[str, Any]) -> None:
    """The results to --json (if given) and as the table."""
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(results, f, indent=1)
    print_serve(results)


def _bench_url(args: argparse.Namespace) -> int:
    """Any running OpenAI-compatible server: the HTTP rows alone, a pair per setting."""
    from gpu.bench.sampling import SETTINGS, parse_sampling

    names = parse_sampling(args.sampling)
    results: dict[str, Any] = {
        "model": args.url,
        "clients": args.clients,
        "sampling": {name: SETTINGS[name].describe() for name in names},
        "settings": {},
    }
    for i, name in enumerate(names):
        requests = _requests(args, None, args.check, seed=10 * i, setting=name)
        http = _run_clients(_spec(args.url, args.api_key, requests))
        results["settings"][name] = {"http": _summary(http, args.new_tokens)}
    _report(args, results)
    return 0


def _bench(args: argparse.Namespace, client: Any) -> dict[str, Any]:
    from gpu.bench.sampling import SETTINGS, parse_sampling
    from gpu.entrypoints.openai.api_server import ServerThread, build_app

    engine = client.engine
    vocab = engine.vocab_size
    names = parse_sampling(getattr(args, "sampling", "greedy"))
    invariant = engine.device == "cpu" or args.batch_invariant
    results: dict[str, Any] = {
        "device": engine.device,
        "batch_invariant": invariant,
        "clients": args.clients,
        "http_stack": http_stack(),
        "sampling": {name: SETTINGS[name].describe() for name in names},
        "settings": {},
    }
    recorder = OutputRecorder(client)
    server = ServerThread(build_app(recorder)).start()
    try:
        _warm_up_http(server.url, vocab)
        for i, name in enumerate(names):
            results["settings"][name] = _bench_setting(
                args, client, server.url, vocab, name, 10 * i
            )
        if args.check:
            checked = _requests(args, vocab, check=True, seed=3)  # 3 is no setting's seed
            with recorder.recording() as engine_outputs:
                streamed = _run_clients(_spec(server.url, None, checked))["results"]
            alone = [_engine_run(client, [r])["results"][0] for r in checked]
            results["check"] = check_streams(
                streamed,
                engine_outputs,
                alone,
                engine.tokenizer,
                args.new_tokens,
                batch_invariant=invariant,
            )
    finally:
        server.stop()
    return results


def _bench_setting(
    args: argparse.Namespace, client: Any, url: str, vocab: int, name: str, base: int
) -> dict[str, Any]:
    """One sampling setting: the engine alone, then HTTP, each after an untimed pass.

    The untimed passes keep graph captures out of the timed runs: a shape's CUDA graph is
    captured (after one eager step) the first time it comes up, and each path makes shapes of
    its own. The engine run's requests arrive at once; the HTTP clients' over a few ms, while
    the core runs decode steps of smaller batches and mixed steps of one or a few prompts.
    Every run has prompts of its own (same lengths; `base` offsets the setting's seeds): a run
    after another with the same prompts would find them in the prefix cache."""

    def requests(seed: int) -> list[dict[str, Any]]:
        return _requests(args, vocab, check=False, seed=base + seed, setting=name)

    _engine_run(client, requests(0))
    engine = _summary(_engine_run(client, requests(1)), args.new_tokens)
    if client.engine.device != "cpu":
        _run_clients(_spec(url, None, requests(4)))
    http = _run_clients(_spec(url, None, requests(2)))
    http = _summary(http, args.new_tokens)
    return {
        "engine": engine,
        "http": http,
        "http_vs_engine": http["output_tok_s"] / max(engine["output_tok_s"], 1e-9),
    }


def http_stack() -> str:
    """The transport uvicorn picks here ("auto"): its C one (httptools, uvloop) where they are
    installed, else h11 and asyncio's loop, at about twice the CPU per streamed event."""
    from importlib.util import find_spec

    http = "httptools" if find_spec("httptools") else "h11"
    loop = "uvloop" if find_spec("uvloop") else "asyncio"
    return f"{http}+{loop}"


def _warm_up_http(url: str, vocab: int) -> None:
    """One small streamed request first, as `vllm bench serve` sends a test prompt: the timed
    run must not pay for the server's first request (imports, schema builds, first route)."""
    import httpx

    body = {"prompt": [min(1000, vocab // 2)] * 4, "max_tokens": 2, "ignore_eos": True,
            "temperature": 0.0, "stream": True}  # fmt: skip
    response = httpx.post(url + "/completions", json=body, timeout=120)
    if response.status_code != 200 or b"data: [DONE]" not in response.content:
        raise RuntimeError(f"the server's warm-up request failed: {response.text[:200]}")


class OutputRecorder:
    """The engine client, recording each request's token ids as the engine hands them to
    the server while `recording()` is open (and costing nothing otherwise): what the streams
    are checked against."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._outputs: dict[str, list[int]] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def add_request(self, prompt, params, on_output, request_id=None) -> str:
        outputs = self._outputs
        if outputs is not None and request_id is not None:
            ids = outputs.setdefault(request_id, [])

            def record(out) -> None:
                if out.outputs:
                    ids.extend(out.outputs[0].token_ids)
                on_output(out)

            return self._client.add_request(prompt, params, record, request_id=request_id)
        return self._client.add_request(prompt, params, on_output, request_id=request_id)

    @contextlib.contextmanager
    def recording(self):
        self._outputs = {}
        try:
            yield self._outputs
        finally:
            self._outputs = None


# -- requests --------------------------------------------------------------------------------


def _requests(
    args: argparse.Namespace,
    vocab: int | None,
    check: bool,
    seed: int = 0,
    setting: str = "greedy",
) -> list[dict[str, Any]]:
    """The /v1/completions bodies: random token-id prompts (text where the vocabulary is not
    known, against --url), fixed lengths; `setting`'s sampling (gpu/bench/sampling.py), each
    request seeded, or for --check, the check's seeded sampling."""
    from gpu.bench.sampling import SETTINGS

    rng = np.random.default_rng(seed)
    # Only the fields the setting changes: another server (--url) may not know vLLM's extras.
    sampling = {k: v for k, v in asdict(SETTINGS[setting]).items() if v != _OFF[k]}
    bodies = []
    for i in range(args.clients):
        if vocab is None:
            prompt: Any = " ".join(f"w{int(x)}" for x in rng.integers(0, 1000, args.prompt_len))
        else:
            prompt = [int(x) for x in rng.integers(min(1000, vocab // 2), vocab, args.prompt_len)]
        body: dict[str, Any] = {
            "prompt": prompt,
            "max_tokens": args.new_tokens,
            "ignore_eos": True,
            **sampling,
            "temperature": SETTINGS[setting].temperature,
            "seed": i,
        }
        if check:
            body.update(
                temperature=CHECK_TEMPERATURE, top_p=CHECK_TOP_P, seed=i, return_token_ids=True
            )
        bodies.append(body)
    return bodies


def _spec(url: str, api_key: str | None, requests: list[dict[str, Any]]) -> dict[str, Any]:
    return {"url": url, "api_key": api_key, "requests": requests}


def _params(body: dict[str, Any]):
    """The SamplingParams the server makes of a body (the fields _requests sets)."""
    from gpu.sampling_params import RequestOutputKind, SamplingParams

    return SamplingParams(
        **{k: body[k] for k in _OFF if k in body},
        seed=body.get("seed"),
        max_tokens=body["max_tokens"],
        ignore_eos=True,
        output_kind=RequestOutputKind.DELTA,
    )


# -- the two paths ---------------------------------------------------------------------------


def _engine_run(client: Any, requests: list[dict[str, Any]]) -> dict[str, Any]:
    """The requests through the engine client directly, all at once; the same record as a
    client's (times of the outputs that brought text, the text, the token count)."""
    done = threading.Event()
    records = [
        {
            "start": 0.0,
            "times": [],
            "text": "",
            "token_ids": [],
            "completion_tokens": 0,
            "error": None,
        }  # fmt: skip
        for _ in requests
    ]
    left = [len(requests)]
    lock = threading.Lock()
    t0 = time.monotonic()

    def callback(record: dict[str, Any]):
        def on_output(out) -> None:
            completion = out.outputs[0]
            if completion.text:
                record["times"].append(time.monotonic() - t0)
                record["text"] += completion.text
            record["completion_tokens"] += len(completion.token_ids)
            record["token_ids"] += completion.token_ids
            if out.finished:
                record["error"] = out.error
                with lock:
                    left[0] -= 1
                    if left[0] == 0:
                        done.set()

        return on_output

    for body, record in zip(requests, records, strict=True):
        client.add_request(body["prompt"], _params(body), callback(record))
    done.wait()
    return {"wall_s": time.monotonic() - t0, "results": records}


# An httpx client process spends 64-71 us of CPU an event (2-core CPU, 32 streams of a token
# every 1.7 ms, 3 runs): 32 streams at an H100's pace (~590 events a second each) would need
# ~1.2 CPU s/s of one process, so the clients' parsing, not the server, set the gaps and first
# tokens they timed. At 8 a process, ~0.3.
CLIENTS_PER_PROCESS = 8


def _run_clients(spec: dict[str, Any]) -> dict[str, Any]:
    """serve_clients.py in processes of their own, CLIENTS_PER_PROCESS streams each (at most
    one per two cores), all starting at one moment; their results merged in request order."""
    requests = spec["requests"]
    processes = max(1, min(-(-len(requests) // CLIENTS_PER_PROCESS), (os.cpu_count() or 2) // 2))
    slices = [requests[i::processes] for i in range(processes)]
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get(
        "PYTHONPATH")]))}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="tinychat-clients-") as tmp:
        start_at = time.monotonic() + 1.0 + 0.2 * processes  # after every process imported
        runs = []
        for i, part in enumerate(slices):
            spec_path, out_path = Path(tmp) / f"spec{i}.json", Path(tmp) / f"out{i}.json"
            spec_path.write_text(json.dumps({**spec, "requests": part, "start_at": start_at}))
            command = [sys.executable, "-m", "gpu.bench.serve_clients", str(spec_path),
                       str(out_path)]  # fmt: skip
            runs.append((subprocess.Popen(command, env=env), out_path))
        outputs = []
        for process, out_path in runs:
            if process.wait() != 0:
                raise RuntimeError(f"a client process failed (exit {process.returncode})")
            outputs.append(json.loads(out_path.read_text()))
    results: list[Any] = [None] * len(requests)
    for i, out in enumerate(outputs):
        results[i::processes] = out["results"]
    return {
        "wall_s": max(out["wall_s"] for out in outputs),
        "client_cpu_s": [out["cpu_s"] for out in outputs],
        "start_at": start_at,  # the clients' t0 (time.monotonic), for joining server-side times
        "results": results,
    }


# -- figures ---------------------------------------------------------------------------------


def _summary(run: dict[str, Any], new_tokens: int) -> dict[str, Any]:
    records = run["results"]
    errors = [r["error"] for r in records if r["error"]]
    ttft = [r["times"][0] - r["start"] for r in records if r["times"]]
    gaps = [b - a for r in records for a, b in zip(r["times"], r["times"][1:], strict=False)]
    tokens = sum(r["completion_tokens"] for r in records)
    ends = [r["times"][-1] for r in records if r["times"]]
    span = max(ends) if ends else run["wall_s"]
    return {
        "requests": len(records),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "output_tokens": tokens,
        "expected_tokens": len(records) * new_tokens,
        "output_tok_s": tokens / span if span > 0 else 0.0,
        "ttft_p50_ms": _pct(ttft, 50),
        "ttft_p99_ms": _pct(ttft, 99),
        "itl_p50_ms": _pct(gaps, 50),
        "itl_p99_ms": _pct(gaps, 99),
        "wall_s": run["wall_s"],
        # The busiest client process's CPU seconds a second: near 1, the clients, not the
        # server, set the pace (their times are when they parsed an event, not when it came).
        "client_cpu_s_per_s": max(run.get("client_cpu_s") or [0.0]) / max(run["wall_s"], 1e-9),
        "client_processes": len(run.get("client_cpu_s") or []),
    }


def _pct(values: list[float], q: float) -> float:
    return 1e3 * float(np.percentile(values, q)) if values else float("nan")


def check_streams(
    streamed: list[dict[str, Any]],
    engine_outputs: dict[str, list[int]],
    alone: list[dict[str, Any]],
    tokenizer: Any,
    max_tokens: int,
    batch_invariant: bool,
) -> dict[str, Any]:
    """Each stream against the engine's own output for its request (the transport's proof)
    and against its request run alone (equal only where the engine is batch-invariant)."""
    broken: dict[int, str] = {}
    differ: list[int] = []
    first_differing: dict[int, int] = {}
    for i, (s, a) in enumerate(zip(streamed, alone, strict=True)):
        ids = s.get("token_ids") or []
        if s["error"]:
            broken[i] = f"error: {s['error']}"
        elif len(ids) != max_tokens:
            broken[i] = f"{len(ids)} token ids, not {max_tokens}"
        elif ids != engine_outputs.get(s.get("id") or "", []):
            broken[i] = "ids differ from the engine's output for the request"
        elif s["text"] != tokenizer.decode(ids):
            broken[i] = "text differs from the decoding of its ids"
        elif s["completion_tokens"] != len(ids):
            broken[i] = f"usage says {s['completion_tokens']} tokens, {len(ids)} streamed"
        if ids != a["token_ids"]:
            differ.append(i)
            n = min(len(ids), len(a["token_ids"]))
            first_differing[i] = next((k for k in range(n) if ids[k] != a["token_ids"][k]), n)
    failed = bool(broken) or (batch_invariant and bool(differ))
    return {
        "streams": len(streamed),
        "mismatched": len(broken),
        "mismatched_ids": sorted(broken)[:20],
        "first_problem": next(iter(broken.values()), None),
        "differ_from_alone": len(differ),
        "differ_from_alone_ids": differ[:20],
        "first_differing_token": [first_differing[i] for i in differ[:20]],
        "batch_invariant": batch_invariant,
        "ok": not failed,
    }


def print_serve(r: dict[str, Any]) -> None:
    out = sys.stdout
    stack = f" (server: {r['http_stack']})" if "http_stack" in r else ""
    out.write(f"\nbench serve: {r['model']}, {r['clients']} concurrent streaming clients{stack}\n")
    if "engine_ready_s" in r:
        out.write(f"engine ready in {r['engine_ready_s']:.1f} s (graphs captured)\n")
    out.write(f"{'sampling':<10}{'path':<22}{'tok/s':>9}{'TTFT p50':>10}{'p99':>9}{'ITL p50':>9}"
              f"{'p99':>8}{'tokens':>9}{'errors':>7}{'x engine':>10}\n")  # fmt: skip
    busiest = []
    for name, row in r["settings"].items():
        for path, key in (("engine client alone", "engine"), ("HTTP (tinychat serve)", "http")):
            x = row.get(key)
            if x is None:
                continue
            ratio = f"{row['http_vs_engine']:>9.2f}x" if key == "http" and "engine" in row else ""
            out.write(
                f"{name:<10}{path:<22}{x['output_tok_s']:>9.0f}{x['ttft_p50_ms']:>10.1f}"
                f"{x['ttft_p99_ms']:>9.1f}{x['itl_p50_ms']:>9.2f}{x['itl_p99_ms']:>8.2f}"
                f"{x['output_tokens']:>9}{x['errors']:>7}{ratio}\n"
            )
            if x.get("client_processes"):
                busiest.append((x["client_cpu_s_per_s"], x["client_processes"]))
    for name, words in r.get("sampling", {}).items():
        if words != name:
            out.write(f"  {name}: {words}\n")
    if busiest:
        cpu, processes = max(busiest)
        out.write(f"clients: {processes} processes, the busiest at {cpu:.2f} CPU s/s\n")
    if "check" in r:
        c = r["check"]
        verdict = (
            "all whole, each equal to the engine's output and to the decoding of its ids"
            if c["mismatched"] == 0
            else f"{c['mismatched']} BROKEN (ids {c['mismatched_ids']}: {c['first_problem']})"
        )
        out.write(f"check: {c['streams']} seeded streams with their token ids: {verdict}\n")
        alone = c["differ_from_alone"]
        where = "the engine is batch-invariant here" if c["batch_invariant"] else "reported only"
        out.write(
            f"       vs the same requests run alone: {alone} differ ({where})"
            + (
                f": ids {c['differ_from_alone_ids']}, first differing token "
                f"{c['first_differing_token']}"
                if alone
                else ""
            )
            + ("\n" if c["ok"] else "\ncheck FAILED\n")
        )
    out.flush()


# -- the engine ------------------------------------------------------------------------------


def _engine_client(args: argparse.Namespace, folder: str | None):
    from gpu.bench.fixtures import engine_config
    from gpu.entrypoints.openai.async_engine import build_engine_client

    config = engine_config(args)
    config.capture_graphs_at_start = True  # as `tinychat serve` starts its engine
    progress = getattr(args, "progress", None)
    client = build_engine_client(folder, args.device, config, progress=progress)
    if hasattr(progress, "finish"):
        progress.finish()
    client.start()
    return client


def _model_folder(args: argparse.Namespace) -> str | None:
    """--model as given; --config: the preset's random weights, written once."""
    if args.config is None:
        return args.model
    from gpu.bench.fixtures import cached_random_model_folder

    return str(cached_random_model_folder(args.config, args.layers))
