"""Configurations of the models we measure, as Hugging Face config.json dicts.

With random weights they let tests and the benchmark run the exact shapes of a real model
without downloading it (`tinychat bench --config llama-3.2-1b`).
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    "smollm2-135m": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "rope_scaling": None,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "bfloat16",
    },
    "llama-3.2-1b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": 128256,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
        "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009],
        "torch_dtype": "bfloat16",
    },
}


def preset_config(name: str, **overrides: Any):
    """A weights.ModelConfig for a preset; overrides (e.g. num_hidden_layers=2) shrink it."""
    from weights import ModelConfig

    if name not in PRESETS:
        raise ValueError(f"unknown config {name!r}: choose from {', '.join(PRESETS)}")
    return ModelConfig.from_dict({**PRESETS[name], **overrides})
