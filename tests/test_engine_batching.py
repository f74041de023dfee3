"""Continuous batching on the cpu backend: the same tokens whatever the batch, prefix reuse,
preemption and aborts that give every block back."""

from __future__ import annotations

import dataclasses

import pytest
from engine_helpers import random_prompts, tiny_engine

from gpu import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def run_alone(prompts, params=GREEDY, **engine_args):
    llm = LLM(engine=tiny_engine(**engine_args))
    return [llm.generate([p], params)[0].outputs[0].token_ids for p in prompts]


def run_staggered(engine, prompts, params=GREEDY, every: int = 2):
    """Add one request every `every` steps while the others run; collect final token ids."""
    pending = list(enumerate(prompts))
    results: dict[str, list[int]] = {}
    ids: dict[int, str] = {}
    step = 0
    while pending or engine.has_unfinished_requests():
        if pending and step % every == 0:
            i, prompt = pending.pop(0)
            ids[i] = engine.add_request(prompt, params)
        for out in engine.step():
            if out.finished:
                results[out.request_id] = out.outputs[0].token_ids
        step += 1
    return [results[ids[i]] for i in range(len(prompts))]


def test_greedy_outputs_do_not_depend_on_the_batch():
    prompts = random_prompts(8, seed=1, low=5, high=70)
    alone = run_alone(prompts)
    # A tiny token budget forces chunked prefill interleaved with other sequences' decodes.
    engine = tiny_engine(max_num_batched_tokens=11, max_num_seqs=8)
    together = run_staggered(engine, prompts)
    assert together == alone
    assert len({tuple(t) for t in alone}) == len(prompts)  # outputs really differ by prompt
    assert engine.block_manager.num_used_blocks == 0


def test_penalties_and_bans_do_not_depend_on_the_batch():
    """Each sequence's token state is its own row, whatever shares the step, and rows passed
    from sequence to sequence (max_num_seqs 3, eight requests) start from their new owner's
    history."""
    prompts = random_prompts(8, seed=2, low=5, high=50)
    params = SamplingParams(
        temperature=0, max_tokens=20, min_tokens=8, repetition_penalty=1.4,
        frequency_penalty=0.6, stop_token_ids=[32],
    )  # fmt: skip
    alone = run_alone(prompts, params)
    engine = tiny_engine(max_num_batched_tokens=11, max_num_seqs=3)
    assert run_staggered(engine, prompts, params) == alone
    plain = dataclasses.replace(params, repetition_penalty=1.0, frequency_penalty=0.0)
    assert run_alone(prompts, plain) != alone  # the penalties mattered
    assert engine.num_drains == 0


def test_chunked_prefill_interleaves_with_decodes():
    """A long prompt arriving while a sequence decodes must not stall that sequence."""
    engine = tiny_engine(max_num_batched_tokens=8, max_num_seqs=4)
    short = engine.add_request([1, 2, 3], GREEDY)
    while engine.requests[short].num_output_tokens == 0:
        engine.step()
    engine.add_request(random_prompts(1, seed=3, low=60, high=61)[0], GREEDY)
    for _ in range(6):  # 60 prompt tokens at <= 7 per step take several steps
        before = engine.requests[short].num_output_tokens
        engine.step()
        assert engine.requests[short].num_output_tokens == before + 1
        stats = engine.stats().last_step
        assert stats.num_decode_tokens == 1 and stats.num_prefill_tokens == 7


def test_second_turn_reuses_the_first_turns_blocks():
    engine = tiny_engine()
    llm = LLM(engine=engine)
    turn1 = random_prompts(1, seed=5, low=40, high=41)[0]
    reply = llm.generate([turn1], GREEDY)[0].outputs[0].token_ids
    turn2 = turn1 + reply + [10, 20, 30, 40, 50]
    out = llm.generate([turn2], GREEDY)[0]
    # Everything computed in turn 1 (prompt + all but the last reply token) sits in full blocks
    # that can be reused: 40 + 23 = 63 tokens -> 3 full blocks of 16.
    assert out.num_cached_tokens == 48
    assert engine.last_step is not None
    cold = run_alone([turn2])[0]
    assert out.outputs[0].token_ids == cold


def test_shared_prefix_is_counted_in_the_hit_rate():
    engine = tiny_engine()
    llm = LLM(engine=engine)
    system = random_prompts(1, seed=6, low=48, high=49)[0]
    llm.generate([system + [1, 2, 3]], GREEDY)
    out = llm.generate([system + [7, 8, 9]], GREEDY)[0]
    assert out.num_cached_tokens == 48
    stats = engine.stats()
    assert stats.prefix_cache_hits == 48
    assert stats.prefix_cache_hit_rate == pytest.approx(48 / (51 + 51))


def test_preemption_when_the_cache_is_too_small():
    prompts = random_prompts(6, seed=7, low=20, high=40)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    alone = run_alone(prompts, params)
    # 12 blocks of 16 tokens cannot hold 6 sequences of up to 80 tokens at once.
    engine = tiny_engine(num_kv_blocks=12, max_num_seqs=6, max_num_batched_tokens=64)
    together = LLM(engine=engine).generate(prompts, params)
    assert engine.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in together] == alone
    assert engine.block_manager.num_used_blocks == 0
    assert not engine.scheduler.running and not engine.scheduler.waiting


@pytest.mark.parametrize("when", ["decode", "prefill"])
def test_abort_frees_every_block_and_spares_the_others(when):
    prompts = random_prompts(3, seed=8, low=30, high=50)
    alone = run_alone(prompts)
    engine = tiny_engine(max_num_batched_tokens=16, max_num_seqs=4)
    ids = [engine.add_request(p, GREEDY) for p in prompts]
    victim = engine.requests[ids[1]]
    if when == "decode":
        while victim.num_output_tokens < 3:
            engine.step()
    else:
        while victim.num_computed_tokens == 0:
            engine.step()
        assert victim.num_computed_tokens < victim.num_prompt_tokens  # mid-prefill
    assert victim.block_table
    engine.abort_request(ids[1])
    assert victim.block_table == []
    results = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                results[out.request_id] = out
    assert results[ids[1]].outputs[0].finish_reason == "abort"
    assert results[ids[0]].outputs[0].token_ids == alone[0]
    assert results[ids[2]].outputs[0].token_ids == alone[2]
    assert engine.block_manager.num_used_blocks == 0


def test_prompt_longer_than_the_context_is_refused():
    engine = tiny_engine(max_model_len=64)
    with pytest.raises(ValueError, match="context is 64 tokens"):
        engine.add_request(list(range(64)), GREEDY)
    with pytest.raises(ValueError, match="empty"):
        engine.add_request([], GREEDY)
    with pytest.raises(ValueError, match="token ids"):
        engine.add_request([1, 99999], GREEDY)


def test_generation_stops_at_the_context_length():
    engine = tiny_engine(max_model_len=40)
    out = LLM(engine=engine).generate(
        [list(range(30))], SamplingParams(max_tokens=None, temperature=0, ignore_eos=True)
    )[0]
    assert len(out.outputs[0].token_ids) == 10
    assert out.outputs[0].finish_reason == "length"
