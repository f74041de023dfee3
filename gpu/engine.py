"""The engine: requests in, tokens out, one `step()` at a time.

    add_request -> Scheduler (which sequences, how many tokens) -> BlockManager (KV blocks)
    -> ModelRunner (flat batch) -> executor (forward + sampler on the backend)
    -> output processor (append, detokenize, stop) -> RequestOutput

It knows nothing of the backend beyond the executor, so the same engine runs on numpy and on
the GPU. Everything here is single-threaded; `EngineThread` runs it in the background.

Async scheduling (vLLM v1's, EngineConfig.async_scheduling): the host part of a step (schedule,
build the batch, process the outputs) would otherwise leave the GPU idle. So step() schedules
and launches step N+1 while step N is still on the device, and only then waits for N's ids and
processes them. N+1 cannot know the tokens N samples: each sampled sequence gets a placeholder
(Sequence.num_pending) that the scheduler counts like a token, that N+1's embedding reads from
the device (ForwardBatch.prev_rows), and that N's result replaces before the stop checks run.
A sequence that stops on N's token has its token of N+1 discarded, as in vLLM.

The engine falls back to the serial order (it drains: waits for and processes the step in
flight before scheduling) only to preempt a sequence holding a placeholder: recomputing it needs
its real ids. Penalties and min_tokens bans need no ids on the host: each such sequence's token
history is a row of the sampler's token state on the device, written once from its known ids
and counted on by the sampler itself (see sampling_batch.StateOwners). Greedy and seeded sampling
give the same tokens either way: the sampler's per-row RNG is keyed by (seed, number of tokens
before), placeholders included. A request without a seed draws one from the engine's generator,
seeded by EngineConfig.seed (None, the default: fresh entropy from the OS each engine).
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu.block_manager import BlockManager
from gpu.config import EngineConfig
from gpu.model_runner import Executor, ModelRunner, StepResult
from gpu.output_processor import make_output, resolve_token
from gpu.outputs import EngineStats, RequestOutput, StepStats
from gpu.sampling_params import SamplingParams
from gpu.scheduler import DrainNeeded, Scheduler, SchedulerOutput
from gpu.sequence import Sequence, SequenceStatus
from weights.detokenizer import IncrementalDetokenizer


@dataclass(slots=True)
class _LaunchedStep:
    """A step on its way: what ran, who samples (row order), and the handle to their ids."""

    sched: SchedulerOutput
    sampled: list[Sequence]
    handle: StepResult


class LLMEngine:
    def __init__(
        self,
        executor: Executor,
        tokenizer: Any,
        model_config: Any,
        num_kv_blocks: int,
        max_model_len: int,
        config: EngineConfig,
        eos_token_ids: frozenset[int] = frozenset(),
        model_name: str = "",
        device: str = "cpu",
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.model_config = model_config
        self.model_name = model_name
        self.device = device
        self.block_size = config.block_size
        self.num_kv_blocks = num_kv_blocks
        # A sequence may never need more blocks than the whole cache holds.
        self.max_model_len = min(max_model_len, num_kv_blocks * config.block_size)
        self.eos_token_ids = eos_token_ids
        self.block_manager = BlockManager(
            num_kv_blocks, config.block_size, config.enable_prefix_caching
        )
        max_tokens = config.max_num_batched_tokens or 2048
        self.scheduler = Scheduler(
            self.block_manager, config.max_num_seqs, max_tokens, self.max_model_len
        )
        self.runner = ModelRunner(
            executor, config.block_size, self.block_manager.table_rows, model_config.vocab_size
        )
        self.requests: dict[str, Sequence] = {}
        self._ids = itertools.count()
        self._seed_rng = np.random.default_rng(config.seed)
        self._pending: list[RequestOutput] = []  # outputs of aborts, delivered by the next step
        self._recent: deque[tuple[float, int]] = deque()  # (time, tokens generated) per step
        self.last_step = StepStats()
        self.async_scheduling = config.async_scheduling
        self._in_flight: _LaunchedStep | None = None  # launched, its ids not processed yet
        self.num_drains = 0  # async steps that waited first (to preempt a token in flight)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_kv_blocks * self.block_size

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    # --- requests -------------------------------------------------------------------------
    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        arrival_time: float | None = None,
        add_special_tokens: bool = True,
    ) -> str:
        """Queue a request (a text prompt, or token ids). Raises ValueError for a bad prompt."""
        params = params or SamplingParams()
        if isinstance(prompt, str):
            text: str | None = prompt
            if self.tokenizer is None:
                raise ValueError("this engine has no tokenizer: pass token ids")
            token_ids = self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        else:
            text, token_ids = None, [int(t) for t in prompt]
        if not token_ids:
            raise ValueError("the prompt is empty")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt is {len(token_ids)} tokens, but the context is "
                f"{self.max_model_len} tokens (and the reply needs at least one more)"
            )
        if min(token_ids) < 0 or max(token_ids) >= self.vocab_size:
            raise ValueError(f"token ids must be in [0, {self.vocab_size})")
        request_id = request_id if request_id is not None else str(next(self._ids))
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        seed = params.seed
        if seed is None:
            seed = int(self._seed_rng.integers(0, 2**63))
        detok = None
        if params.detokenize and self.tokenizer is not None:
            detok = IncrementalDetokenizer(
                self.tokenizer, skip_special_tokens=params.skip_special_tokens
            )
        seq = Sequence(
            request_id,
            text,
            token_ids,
            params,
            seed=seed,
            arrival_time=arrival_time if arrival_time is not None else time.monotonic(),
            eos_token_ids=self.eos_token_ids,
            max_model_len=self.max_model_len,
            detokenizer=detok,
        )
        self.requests[request_id] = seq
        self.scheduler.add(seq)
        return request_id

    def abort_request(self, request_id: str | list[str]) -> None:
        """Stop requests now and free their blocks; each gets a final "abort" output."""
        ids = [request_id] if isinstance(request_id, str) else request_id
        for rid in ids:
            seq = self.requests.pop(rid, None)
            if seq is None:
                continue
            seq.finish_reason = "abort"
            self.scheduler.finish(seq)
            seq.drop_placeholders()  # a token in flight is discarded, never reported
            out = make_output(seq, finished=True)
            if out is not None:
                self._pending.append(out)

    @property
    def step_in_flight(self) -> SchedulerOutput | None:
        """The step launched and not yet processed (async scheduling), whose ids the next
        step() waits for: that call's wall time is mostly this step's device time."""
        return None if self._in_flight is None else self._in_flight.sched

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or bool(self._pending) or self._in_flight is not None

    # --- the step -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule and launch the next step, then report what the previous one produced.

        Serial (async_scheduling off): the step launched now is also the one processed. Async:
        the step launched by the previous call is processed after this call's launch, so the
        device computes while the host schedules; with nothing to launch, the step in flight is
        still processed (a `while has_unfinished_requests(): step()` loop ends)."""
        outputs, self._pending = self._pending, []
        t0 = time.monotonic()
        try:
            sched = self.scheduler.schedule(protect_pending=self._in_flight is not None)
        except DrainNeeded:  # a sequence with a token in flight would be preempted
            self.num_drains += 1
            outputs += self._drain()
            sched = self.scheduler.schedule()
        launched = None
        if sched.seqs:
            for seq in sched.admitted:  # only a newly admitted sequence can be scheduled first
                if seq.metrics.first_scheduled_time is None:
                    seq.metrics.first_scheduled_time = t0
            try:
                launched = self._launch(sched)
            except Exception as exc:  # fail this step's requests, keep the engine alive
                outputs += self._drain()  # the step before it is fine: its tokens count
                return outputs + self.fail_requests(list(sched.seqs), exc)
        outputs += self._drain()
        if launched is not None:
            if self.async_scheduling:
                self._in_flight = launched
            else:
                outputs += self._process(launched)
            self.last_step = StepStats(
                batch_size=len(sched.seqs),
                num_prefill_tokens=sched.num_prefill_tokens,
                num_decode_tokens=sched.num_decode_tokens,
                step_time=time.monotonic() - t0,
            )
        return outputs

    def _launch(self, sched: SchedulerOutput) -> _LaunchedStep:
        """Start the step; its tokens count as computed and its samples as placeholders from
        now on, so the next schedule sees every sequence one token further."""
        sampled, handle, _ = self.runner.launch(sched)
        block_size = self.block_size
        register_full_blocks = self.block_manager.register_full_blocks
        for seq, n in zip(sched.seqs, sched.num_new_tokens, strict=True):
            seq.num_computed_tokens += n
            if n > 1 or seq.num_computed_tokens % block_size == 0:  # a block may have filled
                register_full_blocks(seq)  # (a block holding a placeholder waits: see _process)
        for row, seq in enumerate(sampled):
            seq.append_placeholder(row)
        return _LaunchedStep(sched, sampled, handle)

    def _drain(self) -> list[RequestOutput]:
        """Wait for the step in flight, if any, and process its outputs."""
        launched, self._in_flight = self._in_flight, None
        return [] if launched is None else self._process(launched)

    def _process(self, step: _LaunchedStep) -> list[RequestOutput]:
        """Wait for step's ids and put them in place of its placeholders; stop checks,
        detokenization and outputs follow. A sequence that finished or was aborted since the
        launch (a token it did not need) is skipped: its token is discarded."""
        try:
            tokens = step.handle.result()
        except Exception as exc:  # fail that step's requests, keep the engine alive
            return self.fail_requests(list(step.sched.seqs), exc)
        now = time.monotonic()
        outputs: list[RequestOutput] = []
        block_size = self.block_size
        register_full_blocks = self.block_manager.register_full_blocks
        caching = self.block_manager.enable_prefix_caching
        finished_status = SequenceStatus.FINISHED
        for seq, token in zip(step.sampled, tokens.tolist(), strict=True):
            if seq.status is finished_status:
                continue
            resolve_token(seq, token, now)
            finished = seq.finish_reason is not None
            if finished:
                self.scheduler.finish(seq)
                del self.requests[seq.request_id]
            elif caching and seq.num_computed_tokens // block_size > len(seq.block_hashes):
                register_full_blocks(seq)  # a full block whose last token was in flight
            out = make_output(seq, finished)
            if out is not None:
                outputs.append(out)
        self._recent.append((now, len(step.sampled)))
        while self._recent and now - self._recent[0][0] > 2.0:
            self._recent.popleft()
        return outputs

    def fail_requests(self, seqs: list[Sequence], exc: Exception) -> list[RequestOutput]:
        message = f"engine error: {type(exc).__name__}: {exc}"
        outputs = []
        for seq in seqs:
            if seq.status is SequenceStatus.FINISHED:
                continue
            seq.finish_reason, seq.error = "error", message
            self.scheduler.finish(seq)
            seq.drop_placeholders()
            self.requests.pop(seq.request_id, None)
            out = make_output(seq, finished=True)
            if out is not None:
                outputs.append(out)
        return outputs

    # --- metrics --------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        bm = self.block_manager
        rate = 0.0
        if len(self._recent) >= 2:
            span = self._recent[-1][0] - self._recent[0][0]
            if span > 0:
                rate = sum(n for _, n in list(self._recent)[1:]) / span
        return EngineStats(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_blocks_used=bm.num_used_blocks,
            kv_blocks_total=bm.num_blocks,
            prefix_cache_queries=bm.prefix_queries,
            prefix_cache_hits=bm.prefix_hits,
            num_preemptions=self.scheduler.num_preemptions,
            tokens_per_s=rate,
            last_step=self.last_step,
        )
