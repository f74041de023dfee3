"""A deterministic stand-in for the engine, for tests and for working on the UI without a model.

`FakeEngineThread(FakeEngine())` honours the same contract as `gpu.engine_thread.EngineThread`
(see `chat_app.engine_api`): a real background thread, delta outputs delivered through
`on_output` on that thread, `abort`, `stats`, `shutdown`, and a ValueError for a prompt longer
than the context. Replies echo the last user message, one word per token, so a test can tell
which reply belongs to which question. Continuous batching, KV blocks and the prefix cache are
imitated just enough for the status bar and for tests of reset releasing blocks.

With `manual=True` the thread runs only the steps a test allows (`allow_steps`), and with
`step_time` set the engine's clock advances by exactly that much per step: together they make
metrics such as time to first token and tokens/s exact, for snapshot tests.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import itertools
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import events

from gpu.outputs import (
    CompletionOutput,
    EngineStats,
    RequestMetrics,
    RequestOutput,
    StepStats,
)
from gpu.sampling_params import SamplingParams

if TYPE_CHECKING:
    from textual.pilot import Pilot

    from chat_app.app import TinyChatApp

BLOCK_SIZE = 16
FILLER = (
    "Every word of this reply is one token from a deterministic fake engine, which streams "
    "it to the tab that asked while other tabs stream theirs."
).split()
FAIL_MARKER = "[fail]"  # a user message containing this makes the request fail mid-reply


class FakeTokenizer:
    """One token per character, and a ChatML chat template."""

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)

    def apply_chat_template(
        self,
        messages: list[dict[str, str]],
        add_generation_prompt: bool = True,
        tokenize: bool = True,
        **_: object,
    ) -> list[int] | str:
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        if add_generation_prompt:
            text += "<|im_start|>assistant\n"
        return self.encode(text) if tokenize else text


def last_user_message(prompt: str) -> str:
    """The last user turn in a ChatML prompt."""
    turns = re.findall(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", prompt, flags=re.S)
    return turns[-1] if turns else prompt


@dataclass
class _Request:
    id: str
    prompt_ids: list[int]
    params: SamplingParams
    pieces: list[str]  # the reply, one token each
    metrics: RequestMetrics
    fail: bool = False
    generated: list[str] = field(default_factory=list)
    aborted: bool = False


class FakeEngine:
    """The `LLMEngine` side: model description, tokenizer, stats, and the step itself."""

    def __init__(
        self,
        *,
        model_name: str = "fake-echo",
        max_model_len: int = 4096,
        num_kv_blocks: int = 512,
        max_num_seqs: int = 8,
        reply_words: int = 8,
        reply: Callable[[str], str] | None = None,
        step_time: float | None = None,
    ) -> None:
        self.tokenizer = FakeTokenizer()
        self.model_name = model_name
        self.device = "cpu"
        self.max_model_len = max_model_len
        self.num_kv_blocks = num_kv_blocks
        self.kv_capacity_tokens = num_kv_blocks * BLOCK_SIZE
        self.max_num_seqs = max_num_seqs
        self.reply_words = reply_words
        self._reply = reply
        self._step_time = step_time
        self._now = 1000.0  # the virtual clock, when step_time is set
        self._waiting: deque[_Request] = deque()
        self._running: list[_Request] = []
        self._cached_blocks: set[bytes] = set()
        self._prefix_queries = 0
        self._prefix_hits = 0
        self._recent_tokens: deque[tuple[float, int]] = deque()
        self._last_step = StepStats()
        self.num_steps = 0
        self.requests: list[tuple[str, str, SamplingParams]] = []  # (id, prompt, params)

    # -- what the engine thread calls -------------------------------------------------------

    def clock(self) -> float:
        return self._now if self._step_time is not None else time.monotonic()

    def reply_for(self, prompt: str) -> str:
        if self._reply is not None:
            return self._reply(prompt)
        message = " ".join(last_user_message(prompt).split())
        return " ".join([f"You said: **{message}**."] + FILLER[: self.reply_words])

    def add_request(self, request_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be SamplingParams, got {type(params).__name__}")
        if len(prompt_ids) >= self.max_model_len:
            raise ValueError(
                f"The prompt is {len(prompt_ids)} tokens long, longer than the model's "
                f"context of {self.max_model_len} tokens."
            )
        prompt = self.tokenizer.decode(prompt_ids)
        self.requests.append((request_id, prompt, params))
        pieces = re.findall(r"\s*\S+", self.reply_for(prompt))
        metrics = RequestMetrics(arrival_time=self.clock(), num_prompt_tokens=len(prompt_ids))
        fail = FAIL_MARKER in last_user_message(prompt)
        self._waiting.append(_Request(request_id, prompt_ids, params, pieces, metrics, fail))

    def abort(self, request_id: str) -> None:
        for request in itertools.chain(self._waiting, self._running):
            if request.id == request_id:
                request.aborted = True

    def has_unfinished(self) -> bool:
        return bool(self._waiting or self._running)

    def request_ids(self) -> list[str]:
        return [r.id for r in itertools.chain(self._waiting, self._running)]

    def step(self) -> list[RequestOutput]:
        """One engine step: admit waiting requests, then one token for each running one."""
        if self._step_time is not None:
            self._now += self._step_time
        now = self.clock()
        outputs = [self._finish(r, "abort") for r in self._waiting if r.aborted]
        self._waiting = deque(r for r in self._waiting if not r.aborted)
        prefill = 0
        while self._waiting and len(self._running) < self.max_num_seqs:
            request = self._waiting.popleft()
            self._admit(request, now)
            prefill += len(request.prompt_ids) - request.metrics.num_cached_tokens
            self._running.append(request)
        still_running = []
        for request in self._running:
            output = self._advance(request, now)
            outputs.append(output)
            if not output.finished:
                still_running.append(request)
        self._running = still_running
        decoded = sum(1 for o in outputs if o.outputs[0].token_ids)
        self._recent_tokens.append((now, decoded))
        self._last_step = StepStats(len(outputs), prefill, decoded, self._step_time or 0.0)
        self.num_steps += 1
        return outputs

    def stats(self) -> EngineStats:
        now = self.clock()
        while self._recent_tokens and self._recent_tokens[0][0] < now - 1.0:
            self._recent_tokens.popleft()
        used = sum(
            -(-(len(r.prompt_ids) + len("".join(r.generated))) // BLOCK_SIZE) for r in self._running
        )
        return EngineStats(
            num_running=len(self._running),
            num_waiting=len(self._waiting),
            kv_blocks_used=used,
            kv_blocks_total=self.num_kv_blocks,
            prefix_cache_queries=self._prefix_queries,
            prefix_cache_hits=self._prefix_hits,
            tokens_per_s=float(sum(n for _, n in self._recent_tokens)),
            last_step=self._last_step,
        )

    # -- inside a step ----------------------------------------------------------------------

    def _admit(self, request: _Request, now: float) -> None:
        request.metrics.first_scheduled_time = now
        hits = 0
        for digest in _block_hashes(request.prompt_ids):
            if digest not in self._cached_blocks:
                break
            hits += BLOCK_SIZE
        request.metrics.num_cached_tokens = hits
        self._prefix_queries += len(request.prompt_ids)
        self._prefix_hits += hits

    def _advance(self, request: _Request, now: float) -> RequestOutput:
        if request.aborted:
            return self._finish(request, "abort")
        piece = request.pieces[len(request.generated)]
        request.generated.append(piece)
        metrics = request.metrics
        metrics.num_generated_tokens += 1
        metrics.first_token_time = metrics.first_token_time or now
        metrics.last_token_time = now
        n = len(request.generated)
        reason = None
        if request.fail and n == 2:
            return self._finish(request, "error", piece, "fake engine failure (as asked)")
        if n == len(request.pieces):
            reason = "stop"
        elif request.params.max_tokens is not None and n >= request.params.max_tokens:
            reason = "length"
        if reason is not None:
            return self._finish(request, reason, piece)
        return _output(request, piece, None)

    def _finish(
        self, request: _Request, reason: str, piece: str = "", error: str | None = None
    ) -> RequestOutput:
        request.metrics.finished_time = self.clock()
        ids = request.prompt_ids + self.tokenizer.encode("".join(request.generated))
        self._cached_blocks.update(_block_hashes(ids))
        return _output(request, piece, reason, error)


def _output(
    request: _Request, piece: str, reason: str | None, error: str | None = None
) -> RequestOutput:
    completion = CompletionOutput(0, piece, [len(request.generated)] if piece else [], reason)
    return RequestOutput(
        request.id,
        None,
        request.prompt_ids,
        [completion],
        finished=reason is not None,
        metrics=request.metrics,
        error=error,
        num_cached_tokens=request.metrics.num_cached_tokens,
    )


def _block_hashes(ids: list[int]) -> list[bytes]:
    """Chained hashes of the full blocks of `ids`, as a prefix cache keys them."""
    digests, previous = [], b""
    for start in range(0, len(ids) - BLOCK_SIZE + 1, BLOCK_SIZE):
        block = ",".join(map(str, ids[start : start + BLOCK_SIZE])).encode()
        previous = hashlib.blake2b(previous + block, digest_size=16).digest()
        digests.append(previous)
    return digests


class FakeEngineThread:
    """`EngineThread` over a FakeEngine: the same calls, the same threading."""

    def __init__(
        self, engine: FakeEngine | None = None, *, step_delay: float = 0.002, manual: bool = False
    ) -> None:
        self.engine = engine or FakeEngine()
        self._step_delay = step_delay
        self._budget: int | None = 0 if manual else None  # steps allowed; None: unlimited
        self._callbacks: dict[str, Callable[[RequestOutput], None]] = {}
        self._cond = threading.Condition()
        self._stopping = False
        self._ids = itertools.count(1)
        self._thread = threading.Thread(target=self._loop, name="fake-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        on_output: Callable[[RequestOutput], None],
        request_id: str | None = None,
    ) -> str:
        ids = self.engine.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        request_id = request_id or f"fake-{next(self._ids)}"
        with self._cond:
            self.engine.add_request(request_id, ids, params)
            self._callbacks[request_id] = on_output
            self._cond.notify_all()
        return request_id

    def abort(self, request_id: str) -> None:
        with self._cond:
            self.engine.abort(request_id)
            self._cond.notify_all()

    def stats(self) -> EngineStats:
        with self._cond:
            return self.engine.stats()

    def shutdown(self, timeout: float = 5.0) -> None:
        with self._cond:
            for request_id in self.engine.request_ids():
                self.engine.abort(request_id)
            self._stopping = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # -- for tests --------------------------------------------------------------------------

    def allow_steps(self, n: int) -> None:
        """Manual mode: let the thread run `n` more steps."""
        with self._cond:
            self._budget = (self._budget or 0) + n
            self._cond.notify_all()

    def hold(self) -> None:
        """Manual mode: take back the steps allowed but not yet run."""
        with self._cond:
            self._budget = 0

    def wait_idle(self, timeout: float = 5.0) -> bool:
        """Wait until no request is left (in manual mode, only allowed steps run)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.engine.has_unfinished() or self._callbacks:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
        return True

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._can_step():
                    if self._stopping:
                        return
                    self._cond.wait()
                outputs = self.engine.step()
                if self._budget is not None and not self._stopping:
                    self._budget -= 1
                delivery = [(self._callbacks.get(o.request_id), o) for o in outputs]
            for callback, output in delivery:  # outside the lock, like the real engine
                if callback is not None:
                    callback(output)
            with self._cond:
                for output in outputs:
                    if output.finished:
                        self._callbacks.pop(output.request_id, None)
                self._cond.notify_all()  # wake wait_idle
            if self._step_delay:
                time.sleep(self._step_delay)

    def _can_step(self) -> bool:
        budget_ok = self._budget is None or self._budget > 0 or self._stopping
        return self.engine.has_unfinished() and budget_ok


