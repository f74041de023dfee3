"""The Llama forward, written once against the backend operations of `backends/base.py`.

    embed -> [ rmsnorm -> qkv -> rope + KV write -> paged attention -> o_proj
               -> add + rmsnorm -> gate_up -> silu * up -> down -> add + rmsnorm ] x L
          -> rows to sample -> lm_head -> logits

Every intermediate lives in a buffer allocated once for the largest step (`max_num_tokens`
query tokens, `max_num_seqs` sampled rows); a step uses the first rows of each. With no
allocation and no host-dependent shape inside, the same calls can be captured into a CUDA
graph and replayed. The residual add of each block is fused into the next RMSNorm
(`add_rmsnorm`), as vLLM does.
"""

from __future__ import annotations

from typing import Any

from gpu.backends.base import Backend
from gpu.forward_batch import ForwardBatch
from gpu.model_weights import LlamaWeights
from gpu.rope import rope_cos_sin


class LlamaModel:
    def __init__(
        self,
        config: Any,
        weights: LlamaWeights,
        backend: Backend,
        max_num_tokens: int,
        max_num_seqs: int,
        max_model_len: int,
    ) -> None:
        self.config = config
        self.weights = weights
        self.backend = backend
        self.kv_caches: list[tuple[Any, Any]] = []  # set once memory for it is known
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = self.head_dim**-0.5
        self.eps = config.rms_norm_eps
        cos, sin = rope_cos_sin(
            self.head_dim, config.rope_theta, max_model_len, config.rope_scaling
        )
        self.cos = backend.weight(cos, "vector")
        self.sin = backend.weight(sin, "vector")

        h, t, s = config.hidden_size, max_num_tokens, max_num_seqs
        qkv_size = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        self.residual = backend.empty((t, h), "f32")
        self.proj_out = backend.empty((t, h), "f32")
        self.normed = backend.empty((t, h), "act")
        self.qkv = backend.empty((t, qkv_size), "f32")
        self.attn_out = backend.empty((t, self.num_heads * self.head_dim), "act")
        self.gate_up = backend.empty((t, 2 * config.intermediate_size), "f32")
        self.mlp_act = backend.empty((t, config.intermediate_size), "act")
        self.last_rows = backend.empty((s, h), "act")
        self.logits = backend.empty((s, config.vocab_size), "f32")

    def forward(self, batch: ForwardBatch, num_logits: int) -> Any:
        """Run one step; returns logits [num_logits, V] for batch.logits_indices."""
        ops, w, t = self.backend, self.weights, batch.num_tokens
        residual, proj_out, normed = self.residual[:t], self.proj_out[:t], self.normed[:t]
        qkv, attn_out = self.qkv[:t], self.attn_out[:t]
        gate_up, mlp_act = self.gate_up[:t], self.mlp_act[:t]

        ops.embed(batch.input_ids, w.embed_tokens, residual)
        ops.rmsnorm(residual, w.layers[0].input_layernorm, self.eps, normed)
        for i, layer in enumerate(w.layers):
            k_cache, v_cache = self.kv_caches[i]
            ops.linear(normed, layer.qkv_proj, qkv)
            ops.rope_kv_write(
                qkv, batch.positions, self.cos, self.sin, k_cache, v_cache, batch.slot_mapping,
                self.num_heads, self.num_kv_heads, self.head_dim,
            )  # fmt: skip
            ops.attention(
                qkv, k_cache, v_cache, batch,
                self.num_heads, self.num_kv_heads, self.head_dim, self.scale, attn_out,
            )  # fmt: skip
            ops.linear(attn_out, layer.o_proj, proj_out)
            ops.add_rmsnorm(proj_out, residual, layer.post_attention_layernorm, self.eps, normed)
            ops.linear(normed, layer.gate_up_proj, gate_up)
            ops.silu_mul(gate_up, mlp_act)
            ops.linear(mlp_act, layer.down_proj, proj_out)
            next_norm = w.layers[i + 1].input_layernorm if i + 1 < len(w.layers) else w.norm
            ops.add_rmsnorm(proj_out, residual, next_norm, self.eps, normed)

        last_rows, logits = self.last_rows[:num_logits], self.logits[:num_logits]
        ops.gather_rows(normed, batch.logits_indices, last_rows)
        ops.linear(last_rows, w.lm_head, logits)
        return logits
