"""CUDA graphs with every sampling setting: steps with penalties, min_tokens bans and top-p
replay from the decode and mixed graphs (the token state lives on the device), and give
exactly the tokens of the eager engine (enforce_eager), with no drain of async scheduling.

Needs a GPU (graph capture); runs on the device machine."""

from __future__ import annotations

import pytest
from engine_helpers import random_prompts

from gpu import LLM, EngineConfig, SamplingParams
from gpu.backends import cuda_available
from gpu.loader import build_engine
from gpu.model_weights import random_hf_tensors
from gpu.presets import preset_config

pytestmark = pytest.mark.skipif(not cuda_available(), reason="needs an NVIDIA GPU (CUDA graphs)")

EOS = 2  # SmolLM2's


def _engine(enforce_eager: bool, **config_args):
    from gpu.backends.cuda import CudaBackend

    config = preset_config("smollm2-135m", num_hidden_layers=2)
    tensors = random_hf_tensors(config, seed=9, std=0.3)
    # Random weights put EOS anywhere: push it up so min_tokens' ban really has work to do.
    tensors["model.embed_tokens.weight"][EOS] *= 4.0
    args = dict(enforce_eager=enforce_eager, num_kv_blocks=256, max_num_seqs=16)
    args.update(config_args)
    return build_engine(
        config,
        tensors.__getitem__,
        CudaBackend(),
        EngineConfig(**args),
        eos_token_ids=frozenset({EOS}),
    )


def _params() -> list[SamplingParams]:
    chat = dict(temperature=0.7, top_p=0.9, repetition_penalty=1.1)
    return [
        SamplingParams(**chat, seed=1, max_tokens=24),
        SamplingParams(**chat, seed=2, max_tokens=24, presence_penalty=0.5, min_tokens=12),
        SamplingParams(temperature=0, repetition_penalty=1.5, frequency_penalty=0.5, max_tokens=20),
        SamplingParams(temperature=0, min_tokens=16, max_tokens=24, stop_token_ids=[7]),
        SamplingParams(temperature=1.0, top_p=0.8, seed=5, max_tokens=18),
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),  # plain argmax
    ]


def _tokens(outputs) -> list[list[int]]:
    assert all(o.error is None for o in outputs), [o.error for o in outputs]
    return [list(o.outputs[0].token_ids) for o in outputs]


@pytest.mark.parametrize("max_num_batched_tokens", [None, 24])  # 24: chunked, mixed steps
def test_graph_replay_with_penalties_bans_and_top_p_gives_the_eager_tokens(
    max_num_batched_tokens,
):
    prompts = random_prompts(6, seed=17, low=5, high=40)
    params = _params()
    eager = _tokens(
        LLM(engine=_engine(True, max_num_batched_tokens=max_num_batched_tokens)).generate(
            prompts, params
        )
    )
    engine = _engine(False, max_num_batched_tokens=max_num_batched_tokens)
    graphed = _tokens(LLM(engine=engine).generate(prompts, params))
    assert graphed == eager
    assert len(graphed[1]) >= 12 and len(graphed[3]) >= 16  # the bans held
    assert EOS not in graphed[1][:12] and EOS not in graphed[3][:16]
    keys = set(engine.runner.executor.graphs)
    # Steps with state (penalties, bans) replayed from the general sampler's graphs.
    assert any(k[0] == "decode" and not k[-1] for k in keys)
    assert any(k[0] == "mixed" and not k[-1] for k in keys)
    assert engine.num_drains == 0


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_device_rows_hold_each_sequences_history_across_row_reuse(async_scheduling):
    """Two rows, six requests through them one after another, graphs replaying: after every
    step the device table holds, for each running sequence with penalties, exactly its prompt
    bits and the counts of its tokens (the one in flight included). A new owner's state write
    lands before its graph, after the sampler that counted its predecessor's discarded token."""
    import numpy as np
    from numba import cuda

    from gpu.sampling.token_state import COUNT_MASK, PROMPT_BIT

    engine = _engine(False, max_num_seqs=2, async_scheduling=async_scheduling)
    sampler = engine.runner.executor.sampler
    owners = engine.runner.state_owners.owner
    prompts = random_prompts(6, seed=23, low=5, high=30)
    params = [
        SamplingParams(
            temperature=0.8, seed=i, repetition_penalty=1.3, frequency_penalty=0.4,
            max_tokens=12 + 3 * i, stop_token_ids=[100 + i],
        )
        for i in range(6)
    ]  # fmt: skip
    for p, q in zip(prompts, params, strict=True):
        engine.add_request(p, q)
    checked = 0
    vocab = engine.vocab_size
    while engine.has_unfinished_requests():
        engine.step()
        cuda.synchronize()
        state = sampler.state.copy_to_host()
        in_flight = sampler.out.copy_to_host()
        for row, seq in owners.items():
            if seq.is_finished:
                continue
            outputs = [t if t >= 0 else int(in_flight[-1 - t]) for t in seq.output_token_ids]
            counts = np.minimum(np.bincount(outputs, minlength=vocab), COUNT_MASK)
            assert np.array_equal(state[row] & COUNT_MASK, counts), (row, seq)
            prompt = np.zeros(vocab, bool)
            prompt[seq.prompt_token_ids] = True
            assert np.array_equal((state[row] & PROMPT_BIT) != 0, prompt), (row, seq)
            checked += 1
    assert checked > 30
    assert any(k[0] == "decode" and not k[-1] for k in engine.runner.executor.graphs)
