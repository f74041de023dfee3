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
# Where the engine computes on this machine's CPU, the app's frames take the cores it steps on.
CPU_ENGINE_FPS = 15.0


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

    @property
    def frame_interval(self) -> float:
        return self._frame

    def pace_for(self, device: str) -> None:
        """Drain at most CPU_ENGINE_FPS times a second if the engine runs on the CPU.

        There the engine's products and the app's frames share the machine's cores, and on a
        CPU a tab gets a token every ~40 ms: at 30 frames a second each token was a frame of
        its own (Textual's layout and render, ~9 ms of the UI thread). `tinychat bench app
        --device cpu --tabs 2` (the default model), 3 runs each, alternating, load 3.0-4.0:
        the app's CPU per 1,000 tokens 2.2-3.1 s at 15 frames against 4.3-5.7 s at 30, and
        the app on the core 0.96-1.08x of the core alone against 0.80-1.01x. A GPU engine
        needs one core of the host: 30 frames stay."""
        if device == "cpu":
            self._frame = max(self._frame, 1.0 / CPU_ENGINE_FPS)

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
