"""The app as a client of any OpenAI-compatible server (`tinychat --connect URL`).

`RemoteEngineThread` keeps the app's engine contract (chat_app/engine_api.py): requests in,
delta `RequestOutput`s out through `on_output`, `abort`, `stats`, `shutdown`, so the tabs,
settings, history, export and every shortcut work as they do on the local engine. Two things
differ, and the app asks for them by name: the server applies its own chat template, so the
app sends the conversation itself (`add_chat_request`, no tokenizer here), and the status bar
shows the endpoint where the device would be.

The HTTP side is httpx (the client the `openai` package is built on) on one asyncio loop in a
background thread: each reply is a task streaming server-sent events, so `abort` cancels the
task, which closes the connection, which the server takes as the abort. Sampling settings go
out under OpenAI's names; vLLM's extras (top_k, min_p, repetition_penalty, ...) are sent only
when they differ from "off", and a server that refuses them (OpenAI's own answers 400) gets the
request again without them, once, and never again for this connection. A chat that outgrew
the server's context (its 400 says so) goes again without its oldest turns, as the local
engine's prompt drops them (never the system prompt or the newest message).

While a server publishes Prometheus metrics at /metrics (tinychat's and vLLM's names), the
status bar's engine line shows the server's running and waiting requests, KV-cache use and
prefix-cache hit rate, polled every second.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httpx

from gpu.outputs import CompletionOutput, EngineStats, RequestMetrics, RequestOutput
from gpu.sampling_params import SamplingParams

OutputCallback = Callable[[RequestOutput], None]
METRICS_INTERVAL_S = 1.0
_EXTRAS_OFF = {
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "min_tokens": 0,
    "ignore_eos": False,
}
_METRIC = re.compile(r"^(?:tinychat|vllm):(\w+?)(?:_total)?(?:\{[^}]*\})? ([-+0-9.eE]+|NaN)$")


class RemoteError(RuntimeError):
    """The server could not be reached or refused the connection (shown as the load error)."""


def base_url(url: str) -> str:
    """The API's base: `http://host:8000` and `http://host:8000/v1/` both mean .../v1."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    if urlsplit(url).path in ("", "/"):
        url += "/v1"
    return url


class RemoteEngine:
    """What the status bar and the export read (engine_api.Engine); no tokenizer: the server
    applies its chat template."""

    tokenizer = None
    kv_capacity_tokens = 0

    def __init__(self, model_name: str, url: str, max_model_len: int, thread: Any) -> None:
        self.model_name = model_name
        self.device = url  # the status bar shows it where a local engine shows its device
        self.max_model_len = max_model_len
        self._thread = thread

    def stats(self) -> EngineStats:
        return self._thread.stats()


def connect(url: str, api_key: str | None = None, model: str | None = None) -> RemoteEngineThread:
    """Ask the server for its models (GET /models) and pick `model` (default: the first).
    Slow (a network round trip): the app calls it off the UI thread, as it loads a model."""
    base = base_url(url)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{base}/models", headers=headers, timeout=30)
    except httpx.HTTPError as error:
        raise RemoteError(f"cannot reach {base}: {error}") from None
    if response.status_code != 200:
        raise RemoteError(f"{base}/models answered {response.status_code}: {_message(response)}")
    cards = response.json().get("data") or []
    ids = [card.get("id") for card in cards]
    if model is None:
        if not ids:
            raise RemoteError(f"{base} serves no model")
        model = ids[0]
    elif ids and model not in ids:
        raise RemoteError(f"{base} does not serve {model!r} (it serves {', '.join(ids)})")
    card = cards[ids.index(model)] if model in ids else {}
    max_model_len = int(card.get("max_model_len") or 0)
    return RemoteEngineThread(base, model, api_key, max_model_len)


