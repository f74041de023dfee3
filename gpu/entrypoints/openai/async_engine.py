"""The engine client seen from asyncio: `generate` is one request's outputs as an async stream.

The engine client (the engine core's `EngineCoreClient`, or an in-process `EngineThread`: one
contract, chat_app/engine_api.py) calls `on_output` on its own thread for every output of
every request. Waking the event loop once per output would cost a self-pipe write each, 256 a
step at 256 streams; instead the outputs go into one deque and the loop is woken once per batch
(the app's OutputBridge does the same for the UI). The loop then hands each output to its
request's queue, and each stream takes everything queued at once, so a slow stream catches up
in one chunk instead of falling further behind.

Leaving a `generate` early (the client disconnected, the task was cancelled) aborts the request
in the engine at once: nobody will read its tokens.
"""

from __future__ import annotations

import asyncio
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


class AsyncEngine:
    """Wraps a started engine client for one event loop (create it on that loop)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.engine = client.engine  # tokenizer, model_name, max_model_len, ...
        self._loop = asyncio.get_running_loop()
        self._pending: deque[RequestOutput] = deque()  # append/popleft are atomic
        self._wakeup_posted = False
        self._queues: dict[str, asyncio.Queue[RequestOutput]] = {}

    def stats(self) -> EngineStats:
        return self.client.stats()

    @property
    def num_streams(self) -> int:
        """Requests this server is streaming now."""
        return len(self._queues)

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
        for request_id in list(self._queues):
            self.client.abort(request_id)

    def _dispatch(self) -> None:
        # Clear the flag before taking: an output queued after this line posts a new wake-up.
        self._wakeup_posted = False
        pending = self._pending
        while pending:
            output = pending.popleft()
            queue = self._queues.get(output.request_id)
            if queue is not None:
                queue.put_nowait(output)

    # -- requests ---------------------------------------------------------------------------

    @staticmethod
    def new_request_id(prefix: str) -> str:
        """Unique across servers sharing one engine client (ids are the engine's keys)."""
        return f"{prefix}-{uuid.uuid4().hex}"

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str
    ) -> AsyncIterator[list[RequestOutput]]:
        """The request's delta outputs, in batches of whatever arrived since the last one;
        the last batch ends with the finished output. ValueError: the engine refused it."""
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        self._queues[request_id] = queue
        finished = False
        try:
            self.client.add_request(prompt_ids, params, self._on_output, request_id=request_id)
            while not finished:
                batch = [await queue.get()]
                while not queue.empty():
                    batch.append(queue.get_nowait())
                finished = batch[-1].finished
                yield batch
        finally:
            del self._queues[request_id]
            if not finished:
                self.client.abort(request_id)
