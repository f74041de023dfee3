"""Where an HTTP request's first token waits: `tinychat bench serve` with each request timed at
every hand-over, joined by its id.

    python3 tests/device/serve_timeline.py [bench serve's arguments, e.g. --config llama-3.2-1b
        --device cuda --clients 64 --new-tokens 512]

Runs gpu.bench.serve as `tinychat bench serve` does, with hooks (this script's, not the
product's) that record, per request of the timed HTTP run, on one clock (CLOCK_MONOTONIC,
shared by the processes of one machine):

    client start -> the server's ASGI call -> AsyncEngine.generate -> EngineCoreClient
    .add_request sent -> the core applies the ADD -> the core sends its first token -> the
    receiver hands it on -> the client reads it

and the core's steps (start, end, requests running, prompt tokens). Prints the percentiles of
each segment and the arrivals over time; writes $OUT/serve_timeline.json.
"""

from __future__ import annotations

import argparse
import contextvars
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import gpu.bench.serve as serve  # noqa: E402
import gpu.entrypoints.openai.api_server as api_server  # noqa: E402
import gpu.entrypoints.openai.async_engine as async_engine  # noqa: E402
from gpu.bench import add_bench_arguments  # noqa: E402
from gpu.engine_core.client import EngineCoreClient  # noqa: E402

CORE_LOG = Path(os.environ.get("OUT", "/tmp")) / "serve_timeline_core.json"
server: dict[str, dict[str, float]] = {}  # request id -> event -> time
_asgi_in: contextvars.ContextVar[float] = contextvars.ContextVar("asgi_in", default=0.0)


def _mark(request_id: str, event: str, t: float | None = None) -> None:
    server.setdefault(request_id, {}).setdefault(event, time.monotonic() if t is None else t)


def _build_engine_client(model, device, config=None, progress=None, *, engine_process=True):
    CORE_LOG.parent.mkdir(parents=True, exist_ok=True)
    os.environ["TIMELINE_CORE_LOG"] = str(CORE_LOG)
    return EngineCoreClient(
        model, device, config, progress=progress, entry="tests.device.serve_timeline_core"
    )


_add_request = EngineCoreClient.add_request


def _timed_add_request(self, prompt, params, on_output, request_id=None):
    rid = request_id

    def first(out):
        _mark(rid, "receiver")
        on_output(out)

    _mark(rid, "add")
    result = _add_request(self, prompt, params, first if rid else on_output, request_id)
    if rid:
        server[rid]["handle"] = float(self._handles.get(rid, -1))
        _mark(rid, "sent")
    return result


_generate = async_engine.AsyncEngine.generate


async def _timed_generate(self, prompt_ids, params, request_id):
    _mark(request_id, "asgi", _asgi_in.get())
    _mark(request_id, "generate")
    async for batch in _generate(self, prompt_ids, params, request_id):
        _mark(request_id, "loop_first")
        yield batch


_build_app = api_server.build_app


def _timed_build_app(client, api_key=None):
    app = _build_app(client, api_key)

    async def timed(scope, receive, send):
        if scope["type"] == "http":
            _asgi_in.set(time.monotonic())
        await app(scope, receive, send)

    timed.state = app.state  # what ServerThread may read
    return timed


def _pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))] if xs else float("nan")


def report(http_results: list[dict], t0: float) -> dict:
    core = json.loads(CORE_LOG.read_text()) if CORE_LOG.exists() else {}
    adds, firsts = core.get("adds", {}), core.get("first_out", {})
    rows = []
    for r in http_results:
        s = server.get(r.get("id") or "", {})
        h = str(int(s.get("handle", -1)))
        if not r["times"] or "asgi" not in s or h not in adds:
            continue
        rows.append(
            {
                "client_start": t0 + r["start"],
                "asgi": s["asgi"],
                "generate": s["generate"],
                "sent": s["sent"],
                "core_add": adds[h],
                "core_first": firsts.get(h, float("nan")),
                "receiver": s.get("receiver", float("nan")),
                "loop_first": s.get("loop_first", float("nan")),
                "client_first": t0 + r["times"][0],
            }
        )
    names = list(rows[0]) if rows else []
    print(f"{len(rows)} requests joined; ms from the previous hand-over (p50 / p90 / max):")
    for a, b in zip(names, names[1:], strict=False):
        d = [1e3 * (row[b] - row[a]) for row in rows]
        print(f"  {a:>12} -> {b:<12} {_pct(d, 50):8.2f} {_pct(d, 90):8.2f} {max(d):8.2f}")
    first_start = min(row["client_start"] for row in rows) if rows else 0.0
    print("arrivals (ms after the first client start) at the ASGI call, at the core's ADD:")
    for q in (0, 25, 50, 75, 90, 100):
        print(
            f"  {q:3d}%  asgi {1e3 * (_pct([x['asgi'] for x in rows], q) - first_start):8.2f}"
            f"  core {1e3 * (_pct([x['core_add'] for x in rows], q) - first_start):8.2f}"
            f"  first token at the client "
            f"{1e3 * (_pct([x['client_first'] for x in rows], q) - first_start):8.2f}"
        )
    steps = [s for s in core.get("steps", []) if s[0] >= first_start - 0.01]
    window = [s for s in steps if s[0] <= max((x["client_first"] for x in rows), default=0)]
    print(f"core steps until the last first token: {len(window)}")
    for s in window[:80]:
        print(
            f"  step at {1e3 * (s[0] - first_start):8.2f} ms  {1e3 * (s[1] - s[0]):6.2f} ms"
            f"  running {s[2]:3d}  waiting {s[3]:3d}  outputs {s[4]:3d}"
        )
    return {"rows": rows, "steps": steps}


def main() -> int:
    async_engine.build_engine_client = _build_engine_client
    EngineCoreClient.add_request = _timed_add_request
    async_engine.AsyncEngine.generate = _timed_generate
    api_server.build_app = _timed_build_app
    runs = []
    original = serve._run_clients

    def recorded(spec):
        out = original(spec)
        runs.append((spec, out))
        return out

    serve._run_clients = recorded
    p = argparse.ArgumentParser()
    add_bench_arguments(p)
    args = p.parse_args(["serve", *sys.argv[1:]])
    args.progress = None
    serve.run_serve_bench(args)
    # Each setting's timed run is its second HTTP run on the GPU (an untimed one first).
    timed = runs[1::2] if args.device != "cpu" else runs
    results = []
    for _, out in timed:
        results.append(report(out["results"], out["start_at"]))
    path = Path(os.environ.get("OUT", "/tmp")) / "serve_timeline.json"
    path.write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
