"""Small models for engine tests: a byte-level tokenizer and random weights, built in memory.

Random weights with a large spread give varied, input-dependent greedy outputs, which is what
the batching tests need (the tiny 0.02 spread of an untrained model repeats one token).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from gpu import EngineConfig, LLMEngine
from gpu.backends.cpu import CpuBackend
from gpu.loader import build_engine
from gpu.model_weights import random_hf_tensors
from weights.random_model import byte_level_tokenizer
from weights.tokenizer import Tokenizer

EOS_ID = 256
BOS_ID = 257


def byte_tokenizer() -> Tokenizer:
    """One token per byte (ids 0-255, byte-level alphabet), then <eos> (256) and <bos> (257)."""
    return Tokenizer(byte_level_tokenizer(("<eos>", "<bos>")), bos_token="<bos>", eos_token="<eos>")


def tiny_config(**overrides) -> SimpleNamespace:
    values = dict(
        vocab_size=258,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        rope_scaling=None,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    values.update(overrides)
    return SimpleNamespace(**values)


def tiny_engine(
    seed: int = 0, std: float = 0.35, config: SimpleNamespace | None = None, **engine_args
) -> LLMEngine:
    """An engine on the cpu backend over random weights, with the byte tokenizer."""
    config = config or tiny_config()
    tensors = random_hf_tensors(config, seed=seed, std=std)
    engine_args.setdefault("num_kv_blocks", 256)
    return build_engine(
        config,
        tensors.__getitem__,
        CpuBackend(),
        EngineConfig(**engine_args),
        tokenizer=byte_tokenizer(),
        eos_token_ids=frozenset({EOS_ID}),
        model_name="tiny-random",
    )


def random_prompts(count: int, seed: int = 0, low: int = 3, high: int = 60) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [
        list(map(int, rng.integers(0, 256, size=rng.integers(low, high)))) for _ in range(count)
    ]


class ScriptedExecutor:
    """A stand-in for the model: row i of a step samples script(seed, step).

    Sampling metadata carries each row's request seed and output index, so a test can give
    every request its own scripted reply without a model (requests must be non-greedy so their
    seed is passed through).
    """

    def __init__(self, script) -> None:
        self.script = script
        self.steps = []  # (num_tokens, num_seqs, num_sampled) per call

    def execute(self, batch, metadata) -> np.ndarray:
        self.steps.append((batch.num_tokens, batch.num_seqs, metadata.num_rows))
        return np.array(
            [
                self.script(int(s), int(k))
                for s, k in zip(metadata.seed, metadata.step, strict=True)
            ],
            dtype=np.int32,
        )


def scripted_engine(
    script=None, num_kv_blocks: int = 64, executor=None, **engine_args
) -> LLMEngine:
    """An LLMEngine whose 'model' is a ScriptedExecutor (for scheduler and output tests)."""
    config = tiny_config()
    engine_args.setdefault("max_num_batched_tokens", 64)
    cfg = EngineConfig(num_kv_blocks=num_kv_blocks, **engine_args)
    return LLMEngine(
        executor or ScriptedExecutor(script),
        byte_tokenizer(),
        config,
        num_kv_blocks=num_kv_blocks,
        max_model_len=config.max_position_embeddings,
        config=cfg,
        eos_token_ids=frozenset({EOS_ID}),
        model_name="scripted",
    )
