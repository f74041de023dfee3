"""Async scheduling (EngineConfig.async_scheduling): step N+1 is launched before step N's tokens
are read, its decode tokens coming from the device through prev_rows. Whatever the workload,
the tokens, texts and finish reasons must be those of the serial engine, bit for bit.

Engines run on the cpu backend over a tiny random model; one test runs the cuda backend in the
simulator. Each async run also checks that tokens really were in flight (prev_rows >= 0 rows),
so a silent fall back to the serial order cannot pass for async scheduling.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from engine_helpers import EOS_ID, random_prompts, tiny_config, tiny_engine
from kernel_helpers import bf16_values, fresh_rng, poisoned, synced
from numba import cuda

from gpu import EngineConfig, SamplingParams
from gpu.backends.cpu import CpuBackend
from gpu.kernels import embedding
from gpu.kernels.bf16 import round_to_bf16, to_bf16_bits
from gpu.loader import build_engine
from gpu.model_weights import random_hf_tensors
from gpu.sampling_params import RequestOutputKind


class LaunchSpy:
    """Wraps the executor's launch: counts token rows read from the step in flight, and the rows
    each request sampled (by its seed, which the tests make unique)."""

    def __init__(self, engine, fail_at: int | None = None, fail_result_at: int | None = None):
        self.launch = engine.runner.executor.launch
        self.in_flight_rows = 0
        self.launches = 0
        self.rows_by_seed: dict[int, int] = {}
        self.fail_at, self.fail_result_at = fail_at, fail_result_at
        engine.runner.executor.launch = self  # the runner looks it up every step

    def __call__(self, batch, metadata):
        self.launches += 1
        if self.launches == self.fail_at:
            raise RuntimeError("launch failed")
        self.in_flight_rows += int((batch.prev_rows >= 0).sum())
        for seed in metadata.seed.tolist():
            self.rows_by_seed[seed] = self.rows_by_seed.get(seed, 0) + 1
        handle = self.launch(batch, metadata)
        if self.launches == self.fail_result_at:
            return FailingResult()
        return handle


class FailingResult:
    def result(self):
        raise RuntimeError("result failed")


def run(engine, prompts, params, every: int = 1, abort: dict | None = None) -> dict:
    """Add a request every `every` steps (abort[i] = s: abort request i at step s); returns
    request index -> (token ids, text, finish reason, stop reason), checking that the DELTA
    stream adds up to the final output and never shows a token still in flight."""
    params = params if isinstance(params, list) else [params] * len(prompts)
    pending = list(enumerate(prompts))
    ids: dict[str, int] = {}
    streamed: dict[int, list[int]] = {}
    texts: dict[int, str] = {}
    results: dict[int, tuple] = {}
    abort = abort or {}
    step = 0
    while pending or engine.has_unfinished_requests():
        if pending and step % every == 0:
            i, prompt = pending.pop(0)
            ids[engine.add_request(prompt, _delta(params[i]))] = i
            streamed[i], texts[i] = [], ""
        for i, at in abort.items():
            if at == step:
                rid = next(r for r, j in ids.items() if j == i)
                engine.abort_request(rid)
        for out in engine.step():
            i = ids[out.request_id]
            c = out.outputs[0]
            assert all(t >= 0 for t in c.token_ids), "a placeholder was reported"
            streamed[i] += c.token_ids
            texts[i] += c.text
            if out.finished:
                results[i] = (streamed[i], texts[i], c.finish_reason, c.stop_reason)
        step += 1
        assert step < 2000
    assert engine.block_manager.num_used_blocks == 0
    assert not engine.scheduler.running and not engine.scheduler.waiting
    return results


def _delta(params: SamplingParams) -> SamplingParams:
    return dataclasses.replace(params, output_kind=RequestOutputKind.DELTA)


def both(prompts, params, engine_args=None, **run_args):
    """(serial results, async results, the async run's spy)."""
    engine_args = engine_args or {}
    serial = run(tiny_engine(async_scheduling=False, **engine_args), prompts, params, **run_args)
    engine = tiny_engine(**engine_args)
    spy = LaunchSpy(engine)
    assert engine.config.async_scheduling  # the default
    return serial, run(engine, prompts, params, **run_args), spy


PROMPTS = random_prompts(6, seed=11, low=3, high=40)


def greedy(max_tokens: int = 20, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **kw)


def seeded(seed: int, max_tokens: int = 20, **kw) -> SamplingParams:
    return SamplingParams(temperature=1.0, top_p=0.9, seed=seed, max_tokens=max_tokens, **kw)


def test_greedy_and_seeded_sampling_match_the_serial_engine():
    params = [greedy(8 + 3 * i) if i % 2 else seeded(100 + i, 6 + 4 * i) for i in range(6)]
    serial, async_, spy = both(PROMPTS, params, every=2)
    assert async_ == serial
    assert spy.in_flight_rows > 20  # decode tokens really came from the step in flight
    assert len({tuple(r[0]) for r in serial.values()}) == len(PROMPTS)  # varied outputs


def test_stop_ids_stop_strings_and_eos_match_and_the_extra_token_is_discarded():
    """Stops taken from the serial run's own outputs: a stop id met mid-reply, a stop string
    that spans tokens, EOS under ignore_eos False. The async engine computes one token past such
    a stop (it cannot know in advance) but never reports it; a max_tokens stop is known in
    advance, so nothing is computed past it."""
    plain, _, _ = both(PROMPTS[:3], [seeded(7 + i, 16) for i in range(3)])
    stop_id = plain[0][0][5]
    text1 = plain[1][1]
    k = next(k for k in range(4, len(text1) - 2) if "\ufffd" not in text1[k : k + 2])
    stop_str = text1[k : k + 2]  # two characters: usually more than one token
    params = [
        seeded(7, 16, stop_token_ids=[stop_id]),
        seeded(8, 16, stop=[stop_str]),
        seeded(9, 16),  # no stop but length
        SamplingParams(temperature=1.0, seed=10, max_tokens=40),  # may meet EOS (id 256)
    ]
    prompts = PROMPTS[:4]
    serial, async_, spy = both(prompts, params)
    assert async_ == serial
    assert serial[0][2:] == ("stop", stop_id)
    assert serial[0][0][-1] == stop_id and len(serial[0][0]) <= 6
    assert serial[1][2:] == ("stop", stop_str) and stop_str not in serial[1][1]
    assert serial[2][2] == "length" and len(serial[2][0]) == 16
    # Rows sampled per request: a stop met on a token that was in flight costs one discarded
    # token; a length stop none.
    assert spy.rows_by_seed[7] == len(serial[0][0]) + 1
    assert spy.rows_by_seed[9] == 16


def test_eos_finishes_like_the_serial_engine():
    """A model whose every greedy step picks EOS sooner or later: rows where the EOS logit is
    pushed up by a biased lm_head."""
    config = tiny_config()
    tensors = random_hf_tensors(config, seed=2, std=0.35)
    tensors["lm_head.weight"][EOS_ID] += 0.9 * tensors["lm_head.weight"][65]
    results = []
    for async_scheduling in (False, True):
        engine = build_engine(
            config,
            tensors.__getitem__,
            CpuBackend(),
            EngineConfig(num_kv_blocks=256, async_scheduling=async_scheduling),
            tokenizer=tiny_engine().tokenizer,
            eos_token_ids=frozenset({EOS_ID}),
        )
        params = [SamplingParams(temperature=1.0, seed=s, max_tokens=60) for s in range(6)]
        results.append(run(engine, PROMPTS, params))
    assert results[0] == results[1]
    assert any(r[2] == "stop" for r in results[0].values())  # some really ended on EOS


def test_penalties_and_min_tokens_match_without_draining():
    """Penalties and bans read the sampler's token state, kept on the backend and counted on by
    the sampler itself: no step waits for the one in flight, and the tokens are the serial
    engine's."""
    params = [
        seeded(1, 14, repetition_penalty=1.5, presence_penalty=0.5),
        greedy(12, frequency_penalty=0.8),
        seeded(3, 14, min_tokens=10),
        greedy(16),
    ]
    serial, async_, spy = both(PROMPTS[:4], params)
    assert async_ == serial
    assert all(len(r[0]) >= 10 for r in serial.values())
    assert spy.in_flight_rows > 20


def test_penalty_requests_alone_read_tokens_in_flight():
    # Repetition 3.0: the tiny random model's greedy choices survive 1.3 (a peaked row).
    params = [greedy(10, repetition_penalty=3.0), seeded(5, 10, presence_penalty=1.0)]
    engine = tiny_engine()
    spy = LaunchSpy(engine)
    async_ = run(engine, PROMPTS[:2], params)
    assert async_ == run(tiny_engine(async_scheduling=False), PROMPTS[:2], params)
    assert engine.num_drains == 0
    assert spy.in_flight_rows >= 2 * 8  # every decode step ran on the step in flight
    # ... and the penalties really changed the tokens (the state is read, not ignored)
    plain = [greedy(10), seeded(5, 10)]
    assert run(tiny_engine(), PROMPTS[:2], plain)[0] != async_[0]


def test_abort_while_a_step_is_in_flight():
    """Aborting a request whose token is in flight reports what was known, not the token."""
    params = [seeded(20 + i, 30) for i in range(4)]
    serial, _, _ = both(PROMPTS[:4], params)
    engine = tiny_engine()
    LaunchSpy(engine)
    abort = {1: 6, 2: 9}
    async_ = run(engine, PROMPTS[:4], params, abort=abort)
    for i in (0, 3):
        assert async_[i] == serial[i]
    for i in (1, 2):
        tokens, _, reason, _ = async_[i]
        assert reason == "abort"
        assert 0 < len(tokens) < len(serial[i][0])
        assert tokens == serial[i][0][: len(tokens)]


def test_abort_right_after_a_launch_discards_the_token_in_flight():
    engine = tiny_engine()
    rid = engine.add_request(PROMPTS[0], _delta(greedy(20)))
    seen: list[int] = []
    for _ in range(4):
        for out in engine.step():
            seen += out.outputs[0].token_ids
    seq = engine.requests[rid]
    assert seq.num_pending == 1  # a token in flight
    known = list(seq.output_token_ids[:-1])
    engine.abort_request(rid)
    outs = engine.step()
    assert engine.has_unfinished_requests() is False
    final = [o for o in outs if o.request_id == rid]
    assert len(final) == 1 and final[0].finished
    assert final[0].outputs[0].finish_reason == "abort"
    assert seen + final[0].outputs[0].token_ids == known
    assert engine.block_manager.num_used_blocks == 0


def test_step_in_flight_is_the_step_the_next_call_waits_for():
    """Async: after a call, step_in_flight is the step it launched (the next call processes
    it); serial: always None, each call processes its own step."""
    engine = tiny_engine()
    engine.add_request(PROMPTS[0], greedy(3))
    engine.step()
    assert engine.step_in_flight.num_prefill_tokens == len(PROMPTS[0])  # the prefill
    engine.step()
    assert engine.step_in_flight.num_prefill_tokens == 0  # then decodes
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.step_in_flight is None
    serial = tiny_engine(async_scheduling=False)
    serial.add_request(PROMPTS[0], greedy(3))
    serial.step()
    assert serial.step_in_flight is None


def test_preemption_matches():
    """Too few KV blocks for everyone: sequences are preempted and recomputed (the engine
    drains first when a sequence with a token in flight would be preempted)."""
    params = [greedy(40) for _ in range(5)]
    prompts = random_prompts(5, seed=4, low=20, high=40)
    engine_args = dict(num_kv_blocks=12, block_size=8, max_num_seqs=5)
    serial, async_, spy = both(prompts, params, engine_args=engine_args)
    assert async_ == serial
    engine = tiny_engine(**engine_args)
    run(engine, prompts, params)
    assert engine.scheduler.num_preemptions > 0
    assert engine.num_drains > 0  # a sequence with a token in flight was to be preempted
    alone = run(tiny_engine(async_scheduling=False), prompts, params)
    assert async_ == alone


def test_chunked_prefill_matches():
    prompts = random_prompts(5, seed=9, low=40, high=90)
    params = [seeded(40 + i, 12) if i % 2 else greedy(12) for i in range(5)]
    engine_args = dict(max_num_batched_tokens=11, max_num_seqs=4)
    serial, async_, spy = both(prompts, params, engine_args=engine_args, every=3)
    assert async_ == serial
    assert spy.in_flight_rows > 0


def test_max_model_len_stop_is_known_in_advance():
    prompt = random_prompts(1, seed=3, low=28, high=29)[0]
    params = [SamplingParams(temperature=1.0, seed=77, max_tokens=100)]
    engine_args = dict(max_model_len=32, num_kv_blocks=64)
    serial, async_, spy = both([prompt], params, engine_args=engine_args)
    assert async_ == serial
    assert serial[0][2] == "length" and len(serial[0][0]) == 32 - 28
    assert spy.rows_by_seed[77] == 4  # nothing scheduled past the context


@pytest.mark.parametrize("where", ["launch", "result"])
def test_an_engine_error_fails_that_steps_requests_and_the_engine_goes_on(where):
    engine = tiny_engine()
    kw = {"fail_at": 5} if where == "launch" else {"fail_result_at": 5}
    spy = LaunchSpy(engine, **kw)
    ids = [engine.add_request(p, greedy(12)) for p in PROMPTS[:2]]
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    assert spy.launches >= 5
    assert {finished[i].outputs[0].finish_reason for i in ids} == {"error"}
    assert all("failed" in finished[i].error for i in ids)
    assert engine.block_manager.num_used_blocks == 0
    # The engine is still usable, and gives the serial tokens.
    serial = run(tiny_engine(async_scheduling=False), PROMPTS[2:4], greedy(12))
    assert run(engine, PROMPTS[2:4], greedy(12)) == serial


def test_the_embedding_reads_tokens_in_flight_from_the_device():
    """embedding_kernel with prev_rows vs its numpy twin (CpuBackend.embed), in the simulator."""
    rng, seed = fresh_rng()
    vocab, hidden, tokens, prev = 50, 40, 9, 6
    table = bf16_values(rng, (vocab, hidden))
    ids = rng.integers(0, vocab, tokens).astype(np.int32)
    sampled_prev = rng.integers(0, vocab, prev).astype(np.int32)
    prev_rows = np.where(rng.random(tokens) < 0.5, rng.integers(0, prev, tokens), -1)
    prev_rows = prev_rows.astype(np.int32)
    prev_rows[0], prev_rows[1] = -1, prev - 1  # both kinds, whatever the draw
    out = poisoned((tokens, hidden), np.float32)
    embedding.embed(
        cuda.to_device(ids), cuda.to_device(to_bf16_bits(table)), out, 0,
        cuda.to_device(prev_rows), cuda.to_device(sampled_prev),
    )  # fmt: skip
    expected = np.zeros((tokens, hidden), np.float32)
    CpuBackend().embed(ids, table, expected, prev_rows, sampled_prev)
    got = synced(out)
    assert np.array_equal(got, expected), f"KERNEL_TEST_SEED={seed}"
    tokens_used = np.where(prev_rows >= 0, sampled_prev[np.maximum(prev_rows, 0)], ids)
    assert np.array_equal(got, table[tokens_used]), f"KERNEL_TEST_SEED={seed}"


def test_the_cuda_executor_matches_serial_in_the_simulator():
    """The cuda backend (simulated): launch/result with events and alternating pinned outputs,
    prev_rows staged and padded for the bucketed steps; async tokens equal serial ones.

    The simulator's shapes (test_cuda_graphs' SMALL model: one layer, GQA 2) with a vocab of
    130 (not a multiple of the sampler's blocks), and buffers for 4 sequences of 8 tokens: the
    7-token prefill pads to the 8-token bucket (with the default 256 sequences the budget rose
    to 256 tokens and the prefill ran 16 rows)."""
    from gpu.backends.cuda import CudaBackend

    config = tiny_config(num_hidden_layers=1, hidden_size=32, intermediate_size=48,
                         num_attention_heads=2, num_key_value_heads=1, vocab_size=130)  # fmt: skip
    tensors = {k: round_to_bf16(v) for k, v in random_hf_tensors(config, seed=3, std=0.1).items()}
    prompts = [[5, 17, 33, 2, 9], [11, 3]]
    params = [greedy(3), seeded(5, 3)]
    results, spies = [], []
    for async_scheduling in (False, True):
        engine = build_engine(
            config,
            tensors.__getitem__,
            CudaBackend(),
            EngineConfig(
                max_num_batched_tokens=8,
                max_num_seqs=4,
                num_kv_blocks=16,
                async_scheduling=async_scheduling,
            ),
        )
        assert engine.runner.executor.token_buckets == [8]
        spies.append(LaunchSpy(engine))
        results.append(run(engine, prompts, params))
    assert results[0] == results[1]
    assert all(len(r[0]) == 3 for r in results[0].values())
    assert spies[1].in_flight_rows > 0 and spies[0].in_flight_rows == 0


def test_prefix_cache_registers_only_real_tokens_and_is_reused_alike():
    """A block whose last token was in flight is registered once the token is known: the cache
    never holds a placeholder, and a second turn finds as many blocks as in the serial engine."""
    turn1 = random_prompts(1, seed=5, low=40, high=41)[0]
    hits = []
    for async_scheduling in (False, True):
        engine = tiny_engine(async_scheduling=async_scheduling, block_size=4)
        reply = run(engine, [turn1], greedy(23))[0][0]
        keys = [k for k in engine.block_manager.block_key if k is not None]
        assert len(keys) >= 15 and all(min(tokens) >= 0 for _, tokens in keys)
        run(engine, [turn1 + reply + [1, 2, 3]], greedy(4))
        hits.append(engine.block_manager.prefix_hits)
    assert hits[0] == hits[1] == 60  # 40 + 23 tokens: all but the last computed, 15 blocks
