"""The numpy sampler (the oracle of the CUDA sampler) and seeded reproducibility."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from engine_helpers import EOS_ID, byte_tokenizer, random_prompts, tiny_config, tiny_engine

from gpu import LLM, EngineConfig, SamplingParams
from gpu.backends.cpu import CpuBackend
from gpu.loader import build_engine
from gpu.model_weights import random_hf_tensors
from gpu.sampling import SamplingMetadata, gumbel_noise, uniform_from_counter
from gpu.sampling.numpy_sampler import (
    PEAKED,
    fast_top_p_threshold,
    sample,
    top_p_threshold,
)
from gpu.sampling.rng import MIX1, MIX2, SEED_MUL, STEP_MUL, row_key, token_hash
from gpu.sampling.token_state import (
    BAN_BIT,
    PROMPT_BIT,
    apply_state,
    new_state,
    row_state,
    write_states,
)


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


def test_the_fast_path_draws_the_twins_tokens():
    """sample(fast=True) (the CPU fast path's: top-p without sorting the row, noise for the
    kept ids alone) gives the twin's tokens: peaked rows whose nucleus ends among the few
    probabilities near the top, flat rows that take the binned keys, ties, -inf, min_p and
    top_k zeros."""
    rng = np.random.default_rng(7)
    rows, vocab = 12, 5 * PEAKED + 37  # more ids than the peaked path sorts
    logits = rng.standard_normal((rows, vocab)) * rng.choice([0.2, 1.0, 3.0, 5.0], (rows, 1))
    logits = logits.astype(np.float32)
    logits[0, :9] = logits[0].max()  # ties at the top
    logits[1, rng.integers(0, vocab, 300)] = -np.inf
    logits[2] = 0.5  # all equal
    md = metadata(
        rows,
        temperature=rng.choice([0.5, 0.7, 1.0, 1.3], rows).astype(np.float32),
        top_p=np.array([0.9, 0.5, 0.9, 0.99, 0.7, 0.95, 0.9, 0.3, 1.0, 0.8, 0.9, 0.6], np.float32),
        top_k=np.array([0, 0, 0, 50, 0, 3000, 0, 0, 20, 0, 0, 0], np.int32),
        min_p=np.array([0, 0, 0, 0, 0.05, 0, 0.3, 0, 0, 0, 0.01, 0], np.float32),
        seed=rng.integers(0, 2**63, rows).astype(np.uint64),
        step=rng.integers(0, 1000, rows).astype(np.uint64),
    )
    for step in range(3):
        md.step = md.step + np.uint64(step)
        assert sample(logits, md, fast=True).tolist() == sample(logits, md).tolist()


@pytest.mark.parametrize("spread", [0.0, 0.05, 0.3, 1.0, 3.0, 8.0])
def test_fast_top_p_threshold_is_the_twins(spread):
    """Both of fast_top_p_threshold's paths (the peaked rows' sort near the top, the flat rows'
    binned keys) give the sorting twin's threshold, with zeros (dropped tokens), ties at the
    cut and all-equal rows."""
    rng = np.random.default_rng(int(spread * 100) + 1)
    for _ in range(4):
        x = (rng.standard_normal(49_152) * spread).astype(np.float32)
        x[rng.integers(0, len(x), 64)] = x.max()  # ties at the top
        x[rng.integers(0, len(x), 2_000)] = -np.inf  # min_p / top_k drops: zero probability
        probs = np.exp(x - x.max()).astype(np.float32)
        probs /= probs.sum()
        for top_p in (0.05, 0.5, 0.9, 0.99):
            assert fast_top_p_threshold(probs, top_p) == top_p_threshold(probs, top_p)


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


def with_state(md: SamplingMetadata, vocab: int, rows: list[tuple]) -> np.ndarray:
    """Give row i of md the token state row_state(*rows[i]) (None: no state); returns the
    table with the writes applied, as a backend does before it samples."""
    state = new_state(len(rows) + 1, vocab)
    md.state_rows = np.array([-1 if r is None else i + 1 for i, r in enumerate(rows)], np.int32)
    md.state_writes = [(i + 1, *row_state(*r, vocab)) for i, r in enumerate(rows) if r is not None]
    write_states(state, md.state_writes)
    return state


def test_penalties_follow_vllm():
    logits = np.array([[2.0, -2.0, 1.0, 0.5]], dtype=np.float32)
    md = metadata(1, repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    state = with_state(md, 4, [([0], [1, 2, 2], ())])
    assert state[1].tolist() == [PROMPT_BIT, 1, 2, 0]
    row = logits[0].copy()
    apply_state(row, state[1], False, 2.0, 0.5, 0.25)
    # token 0: prompt only -> 2/2; token 1: -2*2 - 0.25 - 0.5; token 2: 1/2 - 0.5 - 0.5
    np.testing.assert_allclose(row, [1.0, -4.75, -0.5, 0.5])
    assert sample(logits, md, state)[0] == 0 and sample(logits, metadata(1))[0] == 0
    assert state[1].tolist() == [PROMPT_BIT + 1, 1, 2, 0]  # the sampled token is counted


def test_banned_tokens_are_never_sampled_while_the_ban_is_active():
    md = metadata(4, temperature=1.0, seed=np.arange(4, dtype=np.uint64))
    state = with_state(md, 3, [((), (), (0,)), ((), (), (0, 1)), None, ((), (), (0,))])
    md.ban_active = np.array([1, 1, 0, 0], np.int32)
    logits = np.tile(np.array([10.0, 9.0, -5.0], np.float32), (4, 1))
    logits[3, 0] = 40.0
    before = state.copy()
    tokens = sample(logits, md, state)
    assert tokens[0] != 0 and tokens[1] == 2
    assert tokens[3] == 0  # its ban is over: the banned bit is ignored
    assert state[4, 0] == BAN_BIT + 1  # sampled tokens are counted, the bits kept
    added = state.astype(int) - before
    assert added[[1, 2, 4], tokens[[0, 1, 3]]].tolist() == [1, 1, 1] and added.sum() == 3


def test_state_rows_need_the_table():
    md = metadata(1, repetition_penalty=1.2)
    md.state_rows = np.zeros(1, np.int32)
    with pytest.raises(ValueError, match="state table"):
        sample(np.zeros((1, 4), np.float32), md)
    assert not metadata(2).has_state and metadata(2).all_greedy and not md.all_greedy


def _unhash(x: int) -> int:
    """The inverse of rng's splitmix64 finaliser: the hash input that gives x."""
    mask = (1 << 64) - 1

    def unxorshift(y: int, shift: int) -> int:
        z = y
        for _ in range(64 // shift + 1):
            z = y ^ (z >> shift)
        return z

    x = unxorshift(x, 31)
    x = (x * pow(int(MIX2), -1, 1 << 64)) & mask
    x = unxorshift(x, 27)
    x = (x * pow(int(MIX1), -1, 1 << 64)) & mask
    return unxorshift(x, 30)


def _seed_for(h: int, step: int, token: int) -> int:
    """A seed whose (seed, step) row key gives `token` the 32-bit hash h: the key's low word 0,
    its high word h minus lowbias32 of the spread token (rng.token_hash), then the inverse of
    the row's mixing."""
    mask = (1 << 64) - 1
    spread = token_hash(np.uint64(0), np.uint64(token))  # lowbias32(token * TOKEN_MUL)
    key = ((h - int(spread)) & 0xFFFFFFFF) << 32
    pre = (_unhash(key) - step * int(STEP_MUL)) & mask
    return (pre * pow(int(SEED_MUL), -1, 1 << 64)) & mask


def _old_uniform(seed: int, step: int, token: int) -> np.float32:
    """The formula this one replaced: the top 24 bits + 0.5, over 2**24, in float32."""
    h = token_hash(row_key(np.uint64(seed), np.uint64(step)), np.uint64(token))
    return (np.float32(int(h) >> 8) + np.float32(0.5)) / np.float32(2**24)


EXTREMES = [(1 << 32) - 1, ((1 << 32) - 1) ^ ((1 << 9) - 1), (1 << 9) - 1, 0, 1 << 31]


@pytest.mark.parametrize("x", EXTREMES)
def test_uniforms_of_the_extreme_counters_stay_inside_zero_one(x):
    step, token = 17, 5
    seed = _seed_for(x, step, token)
    u = uniform_from_counter(np.uint64(seed), np.uint64(step), np.uint64(token))
    assert 0.0 < u < 1.0
    assert token_hash(row_key(np.uint64(seed), np.uint64(step)), np.uint64(token)) == x
    assert u == (np.float32(x >> 9) + np.float32(0.5)) / np.float32(2**23)
    noise = gumbel_noise(seed, step, 8)
    assert np.isfinite(noise).all()
    assert -3.0 < noise[token] < 17.0  # -log(-log(u)) for u in [2**-24, 1 - 2**-24]


def test_a_cold_temperature_never_picks_a_token_for_infinite_noise():
    """At the counter whose hash is all ones, the old uniform rounded to 1.0: infinite Gumbel
    noise forced token 5 whatever the logits. Now it is an ordinary draw: at temperature 0.05 a
    logit 10 below the top cannot win (the noise spans less than 20)."""
    step, token = 17, 5
    seed = _seed_for((1 << 32) - 1, step, token)
    assert _old_uniform(seed, step, token) == 1.0  # the bug this guards against
    logits = np.zeros((1, 8), np.float32)
    logits[0, 2] = 10.0
    md = metadata(1, temperature=0.05, seed=np.array([seed], np.uint64))
    md.step = np.array([step], np.uint64)
    assert sample(logits, md)[0] == 2
    rng = np.random.default_rng(0)  # and over many ordinary counters too
    rows = rng.random((500, 64), dtype=np.float32)  # the top 1 above every other logit
    rows[np.arange(500), rng.integers(0, 64, 500)] += 2.0
    md = metadata(500, temperature=0.05, seed=rng.integers(0, 2**63, 500).astype(np.uint64))
    np.testing.assert_array_equal(sample(rows, md), rows.argmax(axis=1))


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


def _engine_with_sampling_seed(seed: int | None):
    """tiny_engine's model with EngineConfig.seed = seed (tiny_engine's own `seed` is the
    weights')."""
    config = tiny_config()
    tensors = random_hf_tensors(config, seed=0, std=0.35)
    return build_engine(
        config,
        tensors.__getitem__,
        CpuBackend(),
        EngineConfig(num_kv_blocks=64, seed=seed),
        tokenizer=byte_tokenizer(),
        eos_token_ids=frozenset({EOS_ID}),
    )


def test_unseeded_requests_differ_between_engines_and_seeded_ones_do_not():
    assert EngineConfig().seed is None  # the default: fresh entropy
    prompt = random_prompts(1, seed=13)[0]
    noisy = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    seeded = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=99)

    def tokens(engine, params):
        return LLM(engine=engine).generate([prompt], params)[0].outputs[0].token_ids

    unseeded = [tokens(_engine_with_sampling_seed(None), noisy) for _ in range(2)]
    assert unseeded[0] != unseeded[1]
    assert tokens(_engine_with_sampling_seed(None), seeded) == tokens(
        _engine_with_sampling_seed(None), seeded
    )
    # A seed in EngineConfig makes unseeded requests repeat engine after engine.
    assert tokens(_engine_with_sampling_seed(5), noisy) == tokens(
        _engine_with_sampling_seed(5), noisy
    )


