"""CUDA graphs: a replayed step (decode, prefill or mixed) gives exactly the tokens of the
eager step.

The bucketing and padding logic runs everywhere (in the simulator the executor pads eagerly);
the replay itself needs a GPU and runs on the device."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import random_prompts, tiny_config

from gpu import LLM, EngineConfig, SamplingParams
from gpu.backends import cuda_available
from gpu.backends.cuda.graphs import (
    PDL_MAX_TOKENS,
    bucket_for,
    capture_buckets,
    device_supports_pdl,
    pays_to_overlap,
    token_buckets,
)
from gpu.loader import build_engine
from gpu.model_weights import random_hf_tensors


def test_buckets_follow_the_issue():
    assert token_buckets(4096) == [16, 32, 64, 128, 256, 512, 1024, 1536, 2048, 2560, 3072,
                                   3584, 4096]  # fmt: skip
    assert token_buckets(100) == [16, 32, 64, 100]
    assert capture_buckets(256) == [1, 2, 4, 8, 16] + list(range(32, 257, 16))
    assert capture_buckets(8) == [1, 2, 4, 8]
    assert capture_buckets(40) == [1, 2, 4, 8, 16, 32, 40]
    assert bucket_for(3, capture_buckets(256)) == 4
    assert bucket_for(17, capture_buckets(256)) == 32
    assert bucket_for(300, capture_buckets(256)) is None


def _engine(
    enforce_eager: bool,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int = 24,
    **overrides,
):
    """An engine on the cuda backend over random weights. The loader raises the token budget
    to max_num_seqs at least, so a small budget needs few sequences too."""
    from gpu.backends.cuda import CudaBackend

    config = tiny_config(**overrides)
    tensors = random_hf_tensors(config, seed=5, std=0.3)
    return build_engine(
        config,
        tensors.__getitem__,
        CudaBackend(),
        EngineConfig(
            enforce_eager=enforce_eager,
            num_kv_blocks=128,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
        ),  # fmt: skip
    )


@pytest.mark.skipif(not cuda_available(), reason="needs an NVIDIA GPU (CUDA graphs)")
@pytest.mark.parametrize("batch", [1, 3, 8, 19])  # 3 and 19 are padded (buckets 4 and 32)
def test_graph_replay_gives_the_eager_tokens(batch):
    prompts = random_prompts(batch, seed=batch, low=5, high=40)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    eager = LLM(engine=_engine(True)).generate(prompts, params)
    graphed_engine = _engine(False)
    graphed = LLM(engine=graphed_engine).generate(prompts, params)
    assert [o.outputs[0].token_ids for o in graphed] == [o.outputs[0].token_ids for o in eager]
    graphs = graphed_engine.runner.executor.graphs
    kinds = {key[0] for key in graphs}
    assert kinds == {"decode", "mixed"}  # prefill and decode steps really were replayed
    # ... with programmatic edges between the kernels (gpu/kernels/pdl.py) where they pay.
    from numba import cuda

    if cuda.get_current_device().compute_capability >= (9, 0):  # Hopper: the probe must say so
        assert device_supports_pdl()
    expect = {k: pays_to_overlap(k[1]) and device_supports_pdl() for k in graphs}
    assert all((g.programmatic_edges > 0) == expect[k] for k, g in graphs.items())
    assert pays_to_overlap(1) and not pays_to_overlap(PDL_MAX_TOKENS + 1)
    sampled = SamplingParams(temperature=0.8, top_p=0.9, seed=7, max_tokens=12)
    a = LLM(engine=_engine(True)).generate(prompts, sampled)
    b = LLM(engine=_engine(False)).generate(prompts, sampled)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]


# The simulator's shapes: one layer, two heads over one KV head (GQA 2), prompts of a few
# tokens (a prefill pads to the smallest token bucket) and few sequences, so every kernel a
# padded step runs launches on the fewest threads that still pad rows, tokens and sequences.
# The GPU runs the same checks on the longer prompts and wider model they had before
# (gpu-marked cases).
SMALL = dict(num_hidden_layers=1, hidden_size=32, intermediate_size=48, vocab_size=258,
             num_attention_heads=2, num_key_value_heads=1, head_dim=16)  # fmt: skip
WIDER = dict(SMALL, num_attention_heads=4, num_key_value_heads=2)


@pytest.mark.parametrize(
    ("model", "prompt_len", "max_tokens", "max_seqs"),
    [
        pytest.param(SMALL, (2, 5), 3, 4, id="small"),
        pytest.param(WIDER, (3, 12), 4, 24, marks=pytest.mark.gpu, id="wider"),
    ],
)
def test_padded_decode_steps_match_unpadded_ones(model, prompt_len, max_tokens, max_seqs):
    """Runs everywhere (simulator in CI): padding rows must not disturb the real rows."""
    low, high = prompt_len
    prompts = random_prompts(3, seed=2, low=low, high=high)  # decode batch 3 -> bucket 4
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    padded_engine = _engine(True, max_num_seqs=max_seqs, **model)
    padded = LLM(engine=padded_engine).generate(prompts, params)
    plain_engine = _engine(True, max_num_seqs=max_seqs, **model)
    executor = plain_engine.runner.executor
    executor.buckets = executor.token_buckets = []  # no bucket: every step eager, unpadded
    plain = LLM(engine=plain_engine).generate(prompts, params)
    assert all(
        o.error is None and len(o.outputs[0].token_ids) == max_tokens for o in padded + plain
    )
    assert [o.outputs[0].token_ids for o in padded] == [o.outputs[0].token_ids for o in plain]
    executor = padded_engine.runner.executor
    assert 4 in executor._decode_batches  # a padded step really ran
    # ... from the decode steps' own staging, a fraction of the prefill staging's bytes
    decode_fields = executor.decode_inputs.staging.device
    assert executor._decode_batches[4].block_tables is decode_fields["block_tables"]
    assert executor.decode_inputs.staging.nbytes < executor.inputs.staging.nbytes / 2


@pytest.mark.parametrize(
    ("model", "prompt_len", "max_tokens", "budget"),
    [
        pytest.param(SMALL, (2, 9), (2, 4, 3), 8, id="small"),
        pytest.param(WIDER, (3, 30), (2, 5, 3), 24, marks=pytest.mark.gpu, id="wider"),
    ],
)
def test_padded_prefill_and_mixed_steps_match_unpadded_ones(model, prompt_len, max_tokens, budget):
    """Runs everywhere: chunked prefill mixed with decodes, padded to (tokens, seqs) buckets,
    gives the tokens of unpadded steps. A small token budget makes chunks share steps with
    decodes; sequences finish at different steps."""
    low, high = prompt_len
    prompts = random_prompts(3, seed=4, low=low, high=high)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in max_tokens]
    outputs = []
    for pad in (True, False):
        engine = _engine(True, budget, max_num_seqs=budget, **model)
        executor = engine.runner.executor
        if not pad:
            executor.buckets = executor.token_buckets = []
        steps = _count_steps(executor)
        outputs.append(LLM(engine=engine).generate(prompts, params))
        if pad:
            assert executor._mixed_batches  # padded mixed steps really ran
            # ... one-row sequences (decodes) beside longer chunks, and steps short of the budget
            assert any(0 < decodes < seqs for _, seqs, decodes in steps)
            assert any(tokens < budget for tokens, _, _ in steps)
    padded, plain = outputs
    assert all(o.error is None for o in padded + plain)
    assert [o.outputs[0].token_ids for o in padded] == [o.outputs[0].token_ids for o in plain]


def _count_steps(executor) -> list[tuple[int, int, int]]:
    """Record (tokens, sequences, one-token sequences) of each step the executor launches."""
    steps = []
    launch = executor.launch

    def recording(batch, metadata):
        lens = np.diff(np.asarray(batch.query_start_loc[: batch.num_seqs + 1]))
        steps.append((batch.num_tokens, batch.num_seqs, int((lens == 1).sum())))
        return launch(batch, metadata)

    executor.launch = recording
    return steps


def test_capture_all_runs_every_bucket_and_leaves_the_cache_alone():
    """capture_all's warm-up steps are all padding: afterwards generation gives the tokens of
    a fresh engine (in the simulator the steps run eagerly; on a GPU they are captured). A
    budget of 8 tokens and 2 sequences: one token bucket, so two mixed buckets and four decode
    ones (greedy and sampled)."""
    prompts = random_prompts(2, seed=6, low=2, high=5)
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    fresh = LLM(engine=_engine(True, 8, 2, **SMALL)).generate(prompts, params)
    warmed_engine = _engine(not cuda_available(), 8, 2, **SMALL)
    executor = warmed_engine.runner.executor
    assert executor.buckets == executor.seq_buckets == [1, 2]
    executor.capture_all(mixed_max_seqs=2)
    buckets = {(t, s) for t in executor.token_buckets for s in (1, 2)}
    assert set(executor._mixed_batches) == buckets and len(buckets) >= 2
    assert set(executor._decode_batches) == {1, 2}
    warmed = LLM(engine=warmed_engine).generate(prompts, params)
    assert [o.outputs[0].token_ids for o in warmed] == [o.outputs[0].token_ids for o in fresh]


def test_capture_graphs_at_start_builds_every_decode_and_burst_bucket_before_ready():
    """EngineConfig.capture_graphs_at_start (`tinychat serve`): the engine comes back with every
    decode bucket and every prefill/mixed bucket of a burst (up to CAPTURE_MIXED_SEQS sequences
    and CAPTURE_MIXED_TOKENS tokens) already run, and on a GPU captured with both samplers; its
    tokens are a lazily capturing engine's."""
    from gpu.backends.cuda import CudaBackend
    from gpu.backends.cuda.executor import CAPTURE_MIXED_TOKENS

    config = tiny_config(**SMALL)
    tensors = random_hf_tensors(config, seed=5, std=0.3)

    def build(at_start: bool):
        engine_config = EngineConfig(
            enforce_eager=not cuda_available(), num_kv_blocks=128, max_num_seqs=4,
            max_num_batched_tokens=16, capture_graphs_at_start=at_start,
        )  # fmt: skip
        return build_engine(config, tensors.__getitem__, CudaBackend(), engine_config)

    engine = build(True)
    executor = engine.runner.executor
    mixed = {
        (t, s)
        for t in executor.token_buckets
        for s in executor.seq_buckets
        if s <= t <= CAPTURE_MIXED_TOKENS
    }
    assert set(executor._mixed_batches) == mixed and set(executor._decode_batches) == {1, 2, 4}
    if cuda_available():
        want = {("decode", b, g) for b in (1, 2, 4) for g in (True, False)}
        want |= {("mixed", t, s, g) for t, s in mixed for g in (True, False)}
        assert want <= set(executor.graphs)
    prompts = random_prompts(2, seed=8, low=2, high=12)
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=3, ignore_eos=True)
    lazy = LLM(engine=build(False)).generate(prompts, params)
    warmed = LLM(engine=engine).generate(prompts, params)
    assert [o.outputs[0].token_ids for o in warmed] == [o.outputs[0].token_ids for o in lazy]
