"""The engine core of tests/device/serve_timeline.py: gpu.engine_core.core with hooks that
record when each ADD is applied, each step (start, end, running, waiting, outputs) and when
each request's first output is sent; written as JSON to $TIMELINE_CORE_LOG at shutdown."""

from __future__ import annotations

import json
import os
import time

from gpu.engine import LLMEngine
from gpu.engine_core import core
from gpu.engine_core import protocol as p

adds: dict[str, float] = {}
first_out: dict[str, float] = {}
steps: list[tuple] = []

_handle = core.EngineCore._handle
_send_outputs = core.EngineCore._send_outputs
_shut_down = core.EngineCore._shut_down
_step = LLMEngine.step


def handle(self, message):
    if message[0] == p.ADD:
        adds[str(message[1])] = time.monotonic()
    return _handle(self, message)


def step(self):
    t = time.monotonic()
    waiting, running = len(self.scheduler.waiting), len(self.scheduler.running)
    outputs = _step(self)
    steps.append((t, time.monotonic(), running, waiting, len(outputs)))
    return outputs


def send_outputs(self, outputs):
    t = time.monotonic()  # before the send: the receiver may have it before the call returns
    for out in outputs:
        first_out.setdefault(out.request_id, t)
    _send_outputs(self, outputs)


def shut_down(self):
    with open(os.environ["TIMELINE_CORE_LOG"], "w") as f:
        json.dump({"adds": adds, "first_out": first_out, "steps": steps}, f)
    _shut_down(self)


core.EngineCore._handle = handle
core.EngineCore._send_outputs = send_outputs
core.EngineCore._shut_down = shut_down
LLMEngine.step = step
main = core.main
