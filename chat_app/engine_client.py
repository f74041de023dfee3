"""The app's one door to the engine: builds prompts, starts and stops replies, routes streams.

The chat panes never touch the engine thread themselves. They hand this client a conversation
and a sink (themselves); the client turns the conversation into token ids with the model's chat
template, queues the request, and later gives each sink the updates of its own requests.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Protocol

from chat_app.bridge import OutputBridge, StreamUpdate
from chat_app.context_window import fit_chat
from chat_app.engine_api import ChatRequests, EngineThread, Tokenizer
from gpu.outputs import EngineStats
from gpu.sampling_params import SamplingParams


class EngineUnavailable(Exception):
    """The model is still loading, or failed to load (the message says which)."""


class ReplySink(Protocol):
    """Whoever shows a reply: receives that request's updates, in order, on the UI thread."""

    def on_stream_update(self, update: StreamUpdate) -> Awaitable[None]: ...


@dataclass(frozen=True)
class ReplyStarted:
    """A queued reply: its request id, and how many of the oldest turns the model can't see."""

    request_id: str
    dropped_turns: int


def _encode(tokenizer: Tokenizer, chat: list[dict[str, str]]) -> list[int]:
    return list(tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True))


class EngineClient:
    def __init__(self, bridge: OutputBridge) -> None:
        self._bridge = bridge
        self.thread: EngineThread | None = None
        self.load_error: str | None = None
        self.load_stage = ""  # what the engine's build is doing now, for the loading line
        self._sinks: dict[str, ReplySink] = {}
        self._ids = itertools.count(1)
        # A chat's first reply from this engine (after a restart, say) prefills its whole
        # history again, which takes seconds on a CPU: request id -> prompt tokens, until the
        # first token arrives, so the status bar can say so. Sinks that had a first token are
        # warm: the engine's prefix cache holds their chat.
        self._rereading: dict[str, int] = {}
        self._warm: weakref.WeakSet[ReplySink] = weakref.WeakSet()

    # -- life cycle -------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self.thread is not None

    @property
    def loading(self) -> bool:
        return self.thread is None and self.load_error is None

    @property
    def stopped(self) -> bool:
        """The engine ran and has stopped on its own (its process crashed or was killed):
        its replies have ended with an error; `detach` and a new engine bring it back."""
        return self.thread is not None and not getattr(self.thread, "is_alive", True)

    def detach(self) -> EngineThread | None:
        """Let go of the engine (for a restart): the client is loading again, and the old
        engine is the caller's to shut down."""
        thread, self.thread = self.thread, None
        self.load_error, self.load_stage = None, ""
        self._sinks.clear()
        return thread

    def attach(self, thread: EngineThread) -> None:
        """Take a freshly built engine thread (started by the app's loader thread)."""
        self.thread = thread

    def fail(self, message: str) -> None:
        self.load_error = message

    def report_progress(self, stage: str, done: int, total: int) -> None:
        """The engine build's progress callback (runs on the loading thread): the status bar
        shows it after "loading model…" ("compiling kernels 12/60")."""
        self.load_stage = f"{stage} {done}/{total}" if total else stage

    def shutdown(self, timeout: float = 5.0) -> None:
        """Abort every reply and stop the engine thread (idempotent)."""
        self._sinks.clear()
        self._rereading.clear()
        thread, self.thread = self.thread, None
        if thread is not None:
            thread.shutdown(timeout)

    def describe(self) -> str:
        """Model, device and KV capacity, for the status bar."""
        if self.thread is None:
            if self.load_error:
                return "model failed to load"
            return f"loading model… {self.load_stage}" if self.load_stage else "loading model…"
        engine = self.thread.engine
        if not engine.kv_capacity_tokens:  # a remote server: its model and endpoint
            return f"{engine.model_name} · {engine.device}"
        return f"{engine.model_name} · {engine.device} · KV {engine.kv_capacity_tokens:,} tok"

    def stats(self) -> EngineStats | None:
        return None if self.thread is None else self.thread.stats()

    # -- replies ----------------------------------------------------------------------------

    def start_reply(
        self, chat: list[dict[str, str]], params: SamplingParams, sink: ReplySink, label: str
    ) -> ReplyStarted:
        """Queue a reply to `chat`, its oldest turns dropped if it outgrew the context.

        Raises EngineUnavailable while there is no engine, and ValueError when the engine
        refuses the request (the system prompt and newest message alone exceed the context).
        """
        if self.thread is None:
            raise EngineUnavailable(self.load_error or "The model is still loading.")
        if self.stopped:
            raise EngineUnavailable("The engine stopped: restart it first.")
        if isinstance(self.thread, ChatRequests):  # a remote server applies its template
            request_id = self.thread.add_chat_request(
                chat, params, self._bridge.on_output, request_id=f"{label}-{next(self._ids)}"
            )
            self._sinks[request_id] = sink
            return ReplyStarted(request_id, 0)
        engine = self.thread.engine
        try:
            fitted = fit_chat(chat, lambda c: _encode(engine.tokenizer, c), engine.max_model_len)
        except Exception as error:  # a template may raise anything (raise_exception, jinja)
            raise ValueError(f"The chat template failed: {error}") from error
        request_id = f"{label}-{next(self._ids)}"
        request_id = self.thread.add_request(
            fitted.prompt_ids, params, self._bridge.on_output, request_id=request_id
        )
        self._sinks[request_id] = sink
        if sink not in self._warm and any(m["role"] == "assistant" for m in chat):
            self._rereading[request_id] = len(fitted.prompt_ids)
        return ReplyStarted(request_id, fitted.dropped_turns)

    def stop_reply(self, request_id: str) -> None:
        """Abort a reply; whatever the engine still sends for it is dropped."""
        self._sinks.pop(request_id, None)
        self._rereading.pop(request_id, None)
        if self.thread is not None:
            self.thread.abort(request_id)

    def rereading(self, sink: ReplySink) -> int | None:
        """The prompt tokens the engine is reading again for `sink`'s reply (a chat's first
        reply from this engine, before its first token), or None."""
        for request_id, tokens in self._rereading.items():
            if self._sinks.get(request_id) is sink:
                return tokens
        return None

    @property
    def num_rereading(self) -> int:
        return len(self._rereading)

    def take_updates(self) -> list[tuple[ReplySink, StreamUpdate]]:
        """The bridge's pending updates, each paired with the sink that asked for it."""
        routed = []
        for update in self._bridge.drain():
            sink = self._sinks.get(update.request_id)
            if sink is None:
                continue  # stopped, reset or closed: the UI has already moved on
            if update.num_tokens or update.text or update.finished:
                self._rereading.pop(update.request_id, None)
            if update.num_tokens or update.text:
                self._warm.add(sink)
            if update.finished:
                del self._sinks[update.request_id]
            routed.append((sink, update))
        return routed
