"""The server's own cost, without a model: `tinychat serve`'s app in front of an engine client
that streams a token to every request every `period` seconds (64 streams at 1.7 ms: an H100's
Llama-3.2-1B rate), and raw-HTTP clients in a process of their own.

    python -m gpu.bench.serve_synthetic [--streams 64] [--tokens 512] [--period 0.0017]
    python -m gpu.bench.serve_synthetic --core [--repeat N] [--json F]

Default: a synthetic engine client on a thread of its own (no receiver, no detokenizer): the
event loop's cost per event alone. --core: the real path as `tinychat bench serve` runs it,
the real EngineCoreClient (its receiver thread unpickles each step, detokenizes with a
word-per-id tokenizer, builds the outputs) against a stand-in core process that speaks the
core's protocol (gpu/bench/standin_core.py, run by name through EngineCoreClient's entry),
in three phases on one client: the requests through the engine client directly (bench serve's
"engine alone" row), `streams` one-token requests over HTTP at once (admission: the time to
all first tokens, the server's CPU per request), then `streams` x `tokens` over HTTP
(streaming: CPU per token, tokens per event, tok/s against the engine row). CPU is read from
the clocks of the event-loop thread, the receiver thread, the whole process and the core.

The clients speak raw HTTP over asyncio sockets and only count events and read the usage, so
the server, not a client's parser, is what runs out first on a small machine. A server that
keeps up delivers streams / period tokens a second, an event a token; one that falls behind
delivers fewer events, each carrying several tokens, and its streams end later.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from gpu.outputs import CompletionOutput, EngineStats, RequestOutput

# The stand-in engine core (a process speaking the core's protocol, no model): named by its
# module, run by EngineCoreClient(entry=...) in a process of its own, never imported here.
PROMPT_LEN = 32  # bench serve's default


class _Tokenizer:
    def decode(self, ids: list[int]) -> str:
        return "".join(f" w{i}" for i in ids)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [1] * max(1, len(text.split()))


class _Engine:
    model_name = "synthetic"
    device = "cpu"
    max_model_len = 1 << 20
    vocab_size = 1 << 16
    kv_capacity_tokens = 1 << 20

    def __init__(self) -> None:
        self.tokenizer = _Tokenizer()


class SyntheticEngineClient:
    """The engine client's contract (chat_app/engine_api.py), streaming `" w<id>"` tokens:
    every `period`, one DELTA output per open request, on the emitter thread."""

    def __init__(self, period: float) -> None:
        self.engine = _Engine()
        self.period = period
        self._requests: dict[str, list[Any]] = {}  # id -> [on_output, left, prompt_ids, made]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.tokens = 0
        self.cpu_s = 0.0  # the emitter thread's own CPU (the engine client's, not the server's)

    def start(self) -> None:
        self._thread.start()

    def add_request(self, prompt, params, on_output, request_id=None) -> str:
        with self._lock:
            self._requests[request_id] = [on_output, params.max_tokens, list(prompt), 0]
        return request_id

    def abort(self, request_id: str) -> None:
        with self._lock:
            entry = self._requests.pop(request_id, None)
        if entry is not None:
            entry[0](self._output(request_id, entry, [], "abort"))

    def stats(self) -> EngineStats:
        return EngineStats(num_running=len(self._requests))

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    @staticmethod
    def _output(request_id: str, entry: list[Any], ids: list[int], reason: str | None):
        text = "".join(f" w{i}" for i in ids)
        completion = CompletionOutput(0, text, ids, reason, None)
        return RequestOutput(request_id, None, entry[2], [completion], reason is not None)

    def _run(self) -> None:
        start_cpu = time.thread_time()
        tick = time.monotonic()
        while not self._stop.is_set():
            tick += self.period
            delay = tick - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                tick = time.monotonic()  # fell behind: no burst to catch up
            with self._lock:
                items = list(self._requests.items())
            for request_id, entry in items:
                entry[3] += 1
                entry[1] -= 1
                done = entry[1] <= 0
                if done:
                    with self._lock:
                        self._requests.pop(request_id, None)
                self.tokens += 1
                entry[0](
                    self._output(request_id, entry, [entry[3] % 1000], "length" if done else None)
                )
        self.cpu_s = time.thread_time() - start_cpu


# -- the clients: raw HTTP, counting --------------------------------------------------------


async def _stream(host: str, port: int, body: bytes, start_at: float) -> tuple:
    """One streaming request sent at `start_at`: its text events, its tokens (the server's
    usage event), the bytes, and when its first text event and its last byte came."""
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    status = await reader.readline()
    if b" 200 " not in status:
        raise RuntimeError(f"the server answered {status!r}: {await reader.read(500)!r}")
    events = received = 0
    first = last = 0.0
    tail = b""
    while True:
        data = await reader.read(1 << 16)
        if not data:
            break
        last = time.monotonic()
        received += len(data)
        chunk = tail + data
        events += chunk.count(b'"text":"') - tail.count(b'"text":"')
        if not first and events:
            first = last
        tail = chunk[-256:]
        if b"data: [DONE]" in chunk:
            break
    writer.close()
    usage = re.search(rb'"completion_tokens":(\d+)', tail)
    return events, int(usage[1]) if usage else 0, received, first, last


async def _clients(host: str, port: int, streams: int, tokens: int, start_at: float) -> dict:
    prompt = list(range(1000, 1000 + PROMPT_LEN))
    body = json.dumps({"prompt": prompt, "max_tokens": tokens, "stream": True,
                       "ignore_eos": True, "temperature": 0.0,
                       "stream_options": {"include_usage": True}}).encode()  # fmt: skip
    results = await asyncio.gather(*(_stream(host, port, body, start_at) for _ in range(streams)))
    return {
        "events": sum(r[0] for r in results),
        "tokens": sum(r[1] for r in results),
        "bytes": sum(r[2] for r in results),
        "ttft": sorted(r[3] - start_at for r in results),
        "wall_s": max(r[4] for r in results) - start_at,
    }


def _client_main(argv: list[str]) -> int:
    host, port, streams, tokens, start_at = argv[0], int(argv[1]), int(argv[2]), int(argv[3]), (
        float(argv[4]))  # fmt: skip
    print(json.dumps(asyncio.run(_clients(host, port, streams, tokens, start_at))))
    return 0


def _run_clients(url: str, streams: int, tokens: int) -> dict[str, Any]:
    """The clients in a process of their own, every request sent at one moment (after the
    process has imported)."""
    host, port = url.removeprefix("http://").removesuffix("/v1").split(":")
    start_at = time.monotonic() + 0.5
    command = [sys.executable, "-m", "gpu.bench.serve_synthetic", "--client", host, port,
               str(streams), str(tokens), repr(start_at)]  # fmt: skip
    root = str(Path(__file__).resolve().parents[2])
    out = subprocess.run(command, capture_output=True, text=True, cwd=root, check=True)
    return json.loads(out.stdout)


# -- CPU clocks -------------------------------------------------------------------------------


class Clocks:
    """CPU seconds of named threads of this process, of the whole process, and of another
    process (the core's, from /proc), read together."""

    def __init__(self, threads: dict[str, int | None], core_pid: int | None = None) -> None:
        self._clocks = {n: time.pthread_getcpuclockid(t) for n, t in threads.items() if t}
        self._core_pid = core_pid

    def read(self) -> dict[str, float]:
        out = {name: time.clock_gettime(clock) for name, clock in self._clocks.items()}
        out["process"] = time.process_time()
        if self._core_pid is not None:
            fields = Path(f"/proc/{self._core_pid}/stat").read_text().rsplit(")", 1)[1].split()
            out["core"] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return out

    @staticmethod
    def spent(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        return {name: after[name] - before[name] for name in before}


# -- the measurements -------------------------------------------------------------------------


def measure(streams: int, tokens: int, period: float) -> dict[str, Any]:
    """The synthetic engine client (no receiver, no detokenizer): the event loop's cost alone."""
    from gpu.entrypoints.openai.api_server import ServerThread, build_app

    client = SyntheticEngineClient(period)
    client.start()
    server = ServerThread(build_app(client)).start()
    clocks = Clocks({"loop": server._thread.ident})
    try:
        before = clocks.read()
        run = _run_clients(server.url, streams, tokens)
        cpu = Clocks.spent(before, clocks.read())
    finally:
        server.stop()
        client.shutdown()
    from gpu.bench.serve import http_stack

    delivered, wall = run["tokens"], run["wall_s"]
    return {
        "http_stack": http_stack(),
        "streams": streams,
        "tokens_per_stream": tokens,
        "period_ms": period * 1e3,
        "target_tok_s": streams / period,
        "tokens_received": delivered,
        "tok_s": delivered / wall,
        "events_s": run["events"] / wall,
        "tokens_per_event": delivered / max(run["events"], 1),
        "loop_cpu_s_per_s": cpu["loop"] / wall,
        "loop_us_per_token": 1e6 * cpu["loop"] / max(delivered, 1),
        "loop_us_per_event": 1e6 * cpu["loop"] / max(run["events"], 1),
        "emitter_cpu_s": client.cpu_s,
        "wall_s": wall,
    }


def measure_core(streams: int, tokens: int, step_s: float) -> dict[str, Any]:
    """The real path: `tinychat serve`'s app over a real EngineCoreClient (its receiver thread
    unpickles, detokenizes, builds the outputs) whose core is the stand-in process, which
    sends a token to every running request every `step_s`. Three phases, one client: the
    same requests through the engine client directly (bench serve's engine row); `streams`
    HTTP requests of one token each (admission: the server's CPU per request); and
    `streams` x `tokens` over HTTP (streaming). Each phase's CPU is split by thread."""
    from gpu.bench import standin_core
    from gpu.bench.serve import _engine_run
    from gpu.config import EngineConfig
    from gpu.engine_core import EngineCoreClient
    from gpu.entrypoints.openai.api_server import ServerThread, build_app

    folder = Path(tempfile.gettempdir()) / "tinychat-serve-standin"
    client = EngineCoreClient(
        str(standin_core.model_folder(folder, step_s=step_s)),
        "cpu",
        EngineConfig(max_model_len=8192),
        entry=standin_core.ENTRY,
    )
    client.start()
    server = ServerThread(build_app(client)).start()
    clocks = Clocks(
        {"loop": server._thread.ident, "receiver": client._receiver.ident}, client.core_pid
    )
    out: dict[str, Any] = {"streams": streams, "tokens": tokens, "step_ms": step_s * 1e3,
                           "sent_tok_s": streams / step_s}  # fmt: skip
    try:
        _run_clients(server.url, 2, 2)  # warm-up: the first request's imports and builds
        body = {"prompt": list(range(1000, 1000 + PROMPT_LEN)), "max_tokens": tokens,
                "temperature": 0.0}  # fmt: skip
        before = clocks.read()
        run = _engine_run(client, [body] * streams)
        cpu = Clocks.spent(before, clocks.read())
        ends = [r["times"][-1] for r in run["results"]]
        ttft = sorted(r["times"][0] for r in run["results"])
        out["engine"] = _phase(cpu, streams * tokens, max(ends), ttft, None)
        for name, n in (("admission", 1), ("http", tokens)):
            before = clocks.read()
            run = _run_clients(server.url, streams, n)
            cpu = Clocks.spent(before, clocks.read())
            out[name] = _phase(cpu, run["tokens"], run["wall_s"], run["ttft"], run["events"])
    finally:
        server.stop()
        client.shutdown()
    out["http_vs_engine"] = out["http"]["tok_s"] / out["engine"]["tok_s"]
    return out


def _phase(cpu: dict[str, float], tokens: int, wall: float, ttft: list[float], events) -> dict:
    return {"tokens": tokens, "wall_s": wall, "tok_s": tokens / wall, "events": events,
            "ttft_p50_ms": 1e3 * ttft[len(ttft) // 2], "ttft_max_ms": 1e3 * ttft[-1],
            "cpu_s": cpu}  # fmt: skip


def print_core(r: dict[str, Any]) -> None:
    n = r["streams"]
    print(f"{n} streams x {r['tokens']} tokens, the stand-in core sends a token a stream every "
          f"{r['step_ms']:.2f} ms ({r['sent_tok_s']:,.0f} tok/s); CPU in ms of the server "
          "process's threads")  # fmt: skip
    for name in ("engine", "admission", "http"):
        x = r[name]
        c = x["cpu_s"]
        per = n if name == "admission" else max(x["tokens"], 1)
        unit = "req" if name == "admission" else "tok"
        events = f" {x['tokens'] / max(x['events'], 1):.2f} tok/event" if x["events"] else ""
        print(
            f"  {name:<10}{x['tok_s']:>8,.0f} tok/s, first tokens p50 {x['ttft_p50_ms']:6.1f} "
            f"max {x['ttft_max_ms']:6.1f} ms; loop {1e3 * c['loop']:6.0f} receiver "
            f"{1e3 * c['receiver']:6.0f} process {1e3 * c['process']:6.0f} core "
            f"{1e3 * c['core']:5.0f}; per {unit}: loop {1e6 * c['loop'] / per:5.1f} receiver "
            f"{1e6 * c['receiver'] / per:5.1f} process {1e6 * c['process'] / per:5.1f} us" + events
        )
    print(f"  HTTP / engine alone: {r['http_vs_engine']:.3f}x", flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--client"]:
        return _client_main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m gpu.bench.serve_synthetic")
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--period", type=float, default=0.0017, help="seconds between tokens")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument(
        "--core",
        action="store_true",
        help="the real engine-core client against the stand-in core process",
    )
    p.add_argument("--json", dest="json_path", default=None)
    args = p.parse_args(argv)
    runs = []
    for _ in range(args.repeat):
        if args.core:
            r = measure_core(args.streams, args.tokens, args.period)
            print_core(r)
            runs.append(r)
            continue
        r = measure(args.streams, args.tokens, args.period)
        runs.append(r)
        print(
            f"{r['streams']} streams x {r['tokens_per_stream']} tokens, a token each "
            f"{r['period_ms']:.2f} ms (target {r['target_tok_s']:,.0f} tok/s): "
            f"{r['tok_s']:,.0f} tok/s, {r['events_s']:,.0f} events/s "
            f"({r['tokens_per_event']:.2f} tokens/event); event loop "
            f"{r['loop_cpu_s_per_s']:.2f} CPU s/s, {r['loop_us_per_token']:.1f} us/token, "
            f"{r['loop_us_per_event']:.1f} us/event ({r['http_stack']})",
            flush=True,
        )
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(runs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
