"""Single-token inference: the whole Llama forward for a one-token prompt, in plain numpy.

With one token at position 0, two parts of the model fall away: RoPE rotates by an angle of 0
(q and k are unchanged), and attention has one score to normalise, so softmax gives it weight 1
and each query head's output is the v of its KV head. What is left is the skeleton every other
chapter fills in: embedding, then per layer RMSNorm -> q, k, v -> attention -> o_proj + residual
-> RMSNorm -> SiLU(gate) * up -> down + residual, then the final norm, the LM head and argmax.

The script runs that skeleton on small random weights and checks its logits against the engine's
own forward (gpu/model.py: LlamaModel.forward on the numpy backend) for the same token, driven
through a hand-made one-row ForwardBatch: one token, one sequence, KV slot 0 of block 0.

    python docs/examples/one_token.py
"""

from __future__ import annotations

import numpy as np
from tiny_model import tiny_config, tiny_tensors

from gpu.backends.cpu import CpuBackend
from gpu.forward_batch import ForwardBatch
from gpu.model import LlamaModel
from gpu.model_weights import load_llama_weights


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x) + eps) * weight


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def plain_forward(t: dict[str, np.ndarray], config, token: int) -> np.ndarray:
    """The logits after `token` alone, from the Hugging Face tensors as they are."""
    eps = config.rms_norm_eps
    group = config.num_attention_heads // config.num_key_value_heads
    x = t["model.embed_tokens.weight"][token]
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        h = rmsnorm(x, t[p + "input_layernorm.weight"], eps)
        v = t[p + "self_attn.v_proj.weight"] @ h  # q and k are computed and cached, but with a
        # single key the attention weights are [1.0]: each query head returns its KV head's v.
        heads = np.repeat(v.reshape(config.num_key_value_heads, config.head_dim), group, axis=0)
        x = x + t[p + "self_attn.o_proj.weight"] @ heads.reshape(-1)
        h = rmsnorm(x, t[p + "post_attention_layernorm.weight"], eps)
        gate, up = t[p + "mlp.gate_proj.weight"] @ h, t[p + "mlp.up_proj.weight"] @ h
        x = x + t[p + "mlp.down_proj.weight"] @ (silu(gate) * up)
    return t["lm_head.weight"] @ rmsnorm(x, t["model.norm.weight"], eps)


def engine_forward(t: dict[str, np.ndarray], config, token: int) -> np.ndarray:
    """The same token through LlamaModel.forward on the numpy backend."""
    backend = CpuBackend()
    weights = load_llama_weights(t.__getitem__, config.num_hidden_layers, False, backend)
    model = LlamaModel(config, weights, backend, max_num_tokens=8, max_num_seqs=1, max_model_len=64)
    model.kv_caches = backend.allocate_kv_cache(
        config.num_hidden_layers, 1, 16, config.num_key_value_heads, config.head_dim
    )

    def ints(*values: int) -> np.ndarray:
        return np.array(values, dtype=np.int32)

    batch = ForwardBatch(
        num_tokens=1, num_seqs=1, input_ids=ints(token), positions=ints(0),
        slot_mapping=ints(0), query_start_loc=ints(0, 1), seq_lens=ints(1),
        block_tables=ints(0).reshape(1, 1), logits_indices=ints(0), max_query_len=1,
        max_seq_len=1,
    )  # fmt: skip
    return np.array(model.forward(batch, num_logits=1)[0])


def main() -> None:
    config = tiny_config()
    tensors = tiny_tensors(config)
    token = 42
    want = plain_forward(tensors, config, token)
    got = engine_forward(tensors, config, token)
    err = float(np.abs(got - want).max() / np.abs(want).max())
    assert err < 1e-4, err
    assert int(np.argmax(got)) == int(np.argmax(want))
    print(f"next token after {token}: {int(np.argmax(want))} (both ways)")
    print(f"largest logit difference, relative to the largest logit: {err:.1e}")


if __name__ == "__main__":
    main()
