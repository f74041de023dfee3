"""The engine in the background: one thread owns the `LLMEngine` and runs its step loop.

Clients (the chat app, the benchmark's chat workload) call `add_request` / `abort` from any
thread; the calls are queued and applied by the engine thread between steps, so the engine
itself stays single-threaded. Each request's outputs go to its `on_output` callback, called on
the engine thread with the new text only (DELTA); the callback must not block — the app posts a
message to its event loop and returns. `RequestStream` is the alternative for code that wants to
iterate: a queue that never blocks the engine, however slow the reader.

The app and `tinychat generate` run the engine in a process of its own instead, through
`gpu.engine_core.EngineCoreClient`, which keeps these same calls: here the step loop shares the
interpreter's GIL with its clients. This thread is the in-process path (`--no-engine-process`).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import queue
import sys
import threading
from collections.abc import Callable, Iterator

from gpu.engine import LLMEngine
from gpu.outputs import CompletionOutput, EngineStats, RequestOutput
from gpu.sampling_params import RequestOutputKind, SamplingParams

log = logging.getLogger(__name__)
SWITCH_INTERVAL_MS = 1.0  # see EngineThread.start
OutputCallback = Callable[[RequestOutput], None]


class _SwitchInterval:
    """The interpreter-wide GIL switch interval, shortened while any engine thread runs and
    given back when the last one stops: it is process state, and a library that leaves it
    changed slows every other threaded program in the process (Numba's CUDA simulator, which
    runs a block as 32 Python threads polled by the caller, runs 10-15x slower at 1 ms)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._saved = 0.0

    def acquire(self, seconds: float) -> None:
        with self._lock:
            if self._users == 0:
                self._saved = sys.getswitchinterval()
            self._users += 1
            if seconds < sys.getswitchinterval():
                sys.setswitchinterval(seconds)

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0:
                sys.setswitchinterval(self._saved)


_switch_interval = _SwitchInterval()


class RequestStream:
    """An iterator over one request's outputs, fed by the engine thread without blocking it."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[RequestOutput] = queue.SimpleQueue()
        self.request_id = ""

    def put(self, output: RequestOutput) -> None:
        self._queue.put(output)

    def __iter__(self) -> Iterator[RequestOutput]:
        while True:
            out = self._queue.get()
            yield out
            if out.finished:
                return

    def text(self) -> str:
        """Block until the request ends; the whole reply."""
        return "".join(out.outputs[0].text for out in self)


class EngineThread:
    def __init__(self, engine: LLMEngine, idle_wait: float = 0.05) -> None:
        self.engine = engine
        self._commands: queue.SimpleQueue[tuple] = queue.SimpleQueue()
        self._callbacks: dict[str, OutputCallback] = {}
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle_wait = idle_wait
        self._ids = itertools.count()
        self._stats = engine.stats()
        self._thread = threading.Thread(target=self._run, name="tinychat-engine", daemon=True)

    # --- client side (any thread) ---------------------------------------------------------
    def start(self) -> None:
        # The engine shares the interpreter with its clients (the app's UI, the bench's
        # sessions). When threads contend for the GIL, Python hands it over only every
        # switch interval (5 ms by default), so a client thread busy in Python could hold a
        # decode step back by up to 5 ms. A shorter interval bounds that wait.
        # The previous interval comes back when the last engine thread stops.
        _switch_interval.acquire(SWITCH_INTERVAL_MS / 1e3)
        try:
            self._thread.start()
        except BaseException:
            _switch_interval.release()
            raise

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        on_output: OutputCallback,
        request_id: str | None = None,
    ) -> str:
        """Queue a request; its outputs (deltas) go to on_output on the engine thread.

        Checks the prompt here, in the caller's thread, so that a prompt longer than the
        context raises ValueError at once instead of failing later.
        """
        if self._stop.is_set():
            raise RuntimeError("the engine is shut down")
        engine = self.engine
        if isinstance(prompt, str):
            token_ids = engine.tokenizer.encode(prompt, add_special_tokens=True)
        else:
            token_ids = list(prompt)
        if not token_ids:
            raise ValueError("the prompt is empty")
        if len(token_ids) >= engine.max_model_len:
            raise ValueError(
                f"the prompt is {len(token_ids)} tokens, but the context is "
                f"{engine.max_model_len} tokens (and the reply needs at least one more)"
            )
        if params.output_kind is not RequestOutputKind.DELTA:
            params = dataclasses.replace(params, output_kind=RequestOutputKind.DELTA)
        request_id = request_id or f"req-{next(self._ids)}"
        self._commands.put(("add", request_id, prompt, token_ids, params, on_output))
        self._wake.set()
        return request_id

    def submit(self, prompt: str | list[int], params: SamplingParams) -> RequestStream:
        """add_request with a RequestStream as the consumer."""
        stream = RequestStream()
        stream.request_id = self.add_request(prompt, params, stream.put)
        return stream

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))
        self._wake.set()

    def stats(self) -> EngineStats:
        return self._stats

    def shutdown(self, timeout: float = 5.0) -> None:
        """Abort every request (each gets its final output) and stop the thread."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    # --- engine side ----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        finally:
            _switch_interval.release()

    def _loop(self) -> None:
        engine = self.engine
        while not self._stop.is_set():
            self._apply_commands()
            if not engine.has_unfinished_requests():
                self._stats = engine.stats()
                self._wake.wait(self._idle_wait)
                self._wake.clear()
                continue
            try:
                outputs = engine.step()
            except Exception as exc:  # the engine failed outside a request: fail them all
                log.exception("engine step failed")
                outputs = self._fail_all(exc)
            self._deliver(outputs)
            self._stats = engine.stats()
        self._apply_commands()
        engine.abort_request(list(engine.requests))
        self._deliver(engine.step())

    def _apply_commands(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if command[0] == "add":
                _, request_id, prompt, token_ids, params, on_output = command
                self._callbacks[request_id] = on_output
                try:
                    self.engine.add_request(token_ids, params, request_id=request_id)
                except ValueError as exc:
                    self._deliver([_error_output(request_id, prompt, token_ids, str(exc))])
                if isinstance(prompt, str) and request_id in self.engine.requests:
                    self.engine.requests[request_id].prompt = prompt
            elif command[0] == "abort":
                self.engine.abort_request(command[1])

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            callback = self._callbacks.get(out.request_id)
            if out.finished:
                self._callbacks.pop(out.request_id, None)
            if callback is None:
                continue
            try:
                callback(out)
            except Exception:  # a consumer's bug must not stop the engine
                log.exception("output callback for %s failed", out.request_id)

    def _fail_all(self, exc: Exception) -> list[RequestOutput]:
        engine = self.engine
        outputs = engine.fail_requests(list(engine.requests.values()), exc)
        return outputs


def _error_output(request_id: str, prompt, token_ids: list[int], message: str) -> RequestOutput:
    return RequestOutput(
        request_id=request_id,
        prompt=prompt if isinstance(prompt, str) else None,
        prompt_token_ids=token_ids,
        outputs=[CompletionOutput(0, "", [], finish_reason="error")],
        finished=True,
        error=message,
    )
