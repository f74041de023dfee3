"""The engine client seen from asyncio: `generate` is one request's outputs as an async stream.

The engine client (the engine core's `EngineCoreClient`, or an in-process `EngineThread`: one
contract, chat_app/engine_api.py) calls `on_output` on its own thread for every output of
every request. Waking the event loop once per output would cost a self-pipe write each, 64 a
step at 64 streams; instead the outputs go into one deque and the loop is woken once per batch
(the app's OutputBridge does the same for the UI): the first output of a step posts the
wake-up, the rest of the step rides along. The loop then appends each output to its request's
stream and wakes the stream's task only if it is waiting; a stream takes everything gathered
at once, so one that fell behind catches up in one event instead of falling further behind.
At 64 streams and ~590 steps a second that is ~38k outputs a second, so a stream is a list and
a future, not an asyncio.Queue (whose put and get cost several calls each).

Leaving a `generate` early (the client disconnected, the task was cancelled) aborts the request
in the engine at once: nobody will read its tokens.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from gpu.config import EngineConfig
from gpu.outputs import EngineStats, RequestOutput
from gpu.sampling_params import SamplingParams


def build_engine_client(
    model: str | None,
    device: str,
    config: EngineConfig | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    *,
    engine_process: bool = True,
) -> Any:
    """Load the model and return its engine client (not started): the engine core in a
    process of its own (gpu.engine_core), so the server's event loop never holds the GIL the
    step loop needs; engine_process=False: an engine thread in this process (the baseline
    `--no-engine-process` measures against). The one place that picks the client: the server
    is written against its contract, not a class."""
    config = config or EngineConfig()
    if engine_process:
        from gpu.engine_core import EngineCoreClient

        return EngineCoreClient(model, device, config, progress=progress)
    from gpu.engine_thread import EngineThread
    from gpu.loader import create_engine

    return EngineThread(create_engine(model, device, config, progress=progress))


class RequestStream:
    """One request's outputs on the loop: those not yet taken, and the task waiting for them."""

    __slots__ = ("outputs", "waiter")

    def __init__(self) -> None:
        self.outputs: list[RequestOutput] = []
        self.waiter: asyncio.Future[None] | None = None

    def put(self, output: RequestOutput) -> None:
        self.outputs.append(output)
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def take(self) -> list[RequestOutput]:
        """Everything that arrived since the last take (waiting for at least one)."""
        if not self.outputs:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        batch, self.outputs = self.outputs, []
        return batch


class AsyncEngine:
    """Wraps a started engine client for one event loop (create it on that loop)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.engine = client.engine  # tokenizer, model_name, max_model_len, ...
        self._loop = asyncio.get_running_loop()
        self._pending: deque[RequestOutput] = deque()  # append/popleft are atomic
        self._wakeup_posted = False
        self._streams: dict[str, RequestStream] = {}
        self._id_base = uuid.uuid4().hex[:16]
        self._id_count = itertools.count()

    def stats(self) -> EngineStats:
        return self.client.stats()

    @property
    def num_streams(self) -> int:
        """Requests this server is streaming now."""
        return len(self._streams)

    # -- engine thread -> loop --------------------------------------------------------------

    def _on_output(self, output: RequestOutput) -> None:
        """Runs on the engine's thread: queue, and wake the loop if nobody has yet."""
        self._pending.append(output)
        if not self._wakeup_posted:
            self._wakeup_posted = True
            try:
                self._loop.call_soon_threadsafe(self._dispatch)
            except RuntimeError:  # the loop is closed: the server has stopped, nobody reads
                pass

    def abort_all(self) -> None:
        """End every open stream (the server is stopping): each request's final output, an
        abort, ends its stream with an error event, and the connections close cleanly."""
        for request_id in list(self._streams):
            self.client.abort(request_id)

    def _dispatch(self) -> None:
        # Clear the flag before taking: an output queued after this line posts a new wake-up.
        self._wakeup_posted = False
        pending, streams = self._pending, self._streams
        while pending:
            output = pending.popleft()
            stream = streams.get(output.request_id)
            if stream is not None:
                stream.put(output)

    # -- requests ---------------------------------------------------------------------------

    def new_request_id(self, prefix: str) -> str:
        """Unique across servers sharing one engine client (ids are the engine's keys): a
        random part drawn once per server, then a count (uuid4 a request read os.urandom,
        a system call that handed the GIL to the receiver thread)."""
        return f"{prefix}-{self._id_base}{next(self._id_count):x}"

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[list[RequestOutput]]:
        """The request's delta outputs, in batches of whatever arrived since the last one;
        the last batch ends with the finished output. ValueError: the engine refused it."""
        stream = self._streams[request_id] = RequestStream()
        finished = False
        try:
            self.client.add_request(prompt_ids, params, self._on_output, request_id=request_id)
            while not finished:
                batch = await stream.take()
                finished = batch[-1].finished
                yield batch
        finally:
            del self._streams[request_id]
            if not finished:
                self.client.abort(request_id)