class RemoteEngineThread:
    """Replies streamed from the server, on an asyncio loop in a thread of its own."""

    def __init__(
        self, base: str, model: str, api_key: str | None = None, max_model_len: int = 0
    ) -> None:
        self.base = base
        self.model = model
        self.engine = RemoteEngine(model, base, max_model_len, self)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._send_extras = True
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="tinychat-remote", daemon=True)
        self._tasks: dict[str, asyncio.Task] = {}  # touched on the loop only
        self._token_times: deque[tuple[float, int]] = deque(maxlen=4096)
        self._server: dict[str, float] = {}  # the server's own gauges, from /metrics
        self._client: httpx.AsyncClient | None = None

    # -- life cycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._client = httpx.AsyncClient(
            headers=self._headers, timeout=httpx.Timeout(30, read=None)
        )
        poller = self._loop.create_task(self._poll_metrics())
        try:
            self._loop.run_forever()
        finally:
            poller.cancel()
            pending = [*self._tasks.values(), poller]
            self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self._loop.run_until_complete(self._client.aclose())
            self._loop.close()

    def shutdown(self, timeout: float = 5.0) -> None:
        """Abort every reply (each gets its final output) and stop the loop."""
        if not self._thread.is_alive():
            return
        self._loop.call_soon_threadsafe(self._stop)
        self._thread.join(timeout)

    def _stop(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        self._loop.stop()

    # -- requests (any thread) --------------------------------------------------------------

    def add_chat_request(
        self,
        messages: list[dict[str, str]],
        params: SamplingParams,
        on_output: OutputCallback,
        request_id: str | None = None,
    ) -> str:
        """Stream a reply to `messages` (the server applies its chat template)."""
        return self._submit(
            "/chat/completions", {"messages": messages}, params, on_output, request_id
        )

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        on_output: OutputCallback,
        request_id: str | None = None,
    ) -> str:
        """A plain completion of `prompt` (text or token ids)."""
        return self._submit("/completions", {"prompt": prompt}, params, on_output, request_id)

    def _submit(self, path, body, params, on_output, request_id) -> str:
        if not self._thread.is_alive():
            raise RuntimeError("the connection is shut down")
        request_id = request_id or f"remote-{uuid.uuid4().hex}"
        self._loop.call_soon_threadsafe(self._begin, path, body, params, on_output, request_id)
        return request_id

    def abort(self, request_id: str) -> None:
        self._loop.call_soon_threadsafe(self._cancel, request_id)

    def stats(self) -> EngineStats:
        now = time.monotonic()
        recent = [n for t, n in list(self._token_times) if now - t <= 1.0]
        server = self._server
        used, hits = server.get("kv_cache_usage_perc"), server.get("prefix_cache_hit_rate")
        return EngineStats(
            num_running=int(server.get("num_requests_running", len(self._tasks))),
            num_waiting=int(server.get("num_requests_waiting", 0)),
            kv_blocks_used=round(1000 * used) if used is not None else 0,
            kv_blocks_total=1000 if used is not None else 0,
            prefix_cache_queries=1000 if hits is not None else 0,
            prefix_cache_hits=round(1000 * hits) if hits is not None else 0,
            tokens_per_s=float(sum(recent)),
        )

    # -- on the loop ------------------------------------------------------------------------

    def _begin(self, path, body, params, on_output, request_id) -> None:
        task = self._loop.create_task(self._stream(path, body, params, on_output, request_id))
        self._tasks[request_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(request_id, None))

    def _cancel(self, request_id: str) -> None:
        task = self._tasks.get(request_id)
        if task is not None:
            task.cancel()

    async def _stream(self, path, body, params, on_output, request_id) -> None:
        metrics = RequestMetrics(arrival_time=time.monotonic())
        reply = _Reply(request_id, metrics, on_output)
        try:
            extras = self._send_extras
            status, message = await self._post(path, body, params, extras, reply)
            if status == 400 and extras and _extras(params) and not _too_long(message):
                # Perhaps the server refuses vLLM's extras: once without them.
                extras = False
                status, message = await self._post(path, body, params, extras, reply)
                if status == 200:
                    self._send_extras = False
            while status == 400 and _too_long(message) and (shorter := _drop_oldest_turn(body)):
                # The chat outgrew the server's context: its oldest turns leave the prompt,
                # as the local engine's do (chat_app/context_window.py).
                body = shorter
                status, message = await self._post(path, body, params, extras, reply)
            if status != 200:
                reply.finish("error", f"the server answered {status}: {message}")
        except asyncio.CancelledError:
            reply.finish("abort")
            raise
        except httpx.HTTPError as error:
            reply.finish("error", f"the connection to {self.base} failed: {error}")
        except Exception as error:  # a server that answers something else than SSE
            reply.finish("error", f"{type(error).__name__}: {error}")
        else:
            reply.finish(reply.finish_reason or "stop")

    async def _post(self, path, body, params, extras: bool, reply: _Reply) -> tuple[int, str]:
        """One streamed request; (status, error message). A 200's events go to `reply`."""
        assert self._client is not None
        payload = {
            "model": self.model,
            **body,
            **_sampling(params, extras),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with self._client.stream("POST", self.base + path, json=payload) as response:
            if response.status_code != 200:
                await response.aread()
                return response.status_code, _message(response)
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    reply.finish_reason = "error"
                    reply.error = (event["error"] or {}).get("message", "the server failed")
                    break
                count = reply.event(event)
                if count:
                    self._token_times.append((time.monotonic(), count))
        return 200, ""

    async def _poll_metrics(self) -> None:
        """The server's gauges for the status bar, while it publishes them."""
        assert self._client is not None
        url = self.base.rsplit("/v1", 1)[0] + "/metrics"
        while True:
            try:
                response = await self._client.get(url, timeout=5)
            except httpx.HTTPError:
                response = None
            if response is None or response.status_code != 200:
                self._server = {}
                await asyncio.sleep(10 * METRICS_INTERVAL_S)
                continue
            self._server = parse_metrics(response.text)
            await asyncio.sleep(METRICS_INTERVAL_S)


class _Reply:
    """One reply's state: turns SSE events into delta RequestOutputs for the app."""

    def __init__(self, request_id: str, metrics: RequestMetrics, on_output: OutputCallback):
        self.request_id = request_id
        self.metrics = metrics
        self._on_output = on_output
        self.finish_reason: str | None = None
        self.error: str | None = None
        self._finished = False

    def event(self, event: dict[str, Any]) -> int:
        """Deliver one chunk's text; returns how many tokens it brought (chunks, until the
        usage at the end gives the server's count)."""
        usage = event.get("usage")
        if usage and usage.get("completion_tokens") is not None:
            self.metrics.num_generated_tokens = int(usage["completion_tokens"])
            self.metrics.num_prompt_tokens = int(usage.get("prompt_tokens") or 0)
            details = usage.get("prompt_tokens_details") or {}
            self.metrics.num_cached_tokens = int(details.get("cached_tokens") or 0)
        text, count = "", 0
        for choice in event.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
            text += piece
            count += 1 if piece else 0
            if choice.get("finish_reason"):
                self.finish_reason = "length" if choice["finish_reason"] == "length" else "stop"
        if text:
            now = time.monotonic()
            m = self.metrics
            m.first_token_time = m.first_token_time or now
            m.last_token_time = now
            m.num_generated_tokens += count
            self._send(text, count, finished=False)
        return count

    def finish(self, reason: str, error: str | None = None) -> None:
        if self._finished:
            return
        self._finished = True
        self.metrics.finished_time = time.monotonic()
        self.error = error or self.error
        self._send("", 0, finished=True, reason=reason)

    def _send(self, text: str, count: int, finished: bool, reason: str | None = None) -> None:
        completion = CompletionOutput(0, text, [0] * count, finish_reason=reason)
        self._on_output(
            RequestOutput(
                self.request_id,
                None,
                [],
                [completion],
                finished,
                metrics=self.metrics,
                error=self.error if finished else None,
            )
        )


def _extras(params: SamplingParams) -> dict[str, Any]:
    values = {name: getattr(params, name) for name in _EXTRAS_OFF}
    return {k: v for k, v in values.items() if v != _EXTRAS_OFF[k]}


def _sampling(params: SamplingParams, extras: bool) -> dict[str, Any]:
    """SamplingParams under OpenAI's names; vLLM's extras only when on (and allowed)."""
    body: dict[str, Any] = {"temperature": params.temperature, "top_p": params.top_p}
    if params.max_tokens is not None:
        body["max_tokens"] = params.max_tokens
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop_strings:
        body["stop"] = list(params.stop_strings)
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(params, name):
            body[name] = getattr(params, name)
    if extras:
        body.update(_extras(params))
    return body


def _too_long(message: str) -> bool:
    """The server's words for a prompt longer than its context (OpenAI, vLLM and tinychat say
    "maximum context length", llama.cpp "context size")."""
    return "context length" in message or "context size" in message


def _drop_oldest_turn(body: dict[str, Any]) -> dict[str, Any] | None:
    """The chat without its oldest turn (a user message and the reply to it), never the
    system prompt or the newest message; None when nothing is left to drop."""
    messages = body.get("messages")
    if not messages:
        return None
    first = next((i for i, m in enumerate(messages) if m["role"] != "system"), len(messages))
    end = first + 1
    while end < len(messages) - 1 and messages[end]["role"] == "assistant":
        end += 1
    if end >= len(messages):
        return None
    return {**body, "messages": messages[:first] + messages[end:]}


def _message(response: httpx.Response) -> str:
    """The server's own words for an error (OpenAI's shape), else the body's start."""
    try:
        error = response.json().get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
    except (ValueError, AttributeError):
        pass
    return response.text[:200] or response.reason_phrase


def parse_metrics(text: str) -> dict[str, float]:
    """tinychat's or vLLM's gauges from Prometheus text (vLLM's old KV name included)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = _METRIC.match(line)
        if match:
            values[match.group(1)] = float(match.group(2))
    if "gpu_cache_usage_perc" in values:
        values.setdefault("kv_cache_usage_perc", values["gpu_cache_usage_perc"])
    return values