# -- helpers for Pilot tests ------------------------------------------------------------------


def async_test(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test with asyncio.run: Pilot tests without an asyncio pytest plugin."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


async def wait_until(
    pilot: Pilot[object], condition: Callable[[], bool], what: str, timeout: float = 10.0
) -> None:
    """Let the app run until `condition()` holds (the engine thread works meanwhile)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.01)


async def type_text(pilot: Pilot[object], text: str) -> None:
    """Type into the focused widget, a key per character (newlines with Ctrl+J)."""
    await pilot.press(*("ctrl+j" if c == "\n" else c for c in text))


async def paste_text(pilot: Pilot[object], text: str) -> None:
    """Paste, as a terminal's bracketed paste does: the app hands it to the focused widget.

    One event instead of a key per character (Pilot's `press` costs tens of ms a key).
    """
    pilot.app.post_message(events.Paste(text))
    await pilot.pause()


def fake_app(
    folder: Path,
    engine: FakeEngine | None = None,
    *,
    manual: bool = False,
    step_delay: float = 0.002,
    **app_options: Any,
) -> tuple[TinyChatApp, FakeEngineThread]:
    """A TinyChatApp on a fake engine, keeping its history (and exports) in `folder`."""
    from chat_app.app import TinyChatApp
    from chat_app.history import HistoryStore

    thread = FakeEngineThread(engine or FakeEngine(), manual=manual, step_delay=step_delay)
    app_options.setdefault("export_dir", folder / "exports")
    app = TinyChatApp(lambda: thread, HistoryStore.open(folder / "history.db"), **app_options)
    app.animation_level = "none"  # tab underlines would take 0.3 s to slide at every switch
    return app, thread


async def open_tab(pilot: Pilot[object], key: str = "ctrl+n") -> None:
    """Press the new-tab key and wait until the new tab is shown with its input focused."""
    screen = pilot.app.chat_screen  # type: ignore[attr-defined]
    before = len(screen.panes)
    await pilot.press(key)
    await wait_until(
        pilot,
        lambda: (
            len(screen.panes) == before + 1
            and screen.active_pane is screen.panes[-1]
            and screen.active_pane.input.has_focus
        ),
        "the new tab",
    )
