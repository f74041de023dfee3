"""`EngineCoreClient`: the engine core in a process of its own, behind EngineThread's contract.

    client = EngineCoreClient(model, "auto", EngineConfig(), progress=print)  # spawns, loads
    client.start()                                  # the receiver thread
    client.add_request(prompt_ids, params, on_output)  # outputs (DELTA) on the receiver thread
    client.abort(request_id); client.stats(); client.shutdown()

    with EngineCoreClient(device="cpu") as client:  # start() and shutdown() around the block
        print(client.submit("Hello", SamplingParams(max_tokens=16)).text())

The same calls as `gpu.engine_thread.EngineThread` (chat_app.engine_api's protocol), so the
app, `tinychat generate` and library code switch by building this instead. `on_output` runs on
the client's receiver thread, which takes every message the socket holds in one read
(FrameReader), unpickles them, detokenizes, checks stop strings (see request_state.py) and
calls each request's callback once for all of its new tokens; like the engine thread's, a
callback must not block. A receiver that fell behind (its process's UI thread held the GIL)
catches up in one pass instead of one step at a time, so the core's sends never back up.

If the core dies (a crash, a kill), every open request ends with finish_reason "error" and an
error that says the engine stopped; `is_alive` turns False, and a new client starts a new core.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from gpu.config import EngineConfig
from gpu.engine_core import protocol as p
from gpu.engine_core.request_state import RequestState
from gpu.engine_thread import RequestStream
from gpu.outputs import EngineStats, RequestOutput
from gpu.sampling_params import RequestOutputKind, SamplingParams

log = logging.getLogger(__name__)
OutputCallback = Callable[[RequestOutput], None]
ProgressFn = Callable[[str, int, int], None]


class EngineCoreError(RuntimeError):
    """The engine core stopped, or could not start."""


class ClientEngine:
    """The engine as the app sees it (chat_app.engine_api.Engine): its description, and the
    tokenizer, loaded in the client's process for chat templates and detokenizing."""

    def __init__(self, info: p.EngineInfo, tokenizer: Any, client: EngineCoreClient) -> None:
        self.tokenizer = tokenizer
        self.model_name = info.model_name
        self.device = info.device
        self.max_model_len = info.max_model_len
        self.kv_capacity_tokens = info.kv_capacity_tokens
        self.vocab_size = info.vocab_size
        self._client = client

    def stats(self) -> EngineStats:
        return self._client.stats()


