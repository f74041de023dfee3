"""The batch-invariant mode on the GPU (EngineConfig.batch_invariant,
gpu/backends/cuda/batch_invariant.py): every seeded request gives exactly the tokens it gives
alone, when it runs beside others that arrive at other times, its prompt chunked into mixed
steps by a small token budget, its decode steps in every batch size from 1 up, CUDA graphs
replaying, and when it runs alone again over the prefix cache the batch left.

Needs a GPU; runs on the device machine. (tests/test_batch_invariant.py checks the mode's two
ops in the simulator.)"""

from __future__ import annotations

import pytest
from engine_helpers import random_prompts

from gpu import LLM, EngineConfig, SamplingParams
from gpu.backends import cuda_available
from gpu.loader import build_engine
from gpu.model_weights import random_hf_tensors
from gpu.presets import preset_config

pytestmark = pytest.mark.skipif(not cuda_available(), reason="needs an NVIDIA GPU")

N = 24


def _engine(config_name: str, layers: int):
    from gpu.backends.cuda.batch_invariant import BatchInvariantCudaBackend

    config = preset_config(config_name, num_hidden_layers=layers)
    tensors = random_hf_tensors(config, seed=5)
    engine_config = EngineConfig(
        batch_invariant=True, num_kv_blocks=1024, max_num_seqs=32, max_num_batched_tokens=96
    )
    return build_engine(config, tensors.__getitem__, BatchInvariantCudaBackend(), engine_config)


def _params() -> list[SamplingParams]:
    chat = dict(temperature=0.7, top_p=0.9, repetition_penalty=1.1)  # the app's defaults
    out = []
    for i in range(N):
        kind = i % 3
        if kind == 0:
            p = SamplingParams(**chat, seed=i, max_tokens=40 + i, ignore_eos=True)
        elif kind == 1:
            p = SamplingParams(
                temperature=0.8, top_p=0.95, seed=i, max_tokens=30 + 2 * i, ignore_eos=True
            )
        else:
            p = SamplingParams(temperature=0, max_tokens=24 + i, ignore_eos=True)
        out.append(p)
    return out


@pytest.mark.parametrize("config_name, layers", [("smollm2-135m", 4), ("llama-3.2-1b", 2)])
def test_each_request_gives_its_tokens_alone_in_any_batch(config_name, layers):
    engine = _engine(config_name, layers)
    prompts = random_prompts(N, seed=31, low=3, high=150)
    params = _params()

    # Together: a third at once, the rest arriving between steps, so that prompt chunks ride
    # in mixed steps beside decode rows and the batch grows and shrinks.
    tokens: dict[str, list[int]] = {}
    order: list[str] = []
    waiting = list(zip(prompts, params, strict=True))
    for p, q in waiting[: N // 3]:
        order.append(engine.add_request(p, q))
    waiting = waiting[N // 3 :]
    steps = 0
    while engine.has_unfinished_requests() or waiting:
        if waiting and steps % 3 == 0:
            p, q = waiting.pop(0)
            order.append(engine.add_request(p, q))
        for out in engine.step():
            assert out.error is None, out.error
            if out.finished:
                tokens[out.request_id] = list(out.outputs[0].token_ids)
        steps += 1
    together = [tokens[r] for r in order]

    llm = LLM(engine=engine)
    alone = []
    for p, q in zip(prompts, params, strict=True):
        (out,) = llm.generate([p], q)
        alone.append(list(out.outputs[0].token_ids))

    differ = [i for i in range(N) if together[i] != alone[i]]
    assert not differ, f"{len(differ)} of {N} requests differ from their runs alone: {differ}"
    assert [len(t) for t in together] == [q.max_tokens for q in params]
    assert engine.runner.executor.graphs, "the steps replayed CUDA graphs"
