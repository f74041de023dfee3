"""The benchmark's workloads, each timed on a live engine.

Every step of the engine ends with the sampled ids on the host, so a host clock read after
`step()` is already synchronised with the device: no extra sync is needed to time a step.
Warm-up runs before every timed region (kernel compilation, graph capture, caches), and only
for what the run will time. Sampled requests are seeded, so a run's tokens repeat.
"""

from __future__ import annotations

import gc
import statistics
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from gpu.bench.sampling import bench_params
from gpu.engine import LLMEngine
from gpu.engine_thread import EngineThread
from gpu.sampling_params import RequestOutputKind, SamplingParams
from gpu.sampling_presets import chat_sampling_params


def _prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    # Avoid the lowest ids (special tokens of most vocabularies).
    return [list(map(int, rng.integers(1000 % vocab, vocab, length))) for _ in range(count)]


def _greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(
        temperature=0,
        max_tokens=max_tokens,
        ignore_eos=True,
        detokenize=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


@dataclass
class DecodeResult:
    sampling: str  # a name of gpu.bench.sampling.SETTINGS
    batch_size: int
    prompt_len: int
    new_tokens: int
    decode_time_s: float  # from every request having its first token to the last token
    decode_tok_s: float
    ms_per_step: float
    prefill_time_s: float


def decode_run(
    engine: LLMEngine, batch: int, prompt_len: int, new_tokens: int, sampling: str = "greedy"
) -> DecodeResult:
    """`batch` requests prefilled together, then decoded in lockstep: decode tokens/s.
    `sampling` names the setting (gpu.bench.sampling); request i is seeded with i."""
    vocab = engine.vocab_size
    for i, prompt in enumerate(_prompts(batch, prompt_len, vocab, seed=batch)):
        engine.add_request(prompt, bench_params(sampling, new_tokens, seed=i))
    t0 = time.perf_counter()
    seqs = list(engine.requests.values())
    while any(s.num_output_tokens == 0 for s in seqs):
        engine.step()
    t_first = time.perf_counter()
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    t_end = time.perf_counter()
    decode_time = t_end - t_first
    tokens = batch * (new_tokens - 1)
    return DecodeResult(
        sampling=sampling,
        batch_size=batch,
        prompt_len=prompt_len,
        new_tokens=new_tokens,
        decode_time_s=decode_time,
        decode_tok_s=tokens / decode_time if decode_time > 0 else 0.0,
        ms_per_step=1e3 * decode_time / max(steps, 1),
        prefill_time_s=t_first - t0,
    )


def warm_up(
    engine: LLMEngine, plan: list[tuple[int, str]], prompt_len: int = 32, seconds: float = 2.0
) -> None:
    """Run each (batch size, sampling setting) of `plan` briefly: it compiles the kernels,
    captures the graphs and touches the memory that the timed runs will use, and nothing
    else. Then keep decoding for `seconds`: an idle GPU clocks down (345 MHz seen on the H200)
    and the first timed workload would pay for the ramp. The caller passes only batch 1 and
    no seconds on the cpu backend, where nothing compiles and no clock ramps."""
    for b, sampling in plan:
        decode_run(engine, b, prompt_len, 4, sampling)
    end = time.perf_counter() + seconds
    while plan and time.perf_counter() < end:
        decode_run(engine, max(b for b, _ in plan), prompt_len, 32, plan[0][1])


@dataclass
class ThroughputResult:
    num_requests: int
    input_tokens: int
    output_tokens: int
    total_time_s: float
    output_tok_s: float
    total_tok_s: float
    # Where the time goes: engine.step() wall times filed by the step they wait for (see
    # _StepTimer), steps that carried prompt tokens apart from pure decode steps, and the
    # mean number of sequences in a decode step.
    decode_steps: int = 0
    decode_s: float = 0.0
    mean_decode_batch: float = 0.0
    mixed_steps: int = 0
    mixed_s: float = 0.0


def throughput_run(
    engine: LLMEngine, num_requests: int = 256, lo: int = 100, hi: int = 1024, seed: int = 0
) -> ThroughputResult:
    """nano-vllm's workload: prompt and output lengths uniform in [lo, hi], all at once."""
    rng = np.random.default_rng(seed)
    vocab = engine.vocab_size
    prompt_lens = rng.integers(lo, hi + 1, num_requests)
    output_lens = rng.integers(lo, hi + 1, num_requests)
    limit = engine.max_model_len - 1
    timer = _StepTimer(engine)
    try:
        t0 = time.perf_counter()
        for p_len, o_len in zip(prompt_lens, output_lens, strict=True):
            p_len = int(min(p_len, limit - 1))
            prompt = list(map(int, rng.integers(0, vocab, p_len)))
            engine.add_request(prompt, _greedy(int(min(o_len, limit - p_len))))
        outputs = 0
        while engine.has_unfinished_requests():
            for out in engine.step():
                outputs += len(out.outputs[0].token_ids)
        elapsed = time.perf_counter() - t0
    finally:
        timer.close()
    inputs = int(prompt_lens.sum())
    return ThroughputResult(
        num_requests=num_requests,
        input_tokens=inputs,
        output_tokens=outputs,
        total_time_s=elapsed,
        output_tok_s=outputs / elapsed,
        total_tok_s=(outputs + inputs) / elapsed,
        decode_steps=len(timer.decode),
        decode_s=float(sum(timer.decode)),
        mean_decode_batch=float(np.mean(timer.decode_batch)) if timer.decode_batch else 0.0,
        mixed_steps=len(timer.mixed),
        mixed_s=float(sum(timer.mixed)),
    )


@dataclass
class ChatResult:
    sessions: int
    turns: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    single_itl_p50_ms: float  # one session alone, for comparison
    single_itl_p99_ms: float
    long_prompt_tokens: int
    long_prompt_ttft_ms: float  # a long prompt arriving while the other sessions stream
    # Where the tail comes from: engine.step() wall times of the group phase, split by whether
    # the step they wait for (see _StepTimer) carried prompt tokens (a new turn's prefill) or
    # only decodes, and the pauses of Python's garbage collector over the whole run.
    decode_step_p50_ms: float = float("nan")
    decode_step_p99_ms: float = float("nan")
    mixed_step_p50_ms: float = float("nan")
    mixed_step_p99_ms: float = float("nan")
    mixed_steps: int = 0
    gc_pauses: int = 0
    gc_max_ms: float = 0.0
    ttfts_ms: list[float] = field(default_factory=list, repr=False)


class _StepTimer:
    """Times every engine.step() (shadowing the method on the instance) and every collection
    of the garbage collector, until close().

    A step() call is filed by the step it waits for, not the one it launches: with async
    scheduling the call launches step N+1 and then waits for step N's ids, so its wall time is
    mostly N's device time. (Filed by the launched step, the steps that follow a prefill look
    like slow decode steps and the prefill steps look as fast as decodes.)"""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.decode: list[float] = []
        self.decode_batch: list[int] = []  # the sequences of each decode step filed
        self.mixed: list[float] = []
        self.gc: list[float] = []
        self._gc_start = 0.0
        step = engine.step

        def timed_step():
            waited = engine.step_in_flight  # None when serial: the call waits for its own
            t0 = time.perf_counter()
            out = step()
            dt = time.perf_counter() - t0
            last = engine.last_step
            if waited is not None:  # a SchedulerOutput
                self.file(dt, waited.num_prefill_tokens, len(waited.seqs))
            elif last is not None and last.batch_size:  # StepStats
                self.file(dt, last.num_prefill_tokens, last.batch_size)
            return out

        engine.step = timed_step
        gc.callbacks.append(self._on_gc)

    def file(self, seconds: float, prompt_tokens: int, batch_size: int = 0) -> None:
        if prompt_tokens:
            self.mixed.append(seconds)
        else:
            self.decode.append(seconds)
            self.decode_batch.append(batch_size)

    def _on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        else:
            self.gc.append(time.perf_counter() - self._gc_start)

    def reset(self) -> None:
        self.decode.clear()
        self.decode_batch.clear()
        self.mixed.clear()

    def close(self) -> None:
        del self.engine.step  # the class's method again
        gc.callbacks.remove(self._on_gc)


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


class _Session(threading.Thread):
    """One chat: a turn is sent, its reply streamed, then the next turn (history grows)."""

    def __init__(
        self,
        et: EngineThread,
        start_delay: float,
        turns: int,
        seed: int,
        user_len: int = 48,
        reply_len: int = 96,
    ) -> None:
        super().__init__(daemon=True)
        self.et, self.start_delay, self.turns, self.seed = et, start_delay, turns, seed
        self.rng = np.random.default_rng(seed)
        self.user_len, self.reply_len = user_len, reply_len
        self.ttfts: list[float] = []
        self.itls: list[float] = []
        self.history: list[int] = []

    def run(self) -> None:
        time.sleep(self.start_delay)
        vocab = self.et.engine.vocab_size
        for turn in range(self.turns):
            self.history += list(map(int, self.rng.integers(0, vocab, self.user_len)))
            params = self.params(turn)
            sent = time.perf_counter()
            last = None
            for out in self.et.submit(list(self.history), params):
                now = time.perf_counter()
                n = len(out.outputs[0].token_ids)
                if n:
                    if last is None:
                        self.ttfts.append(now - sent)
                    else:
                        self.itls.extend([(now - last) / n] * n)
                    last = now
                self.history += out.outputs[0].token_ids

    def params(self, turn: int) -> SamplingParams:
        """The app's defaults (what a person chats with), seeded per session and turn."""
        return chat_sampling_params(
            max_tokens=self.reply_len,
            ignore_eos=True,
            detokenize=False,
            seed=1000 * self.seed + turn,
        )


def chat_run(
    engine: LLMEngine,
    sessions: int = 8,
    turns: int = 4,
    arrival_s: float = 1.0,
    long_prompt: int = 1000,
) -> ChatResult:
    """Chat sessions arriving over `arrival_s`, each `turns` turns, on the engine thread,
    sampling with the app's defaults."""
    timer = _StepTimer(engine)
    et = EngineThread(engine, idle_wait=0.001)
    et.start()
    try:
        alone = _Session(et, 0.0, 2, seed=99)
        alone.start()
        alone.join()
        timer.reset()
        group = [_Session(et, arrival_s * i / sessions, turns, seed=i) for i in range(sessions)]
        for s in group:
            s.start()
        # While they stream, a long prompt arrives: how long until its first token?
        time.sleep(arrival_s + 0.2)
        long_ttft = float("nan")
        if long_prompt < engine.max_model_len:
            probe = _Session(et, 0.0, 1, seed=1234, user_len=long_prompt, reply_len=4)
            probe.start()
            probe.join()
            long_ttft = probe.ttfts[0] if probe.ttfts else float("nan")
        for s in group:
            s.join()
    finally:
        et.shutdown()
        timer.close()
    ttfts = [t for s in group for t in s.ttfts]
    itls = [t for s in group for t in s.itls]
    return ChatResult(
        sessions=sessions,
        turns=turns,
        ttft_p50_ms=1e3 * _percentile(ttfts, 50),
        ttft_p99_ms=1e3 * _percentile(ttfts, 99),
        itl_p50_ms=1e3 * _percentile(itls, 50),
        itl_p99_ms=1e3 * _percentile(itls, 99),
        single_itl_p50_ms=1e3 * _percentile(alone.itls, 50),
        single_itl_p99_ms=1e3 * _percentile(alone.itls, 99),
        long_prompt_tokens=long_prompt,
        long_prompt_ttft_ms=1e3 * long_ttft,
        decode_step_p50_ms=1e3 * _percentile(timer.decode, 50),
        decode_step_p99_ms=1e3 * _percentile(timer.decode, 99),
        mixed_step_p50_ms=1e3 * _percentile(timer.mixed, 50),
        mixed_step_p99_ms=1e3 * _percentile(timer.mixed, 99),
        mixed_steps=len(timer.mixed),
        gc_pauses=len(timer.gc),
        gc_max_ms=1e3 * max(timer.gc, default=0.0),
        ttfts_ms=[1e3 * t for t in ttfts],
    )


def median_of(runs: list[float]) -> float:
    return statistics.median(runs) if runs else float("nan")
