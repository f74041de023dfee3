"""The load generator of `tinychat bench serve`: N concurrent streaming clients over HTTP.

    python -m gpu.bench.serve_clients spec.json results.json

spec.json: {"url": ".../v1", "api_key": null, "start_at": <time.monotonic()>,
"requests": [<a /v1/completions body>, ...]}.
Every request starts at once (each its own connection, as N users would), streams with
`include_usage`, and records when each text chunk arrived. The results hold, per request, the
time to the first chunk, the chunks' arrival times, the text, the server's usage, the
response's id, and the token ids when the body asks for them (vLLM's `return_token_ids`).

It runs in processes of their own (the bench splits the clients among several, all starting
at one `start_at`), so that the clients' Python (parsing N streams of events) neither competes
with the server's event loop for a GIL nor runs out of one core, as real clients on other
machines would not.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import httpx


async def _one(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> dict[str, Any]:
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    start = time.monotonic()
    times: list[float] = []
    parts: list[str] = []
    token_ids: list[int] = []
    usage: dict[str, Any] = {}
    response_id = error = None
    try:
        async with client.stream("POST", url + "/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                error = f"{response.status_code}: {response.text[:200]}"
            else:
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    data = line[6:]
                    if data == "[DONE]":
                        break
                    event = json.loads(data)
                    if "error" in event:
                        error = str(event["error"])
                        break
                    response_id = response_id or event.get("id")
                    choices = event.get("choices") or []
                    text = choices[0].get("text") if choices else ""
                    if text:
                        times.append(time.monotonic())
                        parts.append(text)
                    if choices and choices[0].get("token_ids"):
                        token_ids += choices[0]["token_ids"]
                    if event.get("usage"):
                        usage = event["usage"]
    except httpx.HTTPError as exc:
        error = f"{type(exc).__name__}: {exc}"
    return {
        "start": start,
        "times": times,
        "text": "".join(parts),
        "token_ids": token_ids,
        "id": response_id,
        "completion_tokens": usage.get("completion_tokens", 0),
        "prompt_tokens": usage.get("prompt_tokens", 0),
        "error": error,
    }


async def run_clients(spec: dict[str, Any]) -> dict[str, Any]:
    """Every request at `start_at` (time.monotonic, the same clock in every process on the
    machine), times relative to it."""
    requests = spec["requests"]
    headers = {"Authorization": f"Bearer {spec['api_key']}"} if spec.get("api_key") else {}
    limits = httpx.Limits(max_connections=len(requests) + 8, max_keepalive_connections=0)
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=None) as client:
        # One request before the start: a process's first httpx request holds its event loop
        # for 90-140 ms (lazy set-up; H100 host, 8 processes), which would start its other
        # clients that much late and time the clients, not the server. Users' clients are past
        # their first request.
        await client.get(spec["url"] + "/models")
        t0 = spec.get("start_at") or time.monotonic()
        await asyncio.sleep(max(0.0, t0 - time.monotonic()))
        cpu = time.process_time()
        results = await asyncio.gather(*(_one(client, spec["url"], r) for r in requests))
        t1 = time.monotonic()
        cpu = time.process_time() - cpu
    for r in results:  # times relative to the start of the run
        r["start"] -= t0
        r["times"] = [t - t0 for t in r["times"]]
    return {"wall_s": t1 - t0, "cpu_s": cpu, "results": results}


def main(argv: list[str] | None = None) -> int:
    spec_path, out_path = (argv or sys.argv[1:])[:2]
    with open(spec_path) as f:
        spec = json.load(f)
    results = asyncio.run(run_clients(spec))
    with open(out_path, "w") as f:
        json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