class EngineCoreClient:
    def __init__(
        self,
        model: str | None = None,
        device: str = "auto",
        config: EngineConfig | None = None,
        *,
        progress: ProgressFn | None = None,
        log_path: str | None = None,
        entry: str = "gpu.engine_core.core",
    ) -> None:
        """Start the core (a fresh interpreter: never fork a process that may hold CUDA) and
        wait until its engine is built, forwarding the build's progress to `progress`. Raises
        what the build raised (a ModelLoadError reads as in-process). log_path: a file for the
        core's stdout and stderr (the app's screen must not get them); None: this process's.
        entry: the module whose main() runs in the new process (a stand-in core that speaks
        the same protocol, for bench app's synthetic runs)."""
        ours, theirs = socket.socketpair()
        death_r, self._death_w = os.pipe()  # the core sees EOF on death_r when we are gone
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # the folder that holds gpu/
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        log = open(log_path, "ab") if log_path else None  # noqa: SIM115 (closed below)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-c", f"from {entry} import main; main()"]
                + [str(theirs.fileno()), str(death_r)],
                pass_fds=(theirs.fileno(), death_r),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
            )
        finally:
            theirs.close()
            os.close(death_r)
            if log is not None:
                log.close()
        self._conn = Connection(ours.detach())
        # The kernel's parent-death signal follows the thread that started the core: only a
        # main thread lives as long as its process (the app starts the core from a loader).
        main_thread = threading.current_thread() is threading.main_thread()
        p.send(self._conn, (model, device, config or EngineConfig(), os.getpid(), main_thread))
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()  # guards _requests and _handles
        self._requests: dict[int, RequestState] = {}
        self._handles: dict[str, int] = {}
        self._ids = itertools.count()
        self._stats = EngineStats()
        self._stopping = False
        self._fatal: str | None = None
        self._closed = False  # the receiver has seen the core's end
        self._receiver = threading.Thread(target=self._receive, name="tinychat-core-receiver")
        self._receiver.daemon = True
        _live_clients.add(self)
        try:
            info, tokenizer = self._wait_until_ready(progress)
        except BaseException:
            self._kill()
            self._conn.close()
            os.close(self._death_w)
            raise
        self.engine = ClientEngine(info, tokenizer, self)

    def _wait_until_ready(self, progress: ProgressFn | None) -> tuple[p.EngineInfo, Any]:
        from weights import Tokenizer

        tokenizer = None
        while True:
            try:
                message = p.recv(self._conn)
            except (EOFError, OSError):
                raise EngineCoreError(f"the engine process {self._exit_description()} while "
                                      "loading the model") from None  # fmt: skip
            kind = message[0]
            if kind == p.PROGRESS:
                if progress is not None:
                    progress(*message[1:])
            elif kind == p.MODEL:
                tokenizer = Tokenizer.from_folder(message[1])  # while the core loads weights
            elif kind == p.READY:
                return message[1], tokenizer
            elif kind == p.LOAD_FAILED:
                raise message[1]

    # --- EngineThread's contract (any thread) ---------------------------------------------
    def start(self) -> None:
        self._receiver.start()

    def __enter__(self) -> EngineCoreClient:
        """`with EngineCoreClient(...) as client:` starts it, and shuts the core down after."""
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.shutdown()

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        on_output: OutputCallback,
        request_id: str | None = None,
    ) -> str:
        """Queue a request; its outputs (deltas) go to on_output on the receiver thread.

        A prompt that is empty or longer than the context raises ValueError here, at once."""
        if not self.is_alive:
            raise EngineCoreError(self._stopped_message())
        engine = self.engine
        if isinstance(prompt, str):
            token_ids = engine.tokenizer.encode(prompt, add_special_tokens=True)
        else:
            token_ids = [int(t) for t in prompt]
        if not token_ids:
            raise ValueError("the prompt is empty")
        if len(token_ids) >= engine.max_model_len:
            raise ValueError(
                f"the prompt is {len(token_ids)} tokens, but the context is "
                f"{engine.max_model_len} tokens (and the reply needs at least one more)"
            )
        handle = next(self._ids)
        request_id = request_id or f"req-{handle}"
        state = RequestState(
            request_id,
            prompt if isinstance(prompt, str) else None,
            token_ids,
            params,
            engine.tokenizer,
            on_output,
        )
        core_params = _core_params(params)
        with self._lock:
            if request_id in self._handles:
                raise ValueError(f"request id {request_id!r} is already in use")
            self._requests[handle] = state
            self._handles[request_id] = handle
        self._send((p.ADD, handle, token_ids, core_params))
        if self._closed:  # the core died since the check above: this request ends too
            self._fail_open(self._stopped_message())
        return request_id

    def submit(self, prompt: str | list[int], params: SamplingParams) -> RequestStream:
        """add_request with a RequestStream as the consumer."""
        stream = RequestStream()
        stream.request_id = self.add_request(prompt, params, stream.put)
        return stream

    def abort(self, request_id: str) -> None:
        """Stop a request; it ends with an "abort" output, as in-process."""
        with self._lock:
            handle = self._handles.get(request_id)
        if handle is not None:
            self._send((p.ABORT, [handle]))

    def stats(self) -> EngineStats:
        """The latest snapshot the core sent (with its steps, and whenever it goes idle)."""
        return self._stats

    def shutdown(self, timeout: float = 5.0) -> None:
        """Abort every request (each gets its final output), stop the core and the receiver."""
        if self._stopping:
            return
        self._stopping = True
        _live_clients.discard(self)
        self._send((p.SHUTDOWN,))
        if self._receiver.is_alive():
            self._receiver.join(timeout)
        if not self._wait(timeout):
            self._kill()
        self._fail_open("the engine was shut down")
        self._conn.close()
        os.close(self._death_w)

    @property
    def is_alive(self) -> bool:
        return (
            not self._stopping
            and not self._closed
            and self._fatal is None
            and self.process.poll() is None
        )

    @property
    def core_pid(self) -> int | None:
        return self.process.pid

    # --- the receiver thread --------------------------------------------------------------
    def _receive(self) -> None:
        reader = FrameReader(self._conn.fileno())
        try:
            while True:
                self._on_messages([pickle.loads(frame) for frame in reader.read_frames()])
        except (EOFError, OSError):
            pass  # the core has exited (or was killed)
        except Exception:  # a bug here must not leave requests hanging
            log.exception("the engine-core receiver failed")
        finally:
            self._closed = True
            self._fail_open(self._stopped_message())

    def _on_messages(self, messages: list[tuple]) -> None:
        """Everything that one read brought (one step's message or many), applied in order;
        then one output per request that changed, carrying all of its new tokens."""
        touched: dict[int, RequestState] = {}
        ended: list[int] = []  # met a stop string here: the core must stop them
        for message in messages:
            kind = message[0]
            if kind == p.STEP:
                self._on_step(message, touched, ended)
            elif kind == p.STATS:
                self._stats = p.stats_from_tuple(message[1])
            elif kind == p.FATAL:
                self._fatal = message[1]
        for state in touched.values():
            self._deliver(state)
        if ended:  # never block this thread on a send: the core may be blocked sending to it
            threading.Thread(target=self._send, args=((p.ABORT, ended),), daemon=True).start()

    def _on_step(self, message: tuple, touched: dict[int, RequestState], ended: list[int]) -> None:
        _, handles, tokens, finished, stats = message
        now = time.monotonic()
        requests = self._requests
        for handle, token in zip(handles, tokens, strict=True):
            state = requests.get(handle)
            if state is None or state.finished:
                continue  # aborted, or ended here on a stop string
            if state.add_token(token, now):
                ended.append(handle)
            touched[handle] = state
        for row in finished:
            state = requests.get(row[0])
            if state is None or state.finished:
                continue
            state.finish(*row[1:], now=now)
            touched[row[0]] = state
        for handle, state in touched.items():
            if state.finished and handle in requests:
                with self._lock:
                    del requests[handle]
                    self._handles.pop(state.request_id, None)
        if stats is not None:
            self._stats = p.stats_from_tuple(stats)

    def _deliver(self, state: RequestState) -> None:
        out = state.make_output()
        if out is None:
            return
        try:
            state.on_output(out)
        except Exception:  # a consumer's bug must not stop the others
            log.exception("output callback for %s failed", state.request_id)

    def _fail_open(self, message: str) -> None:
        """Every request still open ends with `message` as its error (what streamed stays)."""
        with self._lock:
            states = list(self._requests.values())
            self._requests.clear()
            self._handles.clear()
        for state in states:
            state.fail(message)
            self._deliver(state)

    # --- helpers --------------------------------------------------------------------------
    def _send(self, message: tuple) -> None:
        try:
            with self._send_lock:
                p.send(self._conn, message)
        except (OSError, ValueError):  # the core is gone: the receiver reports it
            pass

    def _stopped_message(self) -> str:
        if self._fatal is not None:
            return f"the engine stopped: {self._fatal}"
        if self._stopping:
            return "the engine was shut down"
        return f"the engine process {self._exit_description()}"

    def _exit_description(self) -> str:
        self._wait(1.0)
        code = self.process.returncode
        if code is None:
            return "stopped answering"
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            return f"was killed ({name})"
        return f"exited (status {code})"

    def _wait(self, timeout: float) -> bool:
        """Wait up to timeout seconds for the core to exit; True if it has."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def _kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self._wait(5.0)
        _live_clients.discard(self)


def _core_params(params: SamplingParams) -> SamplingParams:
    """`params` as the core takes them (no detokenizing, no stop strings: the client does
    those; DELTA outputs). A field-for-field copy: dataclasses.replace would validate the
    parameters again (__post_init__), 8-17 us of each request's admission against 1-2 us."""
    core = object.__new__(SamplingParams)
    fields = core.__dict__
    fields.update(params.__dict__)
    fields.update(detokenize=False, stop=None, _stop=(), output_kind=RequestOutputKind.DELTA)
    return core


