"""Building an engine: model files -> weights on a backend -> KV cache -> LLMEngine.

The order matters on the GPU: weights first, then the activation buffers of the largest step,
and only then the KV cache, which takes what memory is left (vLLM's gpu_memory_utilization).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from gpu.backends import get_backend
from gpu.backends.base import Backend
from gpu.config import EngineConfig
from gpu.engine import LLMEngine
from gpu.executor import EagerExecutor
from gpu.model import LlamaModel
from gpu.model_weights import load_llama_weights

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
) -> LLMEngine:
    """An engine over weights given by name (`get_tensor(hf_name)` -> float32 or bf16 bits)."""
    config = config or EngineConfig()
    c = model_config
    max_model_len = config.max_model_len or c.max_position_embeddings
    max_tokens = config.max_num_batched_tokens or DEFAULT_MAX_BATCHED_TOKENS[backend.name]
    max_tokens = max(max_tokens, config.max_num_seqs)
    config.max_num_batched_tokens = max_tokens

    weights = load_llama_weights(get_tensor, c.num_hidden_layers, c.tie_word_embeddings, backend)
    model = LlamaModel(c, weights, backend, max_tokens, config.max_num_seqs, max_model_len)
    per_block = kv_bytes_per_block(c, config.block_size, backend.kv_element_bytes)
    num_blocks = config.num_kv_blocks or backend.num_kv_blocks(per_block, config)
    model.kv_caches = backend.allocate_kv_cache(
        c.num_hidden_layers, num_blocks, config.block_size, c.num_key_value_heads, c.head_dim
    )
    executor = getattr(backend, "create_executor", None)
    executor = executor(model, config) if executor else EagerExecutor(model, backend)
    return LLMEngine(
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


def create_engine(
    model: str | None = None,
    device: str = "auto",
    config: EngineConfig | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> LLMEngine:
    """Resolve a model (a folder, a cached HF repo id, a .gguf, or None for the default),
    check it, and build an engine for it on `device`."""
    from weights import open_model, resolve_model

    files = open_model(resolve_model(model, progress))
    backend = get_backend(device)
    tensors = files.tensors()
    if backend.weight_format == "bf16":
        get = lambda name: tensors[name].bf16_bits()
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
    )
