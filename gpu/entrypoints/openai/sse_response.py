"""A server-sent-events response: the stream's events written as they come, and the request
cancelled the moment its client disconnects.

Starlette's StreamingResponse does the same through an anyio task group per response (a cancel
scope, two anyio tasks, a cancellation that formats the task's repr): ~20% of the event loop's
samples (py-spy --gil) while 64 streams were admitted at once. Here it is one asyncio task that
waits for the disconnect and cancels the response's task; leaving the event stream early closes
it, which aborts the request in the engine (async_engine.py). The app's own Python (64
streaming /v1/completions through build_app with a send that only counts, 6 runs each,
alternating): 164-213 us a request until its engine request is added against 271-311 with
StreamingResponse, 10.7-13.6 us an event against 12.2-14.2. With the other admission changes
beside it (api_server.frozen_heap, AsyncEngine.new_request_id, the client's
_core_params), `python -m gpu.bench.serve_synthetic --core` (64 streams, 2-core CPU, 6 runs
alternating, load 4.3): the loop's CPU per admitted request 644 (586-879) us against 1204
(825-1414), all 64 first tokens after 101 (78-232) ms against 183 (133-349).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
_END = {"type": "http.response.body", "body": b"", "more_body": False}


class EventStreamResponse(Response):
    """`events` (bytes, each one write) as a text/event-stream response."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[bytes]) -> None:
        self.events = events
        self.status_code = 200
        self.background = None
        self.raw_headers = list(_HEADERS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        assert task is not None
        state = {"streaming": True, "disconnected": False}

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            if state["streaming"]:
                state["disconnected"] = True
                task.cancel()

        watcher = asyncio.get_running_loop().create_task(watch())
        events = self.events
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for chunk in events:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            state["streaming"] = False
            await send(_END)
        except asyncio.CancelledError:
            if not state["disconnected"]:
                raise
            if hasattr(task, "uncancel"):  # Python 3.11+ counts cancels; 3.10 has no count
                task.uncancel()  # the client left: that cancel was ours, and it has done its work
        finally:
            state["streaming"] = False
            watcher.cancel()
            await events.aclose()  # type: ignore[attr-defined]
