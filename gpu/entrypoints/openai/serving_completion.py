"""POST /v1/completions: a prompt (text or token ids) continued, streamed or whole.

One prompt per request: OpenAI's batched prompts (a list of strings or of id lists) would need
one choice per prompt, and `n` > 1 is not served either; a one-element list is taken as its
element.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from gpu.entrypoints.openai.protocol import CompletionRequest, OpenAIError
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


class OpenAIServingCompletion(OpenAIServing):
    def prepare(self, request: CompletionRequest) -> tuple[list[int], Any]:
        self.check_common(request)
        if request.echo:
            raise self.refuse("echo", "echo")
        if request.suffix:
            raise self.refuse("suffix", "suffix")
        if request.best_of not in (None, 1):
            raise self.refuse("best_of other than 1", "best_of")
        prompt_ids = self._prompt_ids(request.prompt)
        return prompt_ids, self.sampling_params(request, len(prompt_ids), request.max_tokens)

    def _prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise OpenAIError(
                    "Batched prompts are not supported by tinychat serve: send one prompt "
                    "per request.",
                    param="prompt",
                )
            prompt = prompt[0]
        engine = self.engine.engine
        if isinstance(prompt, str):
            ids = list(engine.tokenizer.encode(prompt, add_special_tokens=True))
        else:
            ids = list(prompt)
            vocab = getattr(engine, "vocab_size", None)  # 0 or None: not known
            if vocab and any(t < 0 or t >= vocab for t in ids):
                raise OpenAIError(f"Token ids must be in [0, {vocab}).", param="prompt")
        if not ids:
            raise OpenAIError("The prompt is empty.", param="prompt")
        return ids

    async def create(self, request: CompletionRequest) -> dict[str, Any]:
        prompt_ids, params = self.prepare(request)
        request_id = self.engine.new_request_id("cmpl")
        usage, reply = Usage(), Collected()
        async with aclosing(self.outputs(prompt_ids, params, request_id, usage)) as stream:
            async for batch in stream:
                for output in batch:
                    reply.add(output)
        reply.check()
        choice = {
            "index": 0,
            "text": "".join(reply.text),
            "logprobs": None,
            "finish_reason": finish_reason(reply.finish_reason),
            "stop_reason": reply.stop_reason,
        }
        if request.return_token_ids:
            choice.update(prompt_token_ids=prompt_ids, token_ids=reply.token_ids)
        return {
            "id": request_id,
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            "usage": usage.body(),
        }

    async def stream(self, request: CompletionRequest) -> AsyncIterator[bytes]:
        """Checks first (OpenAIError before any byte), then the events."""
        prompt_ids, params = self.prepare(request)
        return self._events(request, prompt_ids, params)

    async def _events(self, request: CompletionRequest, prompt_ids, params):
        """One event per engine batch that brought text (its tokens' text joined), the last
        one with the finish reason; with return_token_ids each carries its new ids too, and
        the first the prompt's. What one batch makes goes out in one write."""
        request_id = self.engine.new_request_id("cmpl")
        include_usage = bool(request.stream_options and request.stream_options.include_usage)
        with_ids = bool(request.return_token_ids)
        head = {
            "id": request_id,
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.model_name,
        }
        if include_usage:
            head["usage"] = None

        def choice(text: str, ids: list[int], reason=None, stop=None) -> dict[str, Any]:
            out = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            if reason is not None:
                out["stop_reason"] = stop
            if with_ids:
                out["token_ids"] = ids
            return out

        def chunk(text: str, ids: list[int], reason=None, stop=None) -> bytes:
            return sse({**head, "choices": [choice(text, ids, reason, stop)]})

        paths = [("choices", 0, "text")] + ([("choices", 0, "token_ids")] if with_ids else [])
        text_chunk = sse_template({**head, "choices": [choice("", [])]}, *paths)
        first = with_ids  # the first event carries the prompt's ids
        usage = Usage()
        timer = RequestTimer(self.metrics, usage, len(prompt_ids))
        try:
            stream = self.engine.generate(prompt_ids, params, request_id)
            async with aclosing(stream):
                async for batch in stream:
                    timer.count(batch)
                    text, ids = batch_delta(batch)
                    final = batch[-1]
                    if final.finished:
                        events = []
                        error = error_event(final)
                        if error is not None:
                            if text or (with_ids and ids):
                                events.append(chunk(text, ids))
                            events += (error, SSE_DONE)
                            yield b"".join(events)
                            return
                        completion = final.outputs[0]
                        reason = finish_reason(completion.finish_reason)
                        if first:
                            body = choice(text, ids, reason, completion.stop_reason)
                            body["prompt_token_ids"] = prompt_ids
                            events.append(sse({**head, "choices": [body]}))
                        else:
                            events.append(chunk(text, ids, reason, completion.stop_reason))
                        if include_usage:
                            events.append(sse({**head, "choices": [], "usage": usage.body()}))
                        events.append(SSE_DONE)
                        yield b"".join(events)
                        return
                    if first:
                        body = choice(text, ids)
                        body["prompt_token_ids"] = prompt_ids
                        yield sse({**head, "choices": [body]})
                        first = False
                    elif with_ids:
                        yield text_chunk(text, ids)
                    elif text:
                        yield text_chunk(text)
        finally:
            timer.finish()
