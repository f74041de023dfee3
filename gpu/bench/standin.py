"""A GPU stand-in: an executor whose steps take a fixed device time without holding the GIL.

The chat workload's latency tail is a host effect (threads, the GIL, the engine thread's loop),
so it can be studied without a GPU: `TimedExecutor.launch` returns at once, like the CUDA
executor's, and `result()` sleeps until the step's simulated device time has passed — sleeping
releases the GIL as a CUDA event synchronisation does. Steps queue one behind the other as on
one stream: a step launched while the previous one is still "running" starts when it ends.
Everything else (scheduler, runner, engine, engine thread, the bench's sessions) is the real code.

    python -m gpu.bench.standin --sessions 8     # the chat workload on the stand-in
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from types import SimpleNamespace

import numpy as np

from gpu.config import EngineConfig
from gpu.engine import LLMEngine
from gpu.forward_batch import ForwardBatch
from gpu.sampling.metadata import SamplingMetadata


class TimedResult:
    """The ids of a step that "ends" at `deadline` (perf_counter seconds)."""

    __slots__ = ("tokens", "deadline")

    def __init__(self, tokens: np.ndarray, deadline: float) -> None:
        self.tokens, self.deadline = tokens, deadline

    def result(self) -> np.ndarray:
        """Wait, without the GIL, for the step to end (a CUDA event sync in the real one)."""
        left = self.deadline - time.perf_counter()
        if left > 0:
            time.sleep(left)
        return self.tokens


class TimedExecutor:
    """Decode steps take `decode_ms` of device time; a step with prompt tokens adds
    `prefill_us_per_token` per token. `launch_us` of host Python (holding the GIL) models the
    staging and graph replay of the real launch. Sampled ids are pseudo-random in the vocabulary."""

    def __init__(
        self,
        vocab_size: int,
        decode_ms: float = 1.2,
        prefill_us_per_token: float = 10.0,
        launch_us: float = 60.0,
        seed: int = 0,
    ) -> None:
        self.vocab_size = vocab_size
        self.decode_s = decode_ms / 1e3
        self.prefill_s_per_token = prefill_us_per_token / 1e6
        self.launch_s = launch_us / 1e6
        self.rng = np.random.default_rng(seed)
        self._busy_until = 0.0  # when the last launched step ends on the "device"

    def device_time(self, batch: ForwardBatch) -> float:
        prompt_tokens = batch.num_tokens - batch.num_seqs if batch.max_query_len > 1 else 0
        return self.decode_s + prompt_tokens * self.prefill_s_per_token

    def launch(self, batch: ForwardBatch, metadata: SamplingMetadata) -> TimedResult:
        now = time.perf_counter()
        _spin(self.launch_s)  # the host's share of a launch, with the GIL held
        start = max(now, self._busy_until)
        self._busy_until = start + self.device_time(batch)
        tokens = self.rng.integers(0, self.vocab_size, metadata.num_rows, dtype=np.int32)
        return TimedResult(tokens, self._busy_until)

    def execute(self, batch: ForwardBatch, metadata: SamplingMetadata) -> np.ndarray:
        return self.launch(batch, metadata).result()


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def standin_engine(
    decode_ms: float = 1.2,
    launch_us: float = 60.0,
    prefill_us_per_token: float = 10.0,
    vocab_size: int = 32000,
    max_model_len: int = 4096,
    async_scheduling: bool = True,
) -> LLMEngine:
    """An engine over the stand-in, sized like the bench's (no tokenizer: ids in, ids out)."""
    config = SimpleNamespace(vocab_size=vocab_size, max_position_embeddings=max_model_len)
    engine_cfg = EngineConfig(
        max_num_seqs=256, max_num_batched_tokens=2048, async_scheduling=async_scheduling
    )
    executor = TimedExecutor(vocab_size, decode_ms, prefill_us_per_token, launch_us)
    return LLMEngine(
        executor,
        None,
        config,
        num_kv_blocks=4096,
        max_model_len=max_model_len,
        config=engine_cfg,
        model_name=f"stand-in ({decode_ms} ms decode steps)",
    )


def main(argv: list[str] | None = None) -> None:
    from gpu.bench import chat_summary
    from gpu.bench.workloads import chat_run

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--decode-ms", type=float, default=1.2)
    p.add_argument("--launch-us", type=float, default=60.0)
    p.add_argument("--prefill-us", type=float, default=10.0, help="device us per prompt token")
    p.add_argument("--long-prompt", type=int, default=1000)
    p.add_argument("--no-async-scheduling", action="store_true")
    args = p.parse_args(argv)
    engine = standin_engine(
        args.decode_ms,
        args.launch_us,
        args.prefill_us,
        async_scheduling=not args.no_async_scheduling,
    )
    r = chat_run(engine, args.sessions, args.turns, long_prompt=args.long_prompt)
    print(chat_summary(dataclasses.asdict(r)))


if __name__ == "__main__":
    main()
