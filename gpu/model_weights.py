"""Llama weights as the forward wants them: q/k/v merged into one projection, gate/up into one.

A decode step is bound by reading weights, and each matrix product is a launch: one [q; k; v]
product instead of three, and one [gate; up] instead of two, read the same bytes in fewer,
larger calls. The merge happens once, at load time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu.backends.base import Backend


@dataclass
class LayerWeights:
    input_layernorm: Any  # [H]
    qkv_proj: Any  # [(nh + 2 nkv) * hd, H]
    o_proj: Any  # [H, nh * hd]
    post_attention_layernorm: Any  # [H]
    gate_up_proj: Any  # [2 I, H]
    down_proj: Any  # [H, I]


@dataclass
class LlamaWeights:
    embed_tokens: Any  # [V, H]
    layers: list[LayerWeights]
    norm: Any  # [H]
    lm_head: Any  # [V, H]; the embedding itself when tied


def hf_tensor_names(num_layers: int, tie_word_embeddings: bool) -> list[str]:
    names = ["model.embed_tokens.weight", "model.norm.weight"]
    if not tie_word_embeddings:
        names.append("lm_head.weight")
    for i in range(num_layers):
        p = f"model.layers.{i}."
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
        names += [p + f"self_attn.{x}_proj.weight" for x in "qkvo"]
        names += [p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
    return names


def load_llama_weights(
    get: Any, num_layers: int, tie_word_embeddings: bool, backend: Backend
) -> LlamaWeights:
    """Build the merged weights on `backend`.

    `get(name)` returns a host array for an HF tensor name: float32, or uint16 bf16 bits (the
    cuda backend keeps bf16 as it is; the cpu backend upcasts).
    """

    def cat(*names: str) -> np.ndarray:
        return np.concatenate([get(n) for n in names], axis=0)

    layers = []
    for i in range(num_layers):
        p = f"model.layers.{i}."
        layers.append(
            LayerWeights(
                input_layernorm=backend.weight(get(p + "input_layernorm.weight"), "vector"),
                qkv_proj=backend.weight(
                    cat(*(p + f"self_attn.{x}_proj.weight" for x in "qkv")), "matrix"
                ),
                o_proj=backend.weight(get(p + "self_attn.o_proj.weight"), "matrix"),
                post_attention_layernorm=backend.weight(
                    get(p + "post_attention_layernorm.weight"), "vector"
                ),
                gate_up_proj=backend.weight(
                    cat(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"), "matrix"
                ),
                down_proj=backend.weight(get(p + "mlp.down_proj.weight"), "matrix"),
            )
        )
    embed = backend.weight(get("model.embed_tokens.weight"), "embedding")
    lm_head = embed if tie_word_embeddings else backend.weight(get("lm_head.weight"), "matrix")
    norm = backend.weight(get("model.norm.weight"), "vector")
    return LlamaWeights(embed_tokens=embed, layers=layers, norm=norm, lm_head=lm_head)


def random_hf_tensors(config: Any, seed: int = 0, std: float = 0.02) -> dict[str, np.ndarray]:
    """Random float32 weights under HF Llama names for `config`, reproducible from `seed`.

    Used by tests and the benchmark (no download needed) and by the dev script that runs the
    same weights through transformers. Norm weights are drawn around 1 so they matter.
    """
    rng = np.random.default_rng(seed)
    h, i, hd = config.hidden_size, config.intermediate_size, config.head_dim
    nh, nkv = config.num_attention_heads, config.num_key_value_heads

    def mat(rows: int, cols: int) -> np.ndarray:
        values = rng.standard_normal((rows, cols), dtype=np.float32)
        values *= np.float32(std)
        return values

    def vec(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    tensors: dict[str, np.ndarray] = {"model.embed_tokens.weight": mat(config.vocab_size, h)}
    for layer in range(config.num_hidden_layers):
        p = f"model.layers.{layer}."
        tensors[p + "input_layernorm.weight"] = vec(h)
        tensors[p + "self_attn.q_proj.weight"] = mat(nh * hd, h)
        tensors[p + "self_attn.k_proj.weight"] = mat(nkv * hd, h)
        tensors[p + "self_attn.v_proj.weight"] = mat(nkv * hd, h)
        tensors[p + "self_attn.o_proj.weight"] = mat(h, nh * hd)
        tensors[p + "post_attention_layernorm.weight"] = vec(h)
        tensors[p + "mlp.gate_proj.weight"] = mat(i, h)
        tensors[p + "mlp.up_proj.weight"] = mat(i, h)
        tensors[p + "mlp.down_proj.weight"] = mat(h, i)
    tensors["model.norm.weight"] = vec(h)
    if not config.tie_word_embeddings:
        tensors["lm_head.weight"] = mat(config.vocab_size, h)
    return tensors
