"""The small random model the examples run: SmolLM2's layout (GQA, untied LM head here) at
toy sizes, so a whole engine builds and runs on the numpy backend in a fraction of a second."""

from __future__ import annotations

import numpy as np

from gpu.backends.cpu import CpuBackend
from gpu.config import EngineConfig
from gpu.engine import LLMEngine
from gpu.loader import build_engine
from gpu.model_weights import random_hf_tensors
from gpu.presets import preset_config

SHAPES = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    tie_word_embeddings=False,
)


def tiny_config():
    return preset_config("smollm2-135m", **SHAPES)


def tiny_tensors(config) -> dict[str, np.ndarray]:
    """Hugging Face-named float32 tensors; a wide spread, so greedy replies vary with the input."""
    return random_hf_tensors(config, seed=0, std=0.2)


def tiny_engine(**settings) -> LLMEngine:
    """An LLMEngine on the numpy backend (no tokenizer: prompts are token ids)."""
    config = tiny_config()
    settings.setdefault("num_kv_blocks", 64)
    return build_engine(
        config, tiny_tensors(config).__getitem__, CpuBackend(), EngineConfig(**settings)
    )
