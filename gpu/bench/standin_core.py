"""A stand-in engine core for `tinychat bench app --runs synthetic,app-synthetic` and
`python -m gpu.bench.serve_synthetic --core`: a client's side of streaming (the app's, the
server's), measured on any machine, with no model and no GPU.

It is a process of its own that speaks the core's protocol (gpu/engine_core/protocol.py) to a
real `EngineCoreClient`, so the app process does exactly what it does with a real core (the
receiver thread unpickles each step, detokenizes, checks stop strings, feeds the bridge; the UI
thread renders): only the step itself is missing. Every `step_s` (1.5 ms: an H100's decode step
for Llama-3.2-1B at 8 requests, ~5,300 tok/s in all) it sends one STEP message with a token
for each running request; sends block when the client falls behind, as the real core's do, so
an app that cannot keep up slows the stream the same way. The token ids are drawn from the
model folder's vocabulary (bench_app's word-per-id tokenizer: realistic text to render).

The model folder holds tokenizer.json and `synthetic.json` ({"step_s": .., "vocab_size": ..}):
model_folder writes it.
"""

from __future__ import annotations

import json
import random
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

from gpu.engine_core import protocol as p
from gpu.engine_core.lifecycle import die_with_parent, ignore_interrupts
from gpu.outputs import EngineStats, StepStats

ENTRY = "gpu.bench.standin_core"  # EngineCoreClient(entry=...) runs this module's main()
SETTINGS_FILE = "synthetic.json"
STEP_S = 0.0015
STATS_INTERVAL = 0.05


def model_folder(
    folder: Path,
    vocab_size: int = 32_000,
    step_s: float | None = None,
    paragraph: int | None = None,
) -> Path:
    """The folder the stand-in core 'loads': a word-per-id tokenizer (gpu/bench/fixtures.py;
    one word in `paragraph` opens a paragraph) and the core's settings (step_s: STEP_S unless
    given). Written once per settings."""
    from gpu.bench.fixtures import save_word_tokenizer

    settings = {"step_s": step_s or STEP_S, "vocab_size": vocab_size}
    path = folder / SETTINGS_FILE
    if path.exists() and json.loads(path.read_text()) == settings:
        return folder
    save_word_tokenizer(folder, vocab_size, paragraph=paragraph)
    path.write_text(json.dumps(settings))
    return folder


def main() -> None:
    conn_fd, death_fd = (int(a) for a in sys.argv[1:3])
    conn = Connection(conn_fd)
    model, _device, config, parent_pid, kernel_death_signal = p.recv(conn)
    die_with_parent(parent_pid, kernel_death_signal, death_fd)
    ignore_interrupts()
    settings = json.loads((Path(model) / SETTINGS_FILE).read_text())
    p.send(conn, (p.MODEL, model))
    info = p.EngineInfo("synthetic", "synthetic", config.max_model_len or 8192, 1 << 20, 0)
    p.send(conn, (p.READY, info))
    try:
        SyntheticCore(conn, settings.get("step_s", STEP_S), settings["vocab_size"]).run()
    except (EOFError, OSError):
        return  # the client is gone


class SyntheticCore:
    """The step loop without an engine: one token per running request per step."""

    def __init__(self, conn: Connection, step_s: float, vocab_size: int) -> None:
        self.conn = conn
        self.step_s = step_s
        self.vocab_size = vocab_size
        self.running: dict[int, list[int]] = {}  # handle -> [tokens left, generated]
        self.first_scheduled: dict[int, float] = {}
        self.rng = random.Random(0)
        self.generated = 0
        self._last_stats = 0.0
        self._stopping = False

    def run(self) -> None:
        conn = self.conn
        deadline = time.monotonic()
        while not self._stopping:
            if not self.running:
                self._handle(p.recv(conn))  # idle: wait for the client
                deadline = time.monotonic()
            while not self._stopping and conn.poll(max(0.0, deadline - time.monotonic())):
                self._handle(p.recv(conn))
            if self._stopping or not self.running:
                continue
            deadline = max(deadline + self.step_s, time.monotonic())
            p.send(conn, self._step())
        p.send(conn, (p.STEP, [], [], [self._end(h, "abort") for h in list(self.running)], None))

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == p.ADD:
            _, handle, _token_ids, params = message
            self.running[handle] = [params.max_tokens or 256, 0]
            self.first_scheduled[handle] = time.monotonic()
        elif kind == p.ABORT:
            rows = [self._end(h, "abort") for h in message[1] if h in self.running]
            if rows:
                p.send(self.conn, (p.STEP, [], [], rows, None))
        elif kind == p.SHUTDOWN:
            self._stopping = True

    def _step(self) -> tuple:
        handles, tokens, finished = [], [], []
        for handle, state in list(self.running.items()):
            token = self.rng.randrange(self.vocab_size)
            state[0] -= 1
            self.generated += 1
            if state[0] <= 0:
                finished.append(self._end(handle, "length", [token]))
            else:
                handles.append(handle)
                tokens.append(token)
        stats = None
        now = time.monotonic()
        if now - self._last_stats >= STATS_INTERVAL:
            self._last_stats = now
            stats = p.stats_to_tuple(self._stats(len(handles) + len(finished)))
        return (p.STEP, handles, tokens, finished, stats)

    def _end(self, handle: int, reason: str, last: list[int] | None = None) -> p.Finished:
        del self.running[handle]
        return (handle, last or [], reason, None, None, 0, self.first_scheduled.pop(handle))

    def _stats(self, batch: int) -> EngineStats:
        return EngineStats(
            num_running=len(self.running),
            tokens_per_s=batch / self.step_s,
            last_step=StepStats(batch, 0, batch, self.step_s),
        )