class FrameReader:
    """Reads the core's messages (multiprocessing.Connection's frames: a 4-byte big-endian
    length, or -1 and an 8-byte one, then the bytes) many at a time.

    Connection.recv_bytes makes two reads a message, and each read gives up the GIL: while
    the UI thread is busy, getting it back takes up to the interpreter's switch interval
    (5 ms), so a receiver that reads a message at a time keeps up with at most ~100 messages
    a second, falls behind a core that steps every 1.5 ms, and its socket fills until the
    core's sends block. One read here takes everything the socket holds (up to 1 MiB), and
    every whole message in it is handled under one hold of the GIL."""

    CHUNK = 1 << 20

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._chunk = bytearray(self.CHUNK)  # reused: a fresh 1 MiB bytes a read would cost
        self._view = memoryview(self._chunk)
        self._buffer = bytearray()

    def read_frames(self) -> list[bytes]:
        """The whole frames that have arrived (at least one; blocks until then). Raises
        EOFError when the core has closed its end."""
        frames: list[bytes] = []
        while not frames:
            n = os.readv(self._fd, [self._chunk])
            if not n:
                raise EOFError
            self._buffer += self._view[:n]
            frames = self._take_frames()
        return frames

    def _take_frames(self) -> list[bytes]:
        buffer, start, frames = self._buffer, 0, []
        while len(buffer) - start >= 4:
            (size,) = struct.unpack_from("!i", buffer, start)
            head = 4
            if size == -1:
                if len(buffer) - start < 12:
                    break
                (size,) = struct.unpack_from("!Q", buffer, start + 4)
                head = 12
            if len(buffer) - start < head + size:
                break
            frames.append(bytes(buffer[start + head : start + head + size]))
            start += head + size
        del buffer[:start]
        return frames


_live_clients: weakref.WeakSet[EngineCoreClient] = weakref.WeakSet()


@atexit.register
def _stop_live_cores() -> None:
    """A program that ends without shutting its client down stops its core cleanly here (the
    core would notice the exit anyway, through its death pipe)."""
    for client in list(_live_clients):
        client.shutdown(timeout=2.0)
