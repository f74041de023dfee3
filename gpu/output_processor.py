"""After sampling: append each new token, detokenize it, check the stop conditions and decide
what text may be shown.

Stop strings are never shown, even when they arrive split over several tokens: while a request
runs, the last (longest stop string - 1) characters are held back, since they could be the start
of a stop string; they are released when the request ends without one.
"""

from __future__ import annotations

import time

from gpu.outputs import CompletionOutput, RequestOutput
from gpu.sampling_params import RequestOutputKind
from gpu.sequence import Sequence

# Enum members looked up once: `RequestOutputKind.DELTA` is an attribute lookup on the enum
# class each time, and make_output runs for every request at every step.
_DELTA = RequestOutputKind.DELTA
_FINAL_ONLY = RequestOutputKind.FINAL_ONLY


def append_token(seq: Sequence, token: int, now: float) -> None:
    """Add one sampled token to seq and finish it if a stop condition holds."""
    seq.output_token_ids.append(token)
    seq.token_ids.append(token)
    _token_arrived(seq, token, now)


def resolve_token(seq: Sequence, token: int, now: float) -> None:
    """Async scheduling: seq's oldest placeholder (its token of the step whose result is in)
    becomes `token`, and the stop checks run as for append_token. If seq ends on it, the token
    a later step is already computing for it is discarded: never appended, never reported."""
    pending = seq.num_pending
    seq.output_token_ids[-pending] = token
    seq.token_ids[-pending] = token
    seq.num_pending = pending - 1
    _token_arrived(seq, token, now)
    if seq.num_pending and seq.finish_reason is not None:
        seq.drop_placeholders()


def _token_arrived(seq: Sequence, token: int, now: float) -> None:
    m = seq.metrics
    if m.first_token_time is None:
        m.first_token_time = now
    m.last_token_time = now
    m.num_generated_tokens += 1
    if (
        token in seq.finishing_token_ids
        or seq.stop_strings
        or seq.num_known_tokens >= seq.length_limit
    ):
        _check_stop_conditions(seq, token)
    elif seq.detokenizer is not None:
        # The common token, not worth the full check: it is no EOS or stop id, the request has
        # no stop strings and is short of its length limit, so it cannot end here.
        seq.output_text += seq.detokenizer.add(token)


def _check_stop_conditions(seq: Sequence, token: int) -> None:
    """Every stop condition, in order: EOS, stop token, stop string, length. Counts only the
    tokens known on the host (a placeholder of a later step in flight is not there yet)."""
    params = seq.params
    n_out = seq.num_output_tokens
    if n_out >= params.min_tokens:
        if not params.ignore_eos and token in seq.eos_token_ids:
            seq.finish_reason = "stop"
        elif token in params.all_stop_token_ids:
            seq.finish_reason, seq.stop_reason = "stop", token
    if seq.finish_reason is None and seq.detokenizer is not None:
        before = len(seq.output_text)
        seq.output_text += seq.detokenizer.add(token)
        if seq.stop_strings and n_out >= params.min_tokens:
            _check_stop_strings(seq, before)
    if seq.finish_reason is None:
        if params.max_tokens is not None and n_out >= params.max_tokens:
            seq.finish_reason = "length"
        elif seq.num_known_tokens >= seq.max_model_len:
            seq.finish_reason = "length"
    if seq.finish_reason is not None and seq.stop_reason is None and seq.detokenizer is not None:
        seq.output_text += seq.detokenizer.flush()  # a character left unfinished at the end


def _check_stop_strings(seq: Sequence, new_from: int) -> None:
    """Cut the text at the first stop string that ends in the new characters."""
    text = seq.output_text
    longest = max(len(s) for s in seq.params.stop_strings)
    search_from = max(0, new_from - longest + 1)
    best = -1
    for stop in seq.params.stop_strings:
        i = text.find(stop, search_from)
        if i != -1 and (best == -1 or i < best):
            best, seq.stop_reason = i, stop
    if best != -1:
        seq.output_text = text[:best]
        seq.finish_reason = "stop"


def visible_text_end(seq: Sequence) -> int:
    """How much of output_text may be shown now (all of it once the request is done)."""
    if seq.finish_reason is not None or not seq.stop_strings:
        return len(seq.output_text)
    hold = max(len(s) for s in seq.stop_strings) - 1
    return max(seq.num_text_sent, len(seq.output_text) - hold)


def make_output(seq: Sequence, finished: bool) -> RequestOutput | None:
    """The RequestOutput to deliver for seq now, per its output kind (None: nothing to say)."""
    kind = seq.params.output_kind
    if kind is _FINAL_ONLY and not finished:
        return None
    output_text = seq.output_text
    end = visible_text_end(seq) if seq.stop_strings else len(output_text)
    num_known = seq.num_output_tokens  # not a token still in flight
    if kind is _DELTA:
        text = output_text[seq.num_text_sent : end]
        token_ids = seq.output_token_ids[seq.num_tokens_sent : num_known]
        if not text and not token_ids and not finished:
            return None
    else:
        text = output_text[:end]
        token_ids = seq.output_token_ids[:num_known]
    seq.num_text_sent = end
    seq.num_tokens_sent = num_known
    if finished:
        seq.metrics.finished_time = time.monotonic()
        seq.metrics.num_cached_tokens = seq.num_cached_tokens
        completion = CompletionOutput(0, text, token_ids, seq.finish_reason, seq.stop_reason)
    else:
        completion = CompletionOutput(0, text, token_ids)
    return RequestOutput(
        seq.request_id,
        seq.prompt,
        seq.prompt_token_ids,
        [completion],
        finished,
        seq.metrics,
        seq.error,
        seq.num_cached_tokens,
    )
