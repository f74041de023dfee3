"""The Llama forward, written once against the backend operations of `backends/base.py`.

    embed -> [ rmsnorm + qkv + rope + KV write -> paged attention -> o_proj + residual
               -> rmsnorm + gate_up + silu*up -> down + residual ] x L
          -> rows to sample -> rmsnorm + lm_head -> logits

Each "+" is one backend op: the ops around a matrix product are fused into it (RMSNorm before
it, the residual add or SiLU after it), because a decode step is a chain of small launches and
each one that disappears is time saved. The cuda backend runs them as single kernels for decode
steps (gpu/kernels/gemv.py) and as their compositions (gpu/backends/base.py: ComposedOps) for
prefill; the cpu backend always runs the compositions. A backend may also take a whole decode
step in one call (`decode_forward`): the CPU's q8 path runs it as one parallel region, because
waking its threads for each of a step's 151 ops cost a fifth of the step.

Every intermediate lives in a buffer allocated once for the largest step (`max_num_tokens`
query tokens, `max_num_seqs` sampled rows); a step uses the first rows of each. With no
allocation and no host-dependent shape inside, the same calls can be captured into a CUDA
graph and replayed.
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
        self.gate_up = backend.empty((t, 2 * config.intermediate_size), "act")
        self.mlp_act = backend.empty((t, config.intermediate_size), "act")
        self.last_residual = backend.empty((s, h), "f32")
        self.last_normed = backend.empty((s, h), "act")
        self.logits = backend.empty((s, config.vocab_size), "f32")

    def forward(self, batch: ForwardBatch, num_logits: int) -> Any:
        """Run one step; returns logits [num_logits, V] for batch.logits_indices."""
        ops, w, t, eps = self.backend, self.weights, batch.num_tokens, self.eps
        residual, proj_out, normed = self.residual[:t], self.proj_out[:t], self.normed[:t]
        qkv, attn_out = self.qkv[:t], self.attn_out[:t]
        gate_up, mlp_act = self.gate_up[:t], self.mlp_act[:t]

        ops.embed(batch.input_ids, w.embed_tokens, residual, batch.prev_rows, batch.sampled_prev)
        logits = self.logits[:num_logits]
        if batch.max_query_len == 1 and ops.decode_forward(self, batch, logits):
            return logits
        for i, layer in enumerate(w.layers):
            k_cache, v_cache = self.kv_caches[i]
            ops.rmsnorm_qkv_rope(
                residual, layer.input_layernorm, eps, layer.qkv_proj, qkv, normed,
                batch.positions, self.cos, self.sin, k_cache, v_cache, batch.slot_mapping,
                self.num_heads, self.num_kv_heads, self.head_dim,
            )  # fmt: skip
            ops.attention(
                qkv, k_cache, v_cache, batch,
                self.num_heads, self.num_kv_heads, self.head_dim, self.scale, attn_out,
            )  # fmt: skip
            ops.linear_residual(attn_out, layer.o_proj, residual, proj_out)
            ops.rmsnorm_gate_up_silu(
                residual, layer.post_attention_layernorm, eps, layer.gate_up_proj, mlp_act,
                normed, gate_up,
            )  # fmt: skip
            ops.linear_residual(mlp_act, layer.down_proj, residual, proj_out)

        # Only the rows that are sampled go through the final norm and the LM head. In a
        # decode step every row is sampled, in order (logits_indices = 0, 1, ...): no gather.
        if batch.max_query_len == 1 and num_logits == t:
            rows = residual
        else:
            rows = self.last_residual[:num_logits]
            ops.gather_rows(residual, batch.logits_indices, rows)
        ops.rmsnorm_linear(rows, w.norm, eps, w.lm_head, logits, self.last_normed[:num_logits])
        return logits
