"""The engine core: a process that owns the model and the device and runs the step loop.

`run_engine_core` is the spawned process's entry point. It builds the engine (forwarding the
build's progress), then loops: apply the client's messages, run one `LLMEngine.step()`, send
that step's outputs as one STEP message. With nothing to run it blocks on the pipe, so an idle
core costs nothing and wakes the moment a request arrives. Nothing else runs in this
interpreter: the UI's Python can no longer hold the GIL the step loop needs.
"""

from __future__ import annotations

import pickle
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

from gpu.config import EngineConfig
from gpu.engine import LLMEngine
from gpu.engine_core import protocol as p
from gpu.engine_core.heap import freeze_startup_heap
from gpu.engine_core.lifecycle import die_with_parent, ignore_interrupts

STATS_INTERVAL = 0.05  # seconds between the stats snapshots that ride on STEP messages


def main() -> None:
    """`python -c "from gpu.engine_core.core import main; main()" CONN_FD DEATH_FD`: the
    client's Popen runs this (not multiprocessing's spawn, which re-imports the parent's
    __main__ in the child: a script without an `if __name__ == "__main__"` guard would run
    twice, and the app's whole import tree would load in the core)."""
    conn_fd, death_fd = (int(a) for a in sys.argv[1:3])
    conn = Connection(conn_fd)
    model, device, config, parent_pid, kernel_death_signal = p.recv(conn)
    die_with_parent(parent_pid, kernel_death_signal, death_fd)
    ignore_interrupts()
    run_engine_core(conn, model, device, config)


def run_engine_core(conn: Connection, model: str | None, device: str, config: EngineConfig) -> None:
    """The core process: build the engine, then serve the client on `conn` until SHUTDOWN."""
    sender = _Sender(conn)
    try:
        engine = _build_engine(sender, model, device, config)
    except BaseException as exc:
        sender.send((p.LOAD_FAILED, _picklable(exc)))
        return
    info = p.EngineInfo(
        engine.model_name,
        engine.device,
        engine.max_model_len,
        engine.kv_capacity_tokens,
        engine.vocab_size,
    )
    freeze_startup_heap()  # no full collection of the build's heap inside a step (heap.py)
    sender.send((p.READY, info))
    try:
        EngineCore(engine, conn, sender).run()
    except (EOFError, OSError):
        return  # the client is gone
    except BaseException as exc:  # the loop itself broke: tell the client, then exit
        sender.send((p.FATAL, f"{type(exc).__name__}: {exc}"))
        raise


def _build_engine(
    sender: _Sender, model: str | None, device: str, config: EngineConfig
) -> LLMEngine:
    from gpu.loader import create_engine
    from weights import resolve_model

    def progress(stage: str, done: int, total: int) -> None:
        sender.send((p.PROGRESS, stage, done, total))

    folder = str(resolve_model(model, progress))
    sender.send((p.MODEL, folder))
    return create_engine(folder, device, config, progress=progress)


def _picklable(exc: BaseException) -> BaseException:
    """exc itself when it survives pickling (a ModelLoadError reads the same in the client),
    else a RuntimeError that says what it was."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")
    return exc


class _Sender:
    """protocol.send under a lock: progress may be reported from a compile thread."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    def send(self, message: Any) -> None:
        with self._lock:
            p.send(self._conn, message)


class EngineCore:
    """The step loop over one engine; requests are named by the client's int handles."""

    def __init__(self, engine: LLMEngine, conn: Connection, sender: _Sender) -> None:
        self.engine = engine
        self.conn = conn
        self.sender = sender
        self._stopping = False
        self._last_stats = 0.0

    def run(self) -> None:
        engine, conn = self.engine, self.conn
        while not self._stopping:
            if not engine.has_unfinished_requests():
                self._send_stats()
                self._handle(p.recv(conn))  # idle: wait for the client
            while not self._stopping and conn.poll():
                self._handle(p.recv(conn))
            if self._stopping or not engine.has_unfinished_requests():
                continue
            try:
                outputs = engine.step()
            except Exception as exc:  # the engine failed outside a request: fail them all
                outputs = engine.fail_requests(list(engine.requests.values()), exc)
            self._send_outputs(outputs)
        self._shut_down()

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == p.ADD:
            _, handle, token_ids, params = message
            try:
                self.engine.add_request(token_ids, params, request_id=str(handle))
            except ValueError as exc:  # this request only: the others go on
                row: p.Finished = (handle, [], "error", None, str(exc), 0, None)
                self.sender.send((p.STEP, [], [], [row], None))
        elif kind == p.ABORT:
            self.engine.abort_request([str(h) for h in message[1]])
        elif kind == p.SHUTDOWN:
            self._stopping = True

    def _send_outputs(self, outputs: list) -> None:
        now = time.monotonic()
        stats = None
        if now - self._last_stats >= STATS_INTERVAL:
            self._last_stats = now
            stats = p.stats_to_tuple(self.engine.stats())
        if outputs or stats is not None:
            self.sender.send(p.step_message(outputs, stats))

    def _send_stats(self) -> None:
        self._last_stats = time.monotonic()
        self.sender.send((p.STATS, p.stats_to_tuple(self.engine.stats())))

    def _shut_down(self) -> None:
        """Abort what runs (each request gets its final output), send it, and stop."""
        engine = self.engine
        engine.abort_request(list(engine.requests))
        outputs = []
        while engine.has_unfinished_requests():
            outputs += engine.step()
        self.sender.send(p.step_message(outputs, p.stats_to_tuple(engine.stats())))
