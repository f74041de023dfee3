"""The server's own cost, without a model: `tinychat serve`'s app in front of a synthetic engine
client that streams a token to every request every `period` seconds, on a thread of its own,
as the engine core's receiver thread does (64 streams at 1.7 ms: an H100's Llama-3.2-1B rate).

    python -m gpu.bench.serve_synthetic [--streams 64] [--tokens 512] [--period 0.0017]

The clients (a process of their own) speak raw HTTP over asyncio sockets and only count the
events and bytes, so the server's event loop, not a client's parser, is what runs out first
on a small machine. Reported: tokens and events delivered per second, and the CPU the server's
event-loop thread spent per token and per event (clock of that thread); the synthetic engine's
own thread is measured apart. A server that keeps up delivers streams x 1 / period tokens a
second; one that falls behind delivers fewer events, each carrying several tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gpu.outputs import CompletionOutput, EngineStats, RequestOutput


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


async def _stream(host: str, port: int, body: bytes) -> tuple[int, int, int, float, float]:
    """One streaming request: its events, the tokens in them (each token's text is " w<id>",
    the only spaces on the wire), the bytes, and when the first and last bytes came."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body
    )
    events = tokens = received = 0
    first = last = 0.0
    tail = b""
    while True:
        data = await reader.read(1 << 16)
        if not data:
            break
        now = time.monotonic()
        first = first or now
        last = now
        received += len(data)
        chunk = tail + data
        events += chunk.count(b'"text":"')
        tokens += chunk.count(b" w")
        tail = chunk[-16:]
        events -= tail.count(b'"text":"')
        tokens -= tail.count(b" w")
        if b"data: [DONE]" in chunk:
            break
    events += tail.count(b'"text":"')
    tokens += tail.count(b" w")
    writer.close()
    return events, tokens, received, first, last


async def _clients(host: str, port: int, streams: int, tokens: int) -> dict[str, Any]:
    body = json.dumps(
        {"prompt": [1, 2, 3, 4], "max_tokens": tokens, "stream": True, "ignore_eos": True}
    ).encode()
    t0 = time.monotonic()
    results = await asyncio.gather(*(_stream(host, port, body) for _ in range(streams)))
    return {
        "events": sum(r[0] for r in results),
        "tokens": sum(r[1] for r in results),
        "bytes": sum(r[2] for r in results),
        "first": min(r[3] for r in results) - t0,
        "wall_s": max(r[4] for r in results) - t0,
    }


def _client_main(argv: list[str]) -> int:
    host, port, streams, tokens = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    print(json.dumps(asyncio.run(_clients(host, port, streams, tokens))))
    return 0


# -- the measurement ------------------------------------------------------------------------


def measure(streams: int, tokens: int, period: float) -> dict[str, Any]:
    from gpu.entrypoints.openai.api_server import ServerThread, build_app

    client = SyntheticEngineClient(period)
    client.start()
    server = ServerThread(build_app(client)).start()
    host, port = server.url.removeprefix("http://").removesuffix("/v1").split(":")
    clock = time.pthread_getcpuclockid(server._thread.ident)
    try:
        loop_cpu = time.clock_gettime(clock)
        command = [sys.executable, "-m", "gpu.bench.serve_synthetic", "--client", host, port,
                   str(streams), str(tokens)]  # fmt: skip
        root = str(Path(__file__).resolve().parents[2])
        out = subprocess.run(command, capture_output=True, text=True, cwd=root, check=True)
        loop_cpu = time.clock_gettime(clock) - loop_cpu
    finally:
        server.stop()
        client.shutdown()
    run = json.loads(out.stdout)
    from gpu.bench.serve import http_stack

    delivered = run["tokens"]
    wall = run["wall_s"]
    return {
        "http_stack": http_stack(),
        "streams": streams,
        "tokens_per_stream": tokens,
        "period_ms": period * 1e3,
        "target_tok_s": streams / period,
        "tokens_received": run["tokens"],
        "tok_s": delivered / wall,
        "events_s": run["events"] / wall,
        "tokens_per_event": delivered / max(run["events"], 1),
        "loop_cpu_s_per_s": loop_cpu / wall,
        "loop_us_per_token": 1e6 * loop_cpu / max(delivered, 1),
        "loop_us_per_event": 1e6 * loop_cpu / max(run["events"], 1),
        "emitter_cpu_s": client.cpu_s,
        "wall_s": wall,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--client"]:
        return _client_main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m gpu.bench.serve_synthetic")
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--period", type=float, default=0.0017)
    p.add_argument("--repeat", type=int, default=1)
    args = p.parse_args(argv)
    for _ in range(args.repeat):
        r = measure(args.streams, args.tokens, args.period)
        print(
            f"{r['streams']} streams x {r['tokens_per_stream']} tokens, a token each "
            f"{r['period_ms']:.2f} ms (target {r['target_tok_s']:,.0f} tok/s): "
            f"{r['tok_s']:,.0f} tok/s, {r['events_s']:,.0f} events/s "
            f"({r['tokens_per_event']:.2f} tokens/event); event loop "
            f"{r['loop_cpu_s_per_s']:.2f} CPU s/s, {r['loop_us_per_token']:.1f} us/token, "
            f"{r['loop_us_per_event']:.1f} us/event ({r['http_stack']})",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
