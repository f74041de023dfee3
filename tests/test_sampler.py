"""The numpy sampler (the oracle of the CUDA sampler) and seeded reproducibility."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import random_prompts, tiny_engine

from gpu import LLM, SamplingParams
from gpu.sampling import SamplingMetadata, uniform_from_counter
from gpu.sampling.numpy_sampler import sample, top_p_threshold


def metadata(rows: int, **values) -> SamplingMetadata:
    md = SamplingMetadata.greedy(rows)
    for name, value in values.items():
        current = getattr(md, name)
        setattr(
            md, name, np.full(rows, value, dtype=current.dtype) if np.isscalar(value) else value
        )
    return md


def draw(logits: np.ndarray, draws: int, **values) -> np.ndarray:
    """Sample one row `draws` times with different seeds; returns the token counts."""
    md = metadata(draws, seed=np.arange(draws, dtype=np.uint64), **values)
    tokens = sample(np.tile(logits, (draws, 1)), md)
    return np.bincount(tokens, minlength=logits.shape[0])


PROBS = np.array([0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.02], dtype=np.float32)
LOGITS = np.log(PROBS)


def test_uniforms_are_uniform_and_keyed():
    u = uniform_from_counter(np.uint64(3), np.uint64(0), np.arange(200_000, dtype=np.uint64))
    assert 0.0 < u.min() and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 0.005
    assert np.histogram(u, bins=10, range=(0, 1))[0].min() > 19_000
    other_step = uniform_from_counter(np.uint64(3), np.uint64(1), np.arange(10, dtype=np.uint64))
    assert not np.array_equal(u[:10], other_step)


def test_temperature_one_follows_the_distribution():
    counts = draw(LOGITS, 20_000, temperature=1.0)
    freq = counts / counts.sum()
    np.testing.assert_allclose(freq, PROBS, atol=0.012)


def test_top_p_keeps_the_smallest_nucleus():
    # top_p 0.7: 0.4 + 0.25 = 0.65 < 0.7, so the nucleus is the first three tokens.
    counts = draw(LOGITS, 20_000, temperature=1.0, top_p=0.7)
    assert counts[3:].sum() == 0
    kept = PROBS[:3] / PROBS[:3].sum()
    np.testing.assert_allclose(counts[:3] / counts.sum(), kept, atol=0.015)
    assert top_p_threshold(PROBS, 0.6) == pytest.approx(0.25)
    assert top_p_threshold(PROBS, 0.3) == pytest.approx(0.4)


def test_min_p_drops_tokens_below_a_fraction_of_the_top():
    # min_p 0.3: keep p >= 0.12 -> the first three tokens.
    counts = draw(LOGITS, 20_000, temperature=1.0, min_p=0.3)
    assert counts[3:].sum() == 0
    np.testing.assert_allclose(counts[:3] / counts.sum(), PROBS[:3] / PROBS[:3].sum(), atol=0.015)


def test_top_k_keeps_k_tokens_and_top_k_one_is_greedy():
    counts = draw(LOGITS, 5_000, temperature=1.0, top_k=2)
    assert counts[2:].sum() == 0 and counts[:2].min() > 0
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((16, 1000)).astype(np.float32)
    md = metadata(16, temperature=1.3, top_k=1, seed=np.arange(16, dtype=np.uint64))
    np.testing.assert_array_equal(sample(logits, md), logits.argmax(axis=1))


def test_penalties_follow_vllm():
    logits = np.array([[2.0, -2.0, 1.0, 0.5]], dtype=np.float32)
    md = metadata(1, repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    md.prompt_token_ids = [np.array([0], np.int32)]
    md.output_token_ids = [np.array([1, 2, 2], np.int32)]
    row = logits[0].copy()
    from gpu.sampling.numpy_sampler import apply_penalties

    apply_penalties(row, md.prompt_token_ids[0], md.output_token_ids[0], 2.0, 0.5, 0.25)
    # token 0: prompt only -> 2/2; token 1: -2*2 - 0.25 - 0.5; token 2: 1/2 - 0.5 - 0.5
    np.testing.assert_allclose(row, [1.0, -4.75, -0.5, 0.5])
    assert sample(logits, md)[0] == 0 and sample(logits, metadata(1))[0] == 0


def test_banned_tokens_are_never_sampled():
    md = metadata(4, temperature=1.0, seed=np.arange(4, dtype=np.uint64))
    md.banned_token_ids = [(0,), (0, 1), (), (0,)]
    logits = np.tile(np.array([10.0, 9.0, -5.0], np.float32), (4, 1))
    tokens = sample(logits, md)
    assert tokens[0] != 0 and tokens[1] == 2 and tokens[3] != 0


def test_seeded_requests_are_reproducible_in_any_batch():
    params = SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=1234, max_tokens=16)
    prompt = random_prompts(1, seed=11)[0]
    alone = LLM(engine=tiny_engine()).generate([prompt], params)[0].outputs[0].token_ids
    others = random_prompts(5, seed=12)
    noisy = SamplingParams(temperature=1.0, max_tokens=16)
    batch = LLM(engine=tiny_engine(max_num_batched_tokens=9)).generate(
        others[:2] + [prompt] + others[2:], [noisy, noisy, params, noisy, noisy, noisy]
    )
    assert batch[2].outputs[0].token_ids == alone
    unseeded = LLM(engine=tiny_engine()).generate([prompt] * 2, noisy)
    assert unseeded[0].outputs[0].token_ids != unseeded[1].outputs[0].token_ids


class FixedLogitsExecutor:
    """Every row sees the same logits (EOS the most likely), through the real sampler."""

    def __init__(self, logits: np.ndarray) -> None:
        self.logits = logits

    def execute(self, batch, md):
        return sample(np.tile(self.logits, (md.num_rows, 1)), md)


def test_min_tokens_masks_eos_and_stop_tokens():
    from engine_helpers import EOS_ID, scripted_engine

    logits = np.zeros(258, np.float32)
    logits[EOS_ID], logits[7], logits[65] = 10.0, 9.0, 5.0
    engine = scripted_engine(executor=FixedLogitsExecutor(logits))
    params = SamplingParams(temperature=0, max_tokens=12, min_tokens=5, stop_token_ids=[7])
    out = LLM(engine=engine).generate([[1, 2, 3]], params)[0].outputs[0]
    assert out.token_ids == [65] * 5 + [EOS_ID]
    assert out.finish_reason == "stop" and out.text == "AAAAA"
    ignore = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, stop_token_ids=[7])
    out = LLM(engine=engine).generate([[1, 2, 3]], ignore)[0].outputs[0]
    assert out.token_ids == [EOS_ID, EOS_ID, EOS_ID] and out.finish_reason == "length"
