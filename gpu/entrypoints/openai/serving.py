"""What chat and completions share: the request's checks and sampling parameters, the engine
stream with its metrics, usage, and the server-sent events around it.

A request is checked whole before it reaches the engine (model name, what is not supported,
the context length), so every refusal is a 4xx with a reason and the engine never sees it.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from gpu.entrypoints.openai.async_engine import AsyncEngine
from gpu.entrypoints.openai.metrics import ServerMetrics
from gpu.entrypoints.openai.protocol import OpenAIError, _SamplingRequest
from gpu.outputs import RequestOutput
from gpu.sampling_params import RequestOutputKind, SamplingParams

SSE_DONE = b"data: [DONE]\n\n"
# json.dumps with any option builds a JSONEncoder per call (~5 us): the events share one.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def sse(payload: dict[str, Any]) -> bytes:
    """One server-sent event carrying a JSON object."""
    return b"data: " + _ENCODER.encode(payload).encode() + b"\n\n"


def sse_template(payload: dict[str, Any], *paths: tuple[Any, ...]) -> Callable[..., bytes]:
    """The hot path's event, one per stream per engine step: `payload` is serialized once
    with a placeholder at each path (keys and indexes), and each call serializes only the
    values put there (a third of the time of serializing the whole object every event). The
    bytes are those `sse(payload)` would give with the values in place."""
    marks = [f"\x00{i}\x00" for i in range(len(paths))]
    for path, mark in zip(paths, marks, strict=True):
        node: Any = payload
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = mark
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    parts = []
    for mark in marks:
        before, text = text.split(json.dumps(mark), 1)
        parts.append(before.encode())
    head, tail = b"data: " + parts[0], text.encode() + b"\n\n"
    encode = _ENCODER.encode
    if len(paths) == 1:
        return lambda value: head + encode(value).encode() + tail
    middles = parts[1:]

    def event(*values: Any) -> bytes:
        out = [head, encode(values[0]).encode()]
        for middle, value in zip(middles, values[1:], strict=True):
            out.append(middle)
            out.append(encode(value).encode())
        out.append(tail)
        return b"".join(out)

    return event


class OpenAIServing:
    """The engine, the served model's name, and the metrics, as both endpoints need them."""

    def __init__(self, engine: AsyncEngine, model_name: str, metrics: ServerMetrics) -> None:
        self.engine = engine
        self.model_name = model_name
        self.metrics = metrics

    # -- checks -----------------------------------------------------------------------------

    def check_model(self, request: _SamplingRequest) -> None:
        if request.model is not None and request.model != self.model_name:
            raise OpenAIError(
                f"The model `{request.model}` does not exist (this server serves "
                f"`{self.model_name}`).",
                404,
                param="model",
                code="model_not_found",
            )

    @staticmethod
    def refuse(feature: str, param: str) -> OpenAIError:
        return OpenAIError(f"{feature} is not supported by tinychat serve.", param=param)

    def check_common(self, request: _SamplingRequest) -> None:
        """The model, and the fields both endpoints accept but do not serve."""
        self.check_model(request)
        if request.n != 1:
            raise self.refuse("n other than 1 (several choices per request)", "n")
        if request.logprobs not in (None, False, 0):
            raise self.refuse("logprobs", "logprobs")
        if request.logit_bias:
            raise self.refuse("logit_bias", "logit_bias")

    def sampling_params(
        self, request: _SamplingRequest, prompt_len: int, max_tokens: int | None
    ) -> SamplingParams:
        """The engine's parameters; 400 for a value it refuses, or for a prompt that leaves
        no room in the context for a reply (OpenAI's words, with the lengths). A max_tokens
        beyond what the context leaves is cut to it (the reply ends with "length"), as the
        engine does for the app: a chat near the end of the context gets a shorter reply,
        not an error (llama.cpp's server does the same; OpenAI's and vLLM's answer 400)."""
        context = self.engine.engine.max_model_len
        if prompt_len >= context:
            raise OpenAIError(
                f"This model's maximum context length is {context} tokens. However, your "
                f"prompt is {prompt_len} tokens, which leaves no room for a reply. Please "
                "reduce the length of the prompt.",
                param="messages" if hasattr(request, "messages") else "prompt",
                code="context_length_exceeded",
            )
        if max_tokens is not None:
            max_tokens = min(max_tokens, context - prompt_len)
        values: dict[str, Any] = {
            "temperature": 1.0 if request.temperature is None else request.temperature,
            "top_p": 1.0 if request.top_p is None else request.top_p,
            "top_k": request.top_k or 0,
            "min_p": request.min_p or 0.0,
            "repetition_penalty": request.repetition_penalty or 1.0,
            "presence_penalty": request.presence_penalty,
            "frequency_penalty": request.frequency_penalty,
            "seed": request.seed,
            "max_tokens": max_tokens,
            "min_tokens": request.min_tokens,
            "stop": request.stop,
            "stop_token_ids": request.stop_token_ids,
            "ignore_eos": request.ignore_eos,
            "output_kind": RequestOutputKind.DELTA,
        }
        try:
            return SamplingParams(**values)
        except (ValueError, TypeError) as error:
            raise OpenAIError(str(error)) from None

    # -- the engine stream ------------------------------------------------------------------

    async def outputs(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str, usage: Usage
    ) -> AsyncIterator[list[RequestOutput]]:
        """The engine's outputs for one request, timed into the metrics and counted into
        `usage`; leaving early aborts the request."""
        timer = RequestTimer(self.metrics, usage, len(prompt_ids))
        try:
            async with aclosing(self.engine.generate(prompt_ids, params, request_id)) as stream:
                async for batch in stream:
                    timer.count(batch)
                    yield batch
        finally:
            timer.finish()


