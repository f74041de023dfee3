"""What the engine hands back: vLLM's `RequestOutput` / `CompletionOutput`, plus the metrics a
chat UI shows (time to first token, inter-token latency, tokens per second).

The engine makes a RequestOutput and a CompletionOutput per running request every step, so they
are slotted dataclasses: cheaper to build, and a mistyped attribute is an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestMetrics:
    """Wall-clock times (time.monotonic seconds) of one request's life."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    num_generated_tokens: int = 0

    @property
    def time_to_first_token(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def inter_token_latency(self) -> float | None:
        """Mean seconds between output tokens after the first one."""
        if self.first_token_time is None or self.num_generated_tokens < 2:
            return None
        assert self.last_token_time is not None
        return (self.last_token_time - self.first_token_time) / (self.num_generated_tokens - 1)

    @property
    def tokens_per_s(self) -> float | None:
        itl = self.inter_token_latency
        return None if not itl else 1.0 / itl


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" | None (running)
    stop_reason: int | str | None = None  # the stop string or token id that ended it


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    error: str | None = None  # set when the engine failed this request
    num_cached_tokens: int = 0

    @property
    def text(self) -> str:
        return self.outputs[0].text


@dataclass
class StepStats:
    """One engine step, for the status bar and the bench."""

    batch_size: int = 0
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    step_time: float = 0.0  # seconds, host wall-clock of the whole step


@dataclass
class EngineStats:
    """A snapshot of the engine, cheap to copy across threads."""

    num_running: int = 0
    num_waiting: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int = 0  # of which were found
    num_preemptions: int = 0
    tokens_per_s: float = 0.0  # generated tokens per second over the last second or so
    last_step: StepStats = field(default_factory=StepStats)

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0

    @property
    def prefix_cache_hit_rate(self) -> float:
        return (
            self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
        )