def test_seeded_requests_with_penalties_are_reproducible_in_any_batch():
    params = SamplingParams(
        temperature=0.8, top_p=0.9, repetition_penalty=1.3, frequency_penalty=0.4,
        min_tokens=6, seed=4321, max_tokens=16,
    )  # fmt: skip
    prompt = random_prompts(1, seed=21)[0]
    alone = LLM(engine=tiny_engine()).generate([prompt], params)[0].outputs[0].token_ids
    others = random_prompts(4, seed=22)
    noisy = SamplingParams(temperature=1.0, presence_penalty=0.7, max_tokens=16)
    engine = tiny_engine(max_num_batched_tokens=9, max_num_seqs=3)
    batch = LLM(engine=engine).generate(
        others[:2] + [prompt] + others[2:], [noisy, noisy, params, noisy, noisy]
    )
    assert batch[2].outputs[0].token_ids == alone
    unpenalised = dataclasses.replace(params, repetition_penalty=1.0, frequency_penalty=0.0)
    plain = LLM(engine=tiny_engine()).generate([prompt], unpenalised)[0].outputs[0].token_ids
    assert plain != alone  # the penalties really played a part


class FixedLogitsExecutor:
    """Every row sees the same logits (EOS the most likely), through the real sampler and a
    token-state table of its own, as a backend keeps one."""

    def __init__(self, logits: np.ndarray) -> None:
        self.logits = logits
        self.state = new_state(256, len(logits))

    def execute(self, batch, md):
        write_states(self.state, md.state_writes)
        return sample(np.tile(self.logits, (md.num_rows, 1)), md, self.state)


def test_min_tokens_masks_eos_and_stop_tokens():
    from engine_helpers import scripted_engine

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