class RequestTimer:
    """One request's tokens counted into `usage` and the metrics as its batches arrive: a
    plain call per batch, so that a stream's loop is one async generator deep."""

    __slots__ = ("metrics", "usage", "start", "last", "finish_reason")

    def __init__(self, metrics: ServerMetrics, usage: Usage, prompt_len: int) -> None:
        self.metrics, self.usage = metrics, usage
        self.start = self.last = time.monotonic()
        self.finish_reason = "abort"
        usage.prompt_tokens = prompt_len
        metrics.prompt_tokens.inc(prompt_len)

    def count(self, batch: list[RequestOutput]) -> None:
        if len(batch) == 1:
            outputs = batch[0].outputs
            new = len(outputs[0].token_ids) if outputs else 0
        else:
            new = sum(len(o.outputs[0].token_ids) for o in batch if o.outputs)
        usage, metrics = self.usage, self.metrics
        if new:
            now = time.monotonic()
            if usage.completion_tokens == 0:
                metrics.time_to_first_token.observe(now - self.start)
            else:
                metrics.inter_token_latency.observe((now - self.last) / new, new)
            self.last = now
            usage.completion_tokens += new
            metrics.generation_tokens.inc(new)
        final = batch[-1]
        if final.finished:
            usage.cached_tokens = final.num_cached_tokens
            self.finish_reason = (final.outputs[0].finish_reason if final.outputs else None) or (
                "stop"
            )

    def finish(self) -> None:
        """The request has left (finished, failed, or its client disconnected)."""
        self.metrics.request_finished(self.finish_reason, time.monotonic() - self.start)


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0

    def body(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


@dataclass
class Collected:
    """A whole reply, gathered for a non-streaming answer."""

    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    error: str | None = None

    def add(self, output: RequestOutput) -> None:
        completion = output.outputs[0]
        self.text.append(completion.text)
        self.token_ids += completion.token_ids
        if output.finished:
            self.finish_reason = completion.finish_reason
            self.stop_reason = completion.stop_reason
            self.error = output.error

    def check(self) -> None:
        """A reply the engine failed is the server's error (500), not the client's."""
        if self.finish_reason == "error":
            raise OpenAIError(f"The engine failed this request: {self.error}", 500)
        if self.finish_reason == "abort":
            raise OpenAIError("The request was aborted: the server is shutting down.", 503)


def batch_delta(batch: list[RequestOutput]) -> tuple[str, list[int]]:
    """What one engine batch of a request brought (DELTA outputs): its text and token ids,
    joined when the engine client handed over several steps at once."""
    if len(batch) == 1:
        completion = batch[0].outputs[0]
        return completion.text, completion.token_ids
    text = "".join(o.outputs[0].text for o in batch)
    return text, [t for o in batch for t in o.outputs[0].token_ids]


def finish_reason(reason: str | None) -> str | None:
    """OpenAI's finish_reason: "stop" (EOS or a stop string/token) or "length"."""
    return None if reason is None else ("length" if reason == "length" else "stop")


def error_event(output: RequestOutput) -> bytes | None:
    """A stream the engine failed or aborted ends with an error event (as vLLM's does)."""
    reason = output.outputs[0].finish_reason if output.outputs else None
    if reason == "error":
        return sse(OpenAIError(f"The engine failed this request: {output.error}", 500).body())
    if reason == "abort":
        return sse(OpenAIError("The request was aborted: the server is shutting down.", 503).body())
    return None
