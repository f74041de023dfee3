"""POST /v1/chat/completions: messages through the model's chat template, streamed or whole."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from gpu.entrypoints.openai.protocol import ChatCompletionRequest, OpenAIError
from gpu.entrypoints.openai.serving import (
    SSE_DONE,
    Collected,
    OpenAIServing,
    RequestTimer,
    Usage,
    batch_delta,
    error_event,
    finish_reason,
    sse,
    sse_template,
)


class OpenAIServingChat(OpenAIServing):
    def prepare(self, request: ChatCompletionRequest) -> tuple[list[int], Any]:
        """The prompt's token ids and the sampling parameters, or OpenAIError."""
        self.check_common(request)
        if request.top_logprobs:
            raise self.refuse("top_logprobs", "top_logprobs")
        for name in ("tools", "functions"):
            if getattr(request, name):
                raise self.refuse("Tool calling", name)
        if request.tool_choice not in (None, "none") or request.function_call is not None:
            raise self.refuse("Tool calling", "tool_choice")
        if request.response_format and request.response_format.get("type") != "text":
            raise self.refuse("response_format other than text", "response_format")
        if request.audio is not None or (request.modalities or ["text"]) != ["text"]:
            raise self.refuse("Audio", "modalities")
        if not request.messages:
            raise OpenAIError("messages must not be empty.", param="messages")
        messages = [_plain_message(i, m) for i, m in enumerate(request.messages)]
        try:
            prompt_ids = list(
                self.engine.engine.tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=True
                )
            )
        except Exception as error:  # a template may raise anything (raise_exception, jinja)
            raise OpenAIError(f"The chat template failed: {error}", param="messages") from None
        max_tokens = request.max_completion_tokens or request.max_tokens
        return prompt_ids, self.sampling_params(request, len(prompt_ids), max_tokens)

    async def create(self, request: ChatCompletionRequest) -> dict[str, Any]:
        """The whole reply as one chat.completion object."""
        prompt_ids, params = self.prepare(request)
        request_id = self.engine.new_request_id("chatcmpl")
        usage, reply = Usage(), Collected()
        async with aclosing(self.outputs(prompt_ids, params, request_id, usage)) as stream:
            async for batch in stream:
                for output in batch:
                    reply.add(output)
        reply.check()
        message = {"role": "assistant", "content": "".join(reply.text)}
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": finish_reason(reply.finish_reason),
            "stop_reason": reply.stop_reason,
        }
        response = {
            "id": request_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            "usage": usage.body(),
        }
        if request.return_token_ids:
            choice["token_ids"] = reply.token_ids
            response["prompt_token_ids"] = prompt_ids
        return response

    async def stream(self, request: ChatCompletionRequest) -> AsyncIterator[bytes]:
        """Checks the request first (raising OpenAIError before any byte is sent), then
        returns the server-sent events: the role, the text as it comes, the finish reason,
        usage when asked for, then [DONE]."""
        prompt_ids, params = self.prepare(request)
        return self._events(request, prompt_ids, params)

    async def _events(self, request: ChatCompletionRequest, prompt_ids, params):
        """The role first, then one event per engine batch that brought text, then the finish
        reason; with return_token_ids the first event carries the prompt's ids (at the top, as
        vLLM's) and every later one its choice's new `token_ids`. What one batch makes goes
        out in one write."""
        request_id = self.engine.new_request_id("chatcmpl")
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        with_ids = bool(request.return_token_ids)
        head = {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.model_name,
        }
        if include_usage:
            head["usage"] = None

        def choice(delta: dict[str, Any], ids: list[int], reason=None, stop=None):
            out = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
            if reason is not None:
                out["stop_reason"] = stop
            if with_ids:
                out["token_ids"] = ids
            return out

        def chunk(delta: dict[str, Any], ids: list[int], reason=None, stop=None) -> bytes:
            return sse({**head, "choices": [choice(delta, ids, reason, stop)]})

        paths = [("choices", 0, "delta", "content")]
        if with_ids:
            paths.append(("choices", 0, "token_ids"))
        text_chunk = sse_template({**head, "choices": [choice({"content": ""}, [])]}, *paths)
        usage = Usage()
        role = choice({"role": "assistant", "content": ""}, [])
        if with_ids:
            yield sse({**head, "prompt_token_ids": prompt_ids, "choices": [role]})
        else:
            yield sse({**head, "choices": [role]})
        timer = RequestTimer(self.metrics, usage, len(prompt_ids))
        try:
            stream = self.engine.generate(prompt_ids, params, request_id)
            async with aclosing(stream):
                async for batch in stream:
                    timer.count(batch)
                    text, ids = batch_delta(batch)
                    final = batch[-1]
                    if not final.finished:
                        if with_ids:
                            if text or ids:
                                yield text_chunk(text, ids)
                        elif text:
                            yield text_chunk(text)
                        continue
                    events = []
                    if text:
                        events.append(text_chunk(text, ids) if with_ids else text_chunk(text))
                        ids = []
                    error = error_event(final)
                    if error is not None:
                        yield b"".join([*events, error, SSE_DONE])
                        return
                    completion = final.outputs[0]
                    reason = finish_reason(completion.finish_reason)
                    events.append(chunk({}, ids, reason, completion.stop_reason))
                    if include_usage:
                        events.append(sse({**head, "choices": [], "usage": usage.body()}))
                    events.append(SSE_DONE)
                    yield b"".join(events)
                    return
        finally:
            timer.finish()


def _plain_message(index: int, message) -> dict[str, str]:
    """A message as the chat template takes it: text parts joined; anything else is 400."""
    content = message.content
    if isinstance(content, list):
        texts = []
        for part in content:
            kind = part.get("type")
            if kind != "text" or not isinstance(part.get("text"), str):
                what = "Images" if kind in ("image_url", "input_image") else f"{kind!r} parts"
                raise OpenAIError(
                    f"{what} in messages are not supported by tinychat serve (text only).",
                    param=f"messages.{index}.content",
                )
            texts.append(part["text"])
        content = "".join(texts)
    if message.tool_calls:
        raise OpenAIError(
            "Tool calling is not supported by tinychat serve.",
            param=f"messages.{index}.tool_calls",
        )
    role = "system" if message.role == "developer" else message.role
    if role == "tool":
        raise OpenAIError(
            "Tool messages are not supported by tinychat serve.", param=f"messages.{index}.role"
        )
    return {"role": role, "content": content or ""}
