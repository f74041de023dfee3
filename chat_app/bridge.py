"""From the engine thread to the UI thread: a hand-off that never blocks either side.

The engine calls `OutputBridge.on_output` on its own thread with each request's new tokens (a
step's, or with the engine core's client, everything that arrived in one read).
That call only appends to a deque and, if the UI has not already been told, posts one
`OutputsReady` message (Textual's `post_message` is thread-safe and does not wait). The UI then
drains the deque at most once per frame, merging each request's deltas into one
`StreamUpdate`: at 1,000 tokens/s across several tabs the screen still repaints at its own
pace, and the engine never waits for a repaint.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from textual.message import Message
from textual.message_pump import MessagePump

from gpu.outputs import RequestMetrics, RequestOutput

DEFAULT_FPS = 30.0


class OutputsReady(Message):
    """The bridge holds engine outputs for the UI (posted at most once per drain)."""


@dataclass
class StreamUpdate:
    """Everything that arrived for one request since the UI last looked."""

    request_id: str
    text: str = ""
    num_tokens: int = 0
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    metrics: RequestMetrics | None = None

    def merge(self, output: RequestOutput) -> None:
        completion = output.outputs[0] if output.outputs else None
        if completion is not None:
            self.text += completion.text
            self.num_tokens += len(completion.token_ids)
            self.finish_reason = completion.finish_reason or self.finish_reason
        self.finished = self.finished or output.finished
        self.error = output.error or self.error
        self.metrics = output.metrics or self.metrics


class OutputBridge:
    """Queues outputs on the engine thread; `drain` merges them on the UI thread."""

    def __init__(
        self,
        target: MessagePump,
        fps: float = DEFAULT_FPS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._target = target
        self._queue: deque[RequestOutput] = deque()  # append/popleft are atomic
        self._wakeup_posted = False
        self._frame = 1.0 / fps
        self._clock = clock
        self._last_drain = float("-inf")

    def on_output(self, output: RequestOutput) -> None:
        """The engine's callback: runs on the engine thread and returns at once."""
        self._queue.append(output)
        if not self._wakeup_posted:
            self._wakeup_posted = True
            self._target.post_message(OutputsReady())

    def delay_until_next_frame(self) -> float:
        """Seconds to wait so that drains happen at most once per frame."""
        return max(0.0, self._last_drain + self._frame - self._clock())

    def drain(self) -> list[StreamUpdate]:
        """Take everything queued so far, merged per request in arrival order."""
        # Clear the flag *before* taking: an output queued after this line posts a new
        # wake-up, so nothing can be left behind unannounced.
        self._wakeup_posted = False
        self._last_drain = self._clock()
        updates: dict[str, StreamUpdate] = {}
        while self._queue:
            output = self._queue.popleft()
            update = updates.setdefault(output.request_id, StreamUpdate(output.request_id))
            update.merge(output)
        return list(updates.values())
