"""One request as the client tracks it: detokenizing, stop strings and metrics, client-side.

The core sends token ids only; text is made here, in the client's receiver thread, as vLLM's
front end does. Measured: the incremental detokenizer (tokenizers' Rust DecodeStream,
weights/detokenizer.py) costs 2-3 us a token on the 2-core CPU, i.e. ~0.5-0.8 ms a step at
256 requests, which in the core would sit in the step loop between two device steps (a
Llama-3.2-1B decode step is ~1.1 ms at batch 1 on an H100, 2.1 ms at 256). Stop strings
need the text, so they are checked here too: a request that meets one
ends here at once (its text cut before the stop string, as in-process) and the core is told
to abort it; any token the core made meanwhile is dropped.

Timing metrics are taken where the user sees the tokens: arrival when the client queues the
request, first/last token when their step reaches the client.
"""

from __future__ import annotations

import time
from typing import Any

from gpu.output_processor import _check_stop_strings, visible_text_end
from gpu.outputs import CompletionOutput, RequestMetrics, RequestOutput
from gpu.sampling_params import SamplingParams
from weights.detokenizer import IncrementalDetokenizer


class RequestState:
    """Mirrors the parts of `Sequence` that the output processor's stop-string helpers read
    (output_text, params, stop_strings, finish_reason, stop_reason, num_text_sent)."""

    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        tokenizer: Any,
        on_output: Any,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.params = params
        self.on_output = on_output
        self.stop_strings = params.stop_strings
        self.detokenizer = None
        if params.detokenize and tokenizer is not None:
            self.detokenizer = IncrementalDetokenizer(tokenizer, params.skip_special_tokens)
        self.output_text = ""
        self.num_text_sent = 0
        self.new_token_ids: list[int] = []
        self.num_output_tokens = 0
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.error: str | None = None
        self.num_cached_tokens = 0
        self.metrics = RequestMetrics(
            arrival_time=time.monotonic(), num_prompt_tokens=len(prompt_token_ids)
        )

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def add_token(self, token: int, now: float, detokenize: bool = True) -> bool:
        """One new token; True if it completed a stop string (the request has ended)."""
        self.new_token_ids.append(token)
        self.num_output_tokens += 1
        m = self.metrics
        if m.first_token_time is None:
            m.first_token_time = now
        m.last_token_time = now
        m.num_generated_tokens += 1
        detok = self.detokenizer
        if detok is None or not detokenize:
            return False
        before = len(self.output_text)
        self.output_text += detok.add(token)
        if self.stop_strings and self.num_output_tokens >= self.params.min_tokens:
            _check_stop_strings(self, before)  # type: ignore[arg-type]
        return self.finish_reason is not None

    def finish(
        self,
        last_token_ids: list[int],
        reason: str,
        stop_reason: int | str | None,
        error: str | None,
        num_cached_tokens: int,
        first_scheduled_time: float | None,
        now: float,
    ) -> None:
        """The core ended the request. A "stop" there means its last token was EOS or a stop
        token id: that token is not text. A stop string met on the way wins."""
        last = len(last_token_ids) - 1
        for i, token in enumerate(last_token_ids):
            if self.add_token(token, now, detokenize=not (reason == "stop" and i == last)):
                break
        if self.finish_reason is None:
            self.finish_reason, self.stop_reason, self.error = reason, stop_reason, error
            if reason in ("stop", "length") and stop_reason is None and self.detokenizer:
                self.output_text += self.detokenizer.flush()  # a character left unfinished
        self.num_cached_tokens = num_cached_tokens
        self.metrics.num_cached_tokens = num_cached_tokens
        self.metrics.first_scheduled_time = first_scheduled_time
        self.metrics.finished_time = now

    def fail(self, message: str) -> None:
        """The core is gone: end the request with an error (what streamed stays)."""
        self.finish_reason, self.error = "error", message
        self.metrics.finished_time = time.monotonic()

    def make_output(self) -> RequestOutput | None:
        """What arrived since the last output, as a DELTA RequestOutput (None: nothing new)."""
        finished = self.finish_reason is not None
        end = visible_text_end(self) if self.stop_strings else len(self.output_text)  # type: ignore[arg-type]
        text = self.output_text[self.num_text_sent : end]
        token_ids, self.new_token_ids = self.new_token_ids, []
        if not text and not token_ids and not finished:
            return None
        self.num_text_sent = end
        completion = CompletionOutput(0, text, token_ids, self.finish_reason, self.stop_reason)
        return RequestOutput(
            self.request_id,
            self.prompt,
            self.prompt_token_ids,
            [completion],
            finished,
            self.metrics,
            self.error,
            self.num_cached_tokens,
        )
