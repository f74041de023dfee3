"""How one request wants its tokens chosen: vLLM's `SamplingParams`, same names, same meaning.

Validation happens here, at construction, so a bad value is a clear `ValueError` at the call
site instead of a NaN in the middle of a batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from numbers import Real

# Below this temperature we treat the request as greedy (vLLM does the same).
_GREEDY_EPS = 1e-5

# The float fields: each must be a finite number before its range is checked, since NaN fails
# every comparison and inf passes the one-sided ones (an infinite temperature samples noise).
_FLOAT_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
)


class RequestOutputKind(Enum):
    """What each streamed `RequestOutput` carries (vLLM's `RequestOutputKind`)."""

    CUMULATIVE = 0  # the whole text so far, every time
    DELTA = 1  # only what is new since the last output
    FINAL_ONLY = 2  # nothing until the request finishes


@dataclass
class SamplingParams:
    """Per-request sampling parameters.

    temperature: 0 means greedy. top_p in (0, 1]; top_k: 0 or -1 disables it; min_p in [0, 1].
    repetition_penalty > 0 (1 disables; applies to prompt and output tokens);
    presence_penalty / frequency_penalty in [-2, 2] (apply to output tokens).
    seed: makes a request reproducible whatever else runs in the batch.
    max_tokens: new tokens at most (None: until the context is full). min_tokens: EOS and stop
    tokens are masked until this many tokens exist.
    stop: strings that end the reply; they are never part of the returned text.
    stop_token_ids: extra token ids that end the reply. ignore_eos: keep going past EOS.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: str | Sequence[str] | None = None
    stop_token_ids: Sequence[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    detokenize: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # Filled in by __post_init__: the normalised stop strings and token ids.
    _stop: tuple[str, ...] = field(default=(), init=False, repr=False)
    _stop_token_ids: tuple[int, ...] = field(default=(), init=False, repr=False)

    def __post_init__(self) -> None:
        if self.n != 1:
            raise ValueError(f"n must be 1 (parallel sampling is not supported), got {self.n}")
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if not self.temperature >= 0.0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1 or int(self.top_k) != self.top_k:
            raise ValueError(
                f"top_k must be -1, 0 (disabled) or a positive integer, got {self.top_k}"
            )
        if self.top_k == -1:
            self.top_k = 0
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not self.repetition_penalty > 0.0:
            raise ValueError(f"repetition_penalty must be positive, got {self.repetition_penalty}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.min_tokens < 0:
            raise ValueError(f"min_tokens must be non-negative, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(
                f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})"
            )
        if self.seed is not None and not (isinstance(self.seed, int) and self.seed >= 0):
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
        self._stop = _stop_strings(self.stop)
        self._stop_token_ids = _stop_token_ids(self.stop_token_ids)

    @property
    def greedy(self) -> bool:
        return self.temperature < _GREEDY_EPS

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return self._stop

    @property
    def all_stop_token_ids(self) -> tuple[int, ...]:
        return self._stop_token_ids

    @property
    def has_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )


def _stop_strings(stop: object) -> tuple[str, ...]:
    """`stop` as a tuple: one string, or a list (any sequence) of non-empty strings."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, Sequence) or any(not isinstance(s, str) for s in stop):
        raise ValueError(f"stop must be a string or a list of strings, got {stop!r}")
    if not all(stop):
        raise ValueError("stop strings must be non-empty strings")
    return tuple(stop)


def _stop_token_ids(ids: object) -> tuple[int, ...]:
    """`stop_token_ids` as a tuple: a list (any sequence) of non-negative integers."""
    if ids is None:
        return ()
    if (
        isinstance(ids, str)
        or not isinstance(ids, Sequence)
        or any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in ids)
    ):
        raise ValueError(f"stop_token_ids must be a list of non-negative integers, got {ids!r}")
    return tuple(ids)
