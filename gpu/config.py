"""Engine settings (vLLM's names where vLLM has one)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineConfig:
    block_size: int = 16  # tokens per KV block
    max_num_seqs: int = 256  # sequences running at once
    max_num_batched_tokens: int | None = None  # token budget of one step (None: per backend)
    max_model_len: int | None = None  # context length (None: the model's, capped by the cache)
    num_kv_blocks: int | None = None  # None: sized from memory
    gpu_memory_utilization: float = 0.9  # fraction of the GPU's memory tinychat may use
    cpu_kv_cache_bytes: int = 1 << 30  # the cpu backend's KV cache (vLLM's CPU KV space)
    enable_prefix_caching: bool = True
    enforce_eager: bool = False  # cuda: never replay CUDA graphs (vLLM's name)
    # Seeds the seeds of requests that bring none; None: fresh OS entropy per engine, so
    # unseeded requests differ from run to run (a request's own seed always reproduces).
    seed: int | None = None
    # Launch step N+1 before waiting for step N's tokens (vLLM's async scheduling): the host's
    # part of a step overlaps the device's. Same tokens either way; False: strictly serial.
    async_scheduling: bool = True
    # The cpu backend's weights: "float32" (the numpy oracle), "q8" (Q8_0) or "q4" (Q4_1)
    # blocks through Numba kernels; None: the device's default (cpu: "q8"). cuda: bf16, always.
    precision: str | None = None
    # Threads of the cpu backend's products; None: every core the process may use (the app
    # leaves its UI one where there are more than two: chat_app.launch.app_cpu_threads).
    cpu_threads: int | None = None
    # cuda: every op sums a row's numbers in an order that does not depend on the batch, so a
    # seeded request gives the same tokens alone and among any others (vLLM's batch-invariant
    # mode, opt-in there too: it costs speed; gpu/backends/cuda/batch_invariant.py). The cpu
    # backend is batch-invariant always.
    batch_invariant: bool = False
    # cuda: capture the CUDA graphs of every decode batch and of the prefill/mixed steps a
    # burst of chat turns makes (executor.CAPTURE_MIXED_SEQS / _TOKENS) before the engine is
    # ready, not the first time each comes up (an eager step and a capture then delay that
    # step's tokens ~50 ms). It lengthens start-up: `tinychat serve` does it, the app does not.
    capture_graphs_at_start: bool = False

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError("block_size must be positive")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.precision not in (None, "float32", "q8", "q4"):
            raise ValueError(f"precision must be float32, q8 or q4, got {self.precision!r}")
        for name in (
            "max_num_seqs", "max_num_batched_tokens", "max_model_len", "num_kv_blocks",
            "cpu_threads",
        ):  # fmt: skip
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be positive, got {value}")
