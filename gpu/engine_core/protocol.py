"""The messages between an engine-core client and the core process: plain tuples, pickled.

Each message is a tuple whose first item names its kind, pickled by `send` (plain pickle.dumps:
1.7 us for a step of 8 requests where Connection.send's ForkingPickler takes 6.3). Requests are
known on the wire by a small int handle the client picks (strings cost ~4x more to pickle at 256
requests a step).

client -> core
    (ADD, handle, prompt_token_ids, params)      queue a request (params: SamplingParams, sent
                                                 with detokenize=False and no stop strings: the
                                                 client detokenizes and checks those)
    (ABORT, [handle, ...])                       stop requests; each ends with "abort"
    (SHUTDOWN,)                                  abort everything, send the last outputs, exit

core -> client
    (PROGRESS, stage, done, total)               the build's progress (weights, kernels)
    (MODEL, folder)                              the resolved model folder (for the tokenizer)
    (READY, EngineInfo)                          the engine is built: serving from now on
    (LOAD_FAILED, exception)                     the build failed; the core exits
    (STEP, handles, tokens, finished, stats)     one engine step's outputs (see step_message)
    (STATS, stats)                               a stats snapshot (sent when the core goes idle)
    (FATAL, message)                             the step loop itself failed; the core exits

Nothing here names a device: the core owns the executor, and whatever runs behind it (one
worker process per GPU, later) is the core's business, not the protocol's.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from gpu.outputs import EngineStats, RequestOutput, StepStats

ADD, ABORT, SHUTDOWN = "add", "abort", "shutdown"
PROGRESS, MODEL, READY, LOAD_FAILED, STEP, STATS, FATAL = (
    "progress", "model", "ready", "load_failed", "step", "stats", "fatal",
)  # fmt: skip

Finished = tuple[int, list[int], str, "int | str | None", "str | None", int, "float | None"]
"""(handle, last token ids, finish_reason, stop_reason, error, num_cached_tokens,
first_scheduled_time) of a request that ended this step."""


def send(conn: Connection, message: Any) -> None:
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def recv(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


@dataclass(frozen=True)
class EngineInfo:
    """What the client needs to know of the built engine (the app's status bar reads it)."""

    model_name: str
    device: str
    max_model_len: int
    kv_capacity_tokens: int
    vocab_size: int


def step_message(
    outputs: list[RequestOutput], stats: tuple | None
) -> tuple[str, list[int], list[int], list[Finished], tuple | None]:
    """One step's RequestOutputs (DELTA, engine request ids = str(handle)) as a STEP message.

    The common case, a running request with new tokens, goes into two flat parallel lists
    (a request with two tokens this step appears twice); a request that ended carries its
    last tokens in its `Finished` row instead, so the client knows which token stopped it.
    """
    handles: list[int] = []
    tokens: list[int] = []
    finished: list[Finished] = []
    for out in outputs:
        handle = int(out.request_id)
        completion = out.outputs[0]
        if out.finished:
            metrics = out.metrics
            finished.append(
                (
                    handle,
                    completion.token_ids,
                    completion.finish_reason or "stop",
                    completion.stop_reason,
                    out.error,
                    out.num_cached_tokens,
                    None if metrics is None else metrics.first_scheduled_time,
                )
            )
        else:
            for token in completion.token_ids:
                handles.append(handle)
                tokens.append(token)
    return (STEP, handles, tokens, finished, stats)


def stats_to_tuple(stats: EngineStats) -> tuple:
    """EngineStats as a flat tuple (a dataclass pickles ~5x slower)."""
    s = stats.last_step
    return (
        stats.num_running, stats.num_waiting, stats.kv_blocks_used, stats.kv_blocks_total,
        stats.prefix_cache_queries, stats.prefix_cache_hits, stats.num_preemptions,
        stats.tokens_per_s,
        (s.batch_size, s.num_prefill_tokens, s.num_decode_tokens, s.step_time),
    )  # fmt: skip


def stats_from_tuple(values: tuple) -> EngineStats:
    *head, last = values
    return EngineStats(*head, last_step=StepStats(*last))
