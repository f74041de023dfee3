"""One request's state as the engine tracks it: its tokens, how many of them are in the KV
cache, the blocks that hold them, and what has been shown to the user so far."""

from __future__ import annotations

import enum
from typing import Any

from gpu.outputs import RequestMetrics
from gpu.sampling_params import SamplingParams

_NEVER = 1 << 62  # an output length no request reaches


def placeholder(row: int) -> int:
    """The stand-in id of a token in flight, sampled into row `row` of its step's output."""
    return -1 - row


class SequenceStatus(enum.Enum):
    WAITING = enum.auto()  # not admitted yet, or preempted and waiting to be recomputed
    RUNNING = enum.auto()  # holds KV blocks; prefilling in chunks or decoding
    FINISHED = enum.auto()


class Sequence:
    """A request: prompt tokens, then the tokens sampled so far.

    `num_computed_tokens` counts the leading tokens whose K and V are in the cache. While it is
    below `num_tokens` the sequence is prefilling (in chunks); when the last token is computed,
    the step samples the next one, which is then the only uncomputed token (decode).

    Async scheduling: a token sampled by a step still running on the device is not known on the
    host yet. It is held as a placeholder at the end of `token_ids` and `output_token_ids`
    (`num_pending` of them, at most two: one per step in flight or just finished), so lengths,
    positions and block allocation already count it. A placeholder is the negative id
    `placeholder(row)` = -(1 + row), row being the token's row in that step's sampled ids:
    the next step's input builder reads the row straight from the id (see model_runner).
    """

    __slots__ = (
        "request_id",
        "prompt",
        "prompt_token_ids",
        "output_token_ids",
        "token_ids",
        "params",
        "status",
        "num_computed_tokens",
        "num_cached_tokens",
        "block_table",
        "table_row",
        "block_hashes",
        "seed",
        "detokenizer",
        "output_text",
        "num_text_sent",
        "num_tokens_sent",
        "finish_reason",
        "stop_reason",
        "error",
        "metrics",
        "eos_token_ids",
        "max_model_len",
        "finishing_token_ids",
        "length_limit",
        "stop_strings",
        "argmax_from",
        "num_pending",
    )

    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        params: SamplingParams,
        seed: int,
        arrival_time: float,
        eos_token_ids: frozenset[int],
        max_model_len: int,
        detokenizer: Any = None,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.token_ids: list[int] = list(prompt_token_ids)  # prompt + output, kept together
        self.params = params
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens found in the prefix cache at admission
        self.block_table: list[int] = []
        self.table_row = -1  # its row in the block manager's BlockTableRows (-1: holds none)
        self.block_hashes: list[int] = []  # chained hashes of the full blocks registered so far
        self.seed = seed
        self.detokenizer = detokenizer if params.detokenize else None
        self.output_text = ""
        self.num_text_sent = 0  # characters of output_text already streamed
        self.num_tokens_sent = 0  # output tokens already streamed
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.error: str | None = None
        self.metrics = RequestMetrics(
            arrival_time=arrival_time, num_prompt_tokens=len(prompt_token_ids)
        )
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        # Stop conditions, derived once from params so that the per-token check of a decode
        # step is three cheap tests (see output_processor.append_token): the token ids that may
        # end the request, the total length at which it ends, and its stop strings.
        self.finishing_token_ids = frozenset(params.all_stop_token_ids) | (
            frozenset() if params.ignore_eos else eos_token_ids
        )
        limit = max_model_len
        if params.max_tokens is not None:
            limit = min(limit, len(prompt_token_ids) + params.max_tokens)
        self.length_limit = limit
        self.stop_strings = params.stop_strings
        # From this many output tokens on, its next token is a plain argmax (greedy, no
        # penalties, no banned ids): a step where every row is so skips the sampling arrays.
        plain = params.greedy and not params.has_penalties
        self.argmax_from = params.min_tokens if plain else _NEVER
        self.num_pending = 0  # placeholders at the end of token_ids (async scheduling)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        """Output tokens known on the host (a placeholder of a step in flight not counted)."""
        return len(self.output_token_ids) - self.num_pending

    @property
    def num_known_tokens(self) -> int:
        """Tokens known on the host: num_tokens less the placeholders of steps in flight."""
        return len(self.token_ids) - self.num_pending

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.token_ids.append(token_id)

    def append_placeholder(self, row: int) -> None:
        """The step just launched samples this sequence's next token into `row`."""
        token = placeholder(row)
        self.output_token_ids.append(token)
        self.token_ids.append(token)
        self.num_pending += 1

    def drop_placeholders(self) -> None:
        """Forget the tokens still in flight (the sequence ended first: they are discarded)."""
        if self.num_pending:
            del self.token_ids[-self.num_pending :]
            del self.output_token_ids[-self.num_pending :]
            self.num_pending = 0

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.status.name}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={self.block_table})"
        )
