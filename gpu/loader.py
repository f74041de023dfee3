"""Building an engine: model files -> weights on a backend -> KV cache -> LLMEngine -> kernels.

The order matters on the GPU: weights first, then the activation buffers of the largest step,
and only then the KV cache, which takes what memory is left (vLLM's gpu_memory_utilization).

An engine is ready only once every kernel a reply can need is compiled: the executor's
`precompile` (cuda: gpu/backends/cuda/precompile.py) covers every bucket of every step shape,
then one short request with every sampling feature on (`warm_up_request`) runs through the
engine for real, so that a path outside the buckets (a per-request state write, say) has run
once too. `progress(stage, done, total)` hears about each stage: the app's loading line and
the CLI's progress bar show it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from gpu.backends import get_backend
from gpu.backends.base import Backend
from gpu.config import EngineConfig
from gpu.engine import LLMEngine
from gpu.model import LlamaModel
from gpu.model_runner import EagerExecutor
from gpu.model_weights import load_llama_weights
from gpu.sampling_params import SamplingParams
from weights.errors import ProgressFn, report

log = logging.getLogger(__name__)

DEFAULT_MAX_BATCHED_TOKENS = {"cpu": 512, "cuda": 4096}


def kv_bytes_per_block(model_config: Any, block_size: int, element_bytes: int) -> int:
    c = model_config
    return c.num_hidden_layers * 2 * block_size * c.num_key_value_heads * c.head_dim * element_bytes


def build_engine(
    model_config: Any,
    get_tensor: Callable[[str], np.ndarray],
    backend: Backend,
    config: EngineConfig | None = None,
    tokenizer: Any = None,
    eos_token_ids: frozenset[int] = frozenset(),
    model_name: str = "",
    progress: ProgressFn | None = None,
) -> LLMEngine:
    """An engine over weights given by name (`get_tensor(hf_name)` -> float32 or bf16 bits),
    with its kernels compiled."""
    config = config or EngineConfig()
    report(progress, "loading weights", 0, 0)
    c = model_config
    max_model_len = config.max_model_len or c.max_position_embeddings
    max_tokens = config.max_num_batched_tokens or DEFAULT_MAX_BATCHED_TOKENS[backend.name]
    max_tokens = max(max_tokens, config.max_num_seqs)
    config.max_num_batched_tokens = max_tokens

    weights = load_llama_weights(get_tensor, c.num_hidden_layers, c.tie_word_embeddings, backend)
    getattr(backend, "weights_loaded", lambda: None)()  # the cpu's quantized path: cache them
    model = LlamaModel(c, weights, backend, max_tokens, config.max_num_seqs, max_model_len)
    per_block = kv_bytes_per_block(c, config.block_size, backend.kv_element_bytes)
    num_blocks = config.num_kv_blocks or backend.num_kv_blocks(per_block, config)
    model.kv_caches = backend.allocate_kv_cache(
        c.num_hidden_layers, num_blocks, config.block_size, c.num_key_value_heads, c.head_dim
    )
    executor = getattr(backend, "create_executor", None)
    executor = executor(model, config) if executor else EagerExecutor(model, backend)
    engine = LLMEngine(
        executor,
        tokenizer,
        c,
        num_kv_blocks=num_blocks,
        max_model_len=max_model_len,
        config=config,
        eos_token_ids=eos_token_ids,
        model_name=model_name,
        device=backend.name,
    )
    precompile = getattr(executor, "precompile", None)
    if precompile is not None and precompile(progress) is not None:  # None: nothing compiles
        report(progress, getattr(executor, "warm_up_stage", "warming up"), 0, 0)
        warm_up_request(engine)
    if config.capture_graphs_at_start and hasattr(executor, "capture_all"):
        report(progress, "capturing CUDA graphs", 0, 0)
        log.info("captured the CUDA graphs of every decode and burst bucket in %.1f s",
                 executor.capture_all())  # fmt: skip
    return engine


def warm_up_request(engine: LLMEngine) -> None:
    """Run one short request with every sampling feature on (penalties, a min_tokens ban,
    top-k, top-p, min-p), and a greedy one beside it, to the end: whatever such a reply runs
    outside the precompiled steps has then run once before the engine is ready."""
    vocab = engine.vocab_size
    prompt = [i % vocab for i in range(1, 9)]
    everything = SamplingParams(
        temperature=0.7, top_k=50, top_p=0.9, min_p=0.05, repetition_penalty=1.1,
        presence_penalty=0.1, frequency_penalty=0.1, min_tokens=2, max_tokens=3, seed=0,
        stop_token_ids=[vocab - 1], ignore_eos=True, detokenize=False,
    )  # fmt: skip
    greedy = SamplingParams(
        temperature=0.0, max_tokens=3, seed=0, ignore_eos=True, detokenize=False
    )
    # Seeded, and ids of their own: the engine's stream of seeds and request ids is untouched.
    ids = [
        engine.add_request(prompt, p, request_id=f"warm-up-{i}")
        for i, p in enumerate((everything, greedy))
    ]
    try:
        while engine.has_unfinished_requests():
            engine.step()
    except BaseException:
        engine.abort_request(ids)
        raise


def create_engine(
    model: str | None = None,
    device: str = "auto",
    config: EngineConfig | None = None,
    progress: ProgressFn | None = None,
) -> LLMEngine:
    """Resolve a model (a folder, a cached HF repo id, a .gguf, or None for the default),
    check it, and build an engine for it on `device`."""
    from weights import open_model, resolve_model

    files = open_model(resolve_model(model, progress))
    config = config or EngineConfig()
    backend = get_backend(device, config.precision, config.cpu_threads, config.batch_invariant)
    if hasattr(backend, "use_weight_cache"):  # the cpu's quantized path: quantize once
        backend.use_weight_cache(files.folder)
    tensors = files.tensors()
    if backend.weight_format == "bf16":
        get = lambda name: tensors[name].bf16_bits()
    elif backend.weight_format == "stored":  # bf16 bits as stored: upcast where they are used
        get = lambda name: _as_stored(tensors[name])
    else:
        get = lambda name: tensors[name].float32()
    eos = set(files.config.eos_token_ids) | set(files.generation_config.eos_token_ids)
    if files.tokenizer.eos_token_id is not None:
        eos.add(files.tokenizer.eos_token_id)
    return build_engine(
        files.config,
        get,
        backend,
        config,
        tokenizer=files.tokenizer,
        eos_token_ids=frozenset(eos),
        model_name=files.name,
        progress=progress,
    )


def _as_stored(tensor: Any) -> np.ndarray:
    """A BF16 tensor's bits as stored (a view of the file: nothing read yet), others float32."""
    return tensor.data if tensor.dtype == "BF16" else tensor.float32()
