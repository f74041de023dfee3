"""The Llama forward on the cpu backend against a dense, unpaged reference written from the
paper's equations, and chunked prefill against one-shot prefill."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import tiny_config

from gpu.backends.cpu import CpuBackend
from gpu.forward_batch import ForwardBatch
from gpu.model import LlamaModel
from gpu.model_weights import load_llama_weights, random_hf_tensors
from gpu.rope import rope_cos_sin

BLOCK = 16


def dense_reference(config, tensors, tokens: list[int]) -> np.ndarray:
    """Logits of every position, no KV cache, no paging, float64."""
    t = {k: v.astype(np.float64) for k, v in tensors.items()}
    nh, nkv, hd = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    n = len(tokens)
    cos, sin = (
        a.astype(np.float64) for a in rope_cos_sin(hd, config.rope_theta, n, config.rope_scaling)
    )
    cos, sin = np.concatenate([cos, cos], -1)[:, None], np.concatenate([sin, sin], -1)[:, None]

    def norm(x, w):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + config.rms_norm_eps) * w

    def rope(x):
        half = hd // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], -1)
        return x * cos + rotated * sin

    x = t["model.embed_tokens.weight"][tokens]
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        h = norm(x, t[p + "input_layernorm.weight"])
        q = rope((h @ t[p + "self_attn.q_proj.weight"].T).reshape(n, nh, hd))
        k = rope((h @ t[p + "self_attn.k_proj.weight"].T).reshape(n, nkv, hd))
        v = (h @ t[p + "self_attn.v_proj.weight"].T).reshape(n, nkv, hd)
        k, v = np.repeat(k, nh // nkv, axis=1), np.repeat(v, nh // nkv, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(n, nh * hd)
        x = x + attn @ t[p + "self_attn.o_proj.weight"].T
        h = norm(x, t[p + "post_attention_layernorm.weight"])
        gate, up = h @ t[p + "mlp.gate_proj.weight"].T, h @ t[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ t[p + "mlp.down_proj.weight"].T
    x = norm(x, t["model.norm.weight"])
    head = t["model.embed_tokens.weight"] if config.tie_word_embeddings else t["lm_head.weight"]
    return x @ head.T


class PagedRunner:
    """Drives LlamaModel directly with hand-built batches over a shuffled block table."""

    def __init__(self, config, tensors, num_blocks: int = 32) -> None:
        backend = CpuBackend()
        weights = load_llama_weights(
            tensors.__getitem__, config.num_hidden_layers, config.tie_word_embeddings, backend
        )
        self.model = LlamaModel(config, weights, backend, 512, 64, config.max_position_embeddings)
        self.model.kv_caches = backend.allocate_kv_cache(
            config.num_hidden_layers, num_blocks, BLOCK, config.num_key_value_heads, config.head_dim
        )
        # Non-contiguous, out-of-order blocks, as after a busy while.
        self.block_table = np.random.default_rng(0).permutation(num_blocks).astype(np.int32)

    def run(self, tokens: list[int], start: int) -> np.ndarray:
        """Compute tokens[start:] given that tokens[:start] are cached; logits of every row."""
        n = len(tokens) - start
        pos = np.arange(start, len(tokens), dtype=np.int32)
        batch = ForwardBatch(
            num_tokens=n,
            num_seqs=1,
            input_ids=np.asarray(tokens[start:], np.int32),
            positions=pos,
            slot_mapping=(self.block_table[pos // BLOCK] * BLOCK + pos % BLOCK).astype(np.int32),
            query_start_loc=np.array([0, n], np.int32),
            seq_lens=np.array([len(tokens)], np.int32),
            block_tables=self.block_table[None, :],
            logits_indices=np.arange(n, dtype=np.int32),
            max_query_len=n,
            max_seq_len=len(tokens),
        )
        return np.array(self.model.forward(batch, n))


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"num_attention_heads": 6, "num_key_value_heads": 2, "tie_word_embeddings": True},
        {"num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 8},
    ],
    ids=["gqa2", "gqa3-tied", "gqa4"],
)
def test_prefill_matches_the_dense_reference(overrides):
    config = tiny_config(**overrides)
    tensors = random_hf_tensors(config, seed=3, std=0.2)
    tokens = list(np.random.default_rng(1).integers(0, config.vocab_size, 37))
    expected = dense_reference(config, tensors, tokens)
    got = PagedRunner(config, tensors).run(tokens, 0)
    np.testing.assert_allclose(got, expected, rtol=2e-4, atol=2e-4)


def test_chunked_prefill_and_decode_match_one_shot_prefill():
    config = tiny_config()
    tensors = random_hf_tensors(config, seed=4, std=0.2)
    tokens = list(np.random.default_rng(2).integers(0, config.vocab_size, 45))
    one_shot = PagedRunner(config, tensors).run(tokens, 0)
    runner = PagedRunner(config, tensors)
    rows = []
    for lo, hi in [(0, 7), (7, 16), (16, 33), (33, 34), (34, 45)]:  # chunks across blocks
        rows.append(runner.run(tokens[:hi], lo))
    np.testing.assert_allclose(np.concatenate(rows), one_shot, rtol=1e-5, atol=1e-5)


def test_llama3_rope_scaling_matches_the_reference_formula():
    from types import SimpleNamespace

    scaling = SimpleNamespace(
        rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )  # fmt: skip
    from gpu.rope import rope_inv_freq

    plain = rope_inv_freq(64, 500000.0)
    scaled = rope_inv_freq(64, 500000.0, scaling)
    wavelen = 2 * np.pi / plain
    high = wavelen < 8192 / 4
    low = wavelen > 8192 / 1
    np.testing.assert_array_equal(scaled[high], plain[high])  # short wavelengths untouched
    np.testing.assert_allclose(scaled[low], plain[low] / 32, rtol=1e-6)  # long ones / factor
    mid = ~high & ~low
    assert mid.any()
    assert np.all((scaled[mid] < plain[mid]) & (scaled[mid] > plain[mid] / 32))
