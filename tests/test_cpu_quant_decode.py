"""The q8 path's fused decode step (gpu/kernels/cpu/decode_step.py) against its per-op path,
and the barrier it runs on (gpu/kernels/cpu/barrier.py).

The fused step calls the per-op kernels' own inner functions, so its logits and KV writes are
the per-op path's, bit for bit as measured (one process compiling both, or another process
having compiled the per-op kernels first). One difference is known: the attention kernel
rounds apart (2.4e-7 on the same inputs) when Numba's JIT runs it freshly compiled and when it
is loaded from Numba's cache, a property of fastmath's flags together (BENCHMARKS.md), and the
next layer's int16 rounding of the activations can turn that into a step of max|x| / 32767.
ATOL allows that through three layers; a wrong row or a race is O(1)."""

from __future__ import annotations

import gc
import threading

import numba
import numpy as np
import pytest
from engine_helpers import tiny_config
from numba.core.registry import CPUDispatcher

from gpu.backends.cpu_quant import CpuQuantBackend
from gpu.config import EngineConfig
from gpu.forward_batch import ForwardBatch
from gpu.kernels.cpu.barrier import barrier_wait, check_in, new_state
from gpu.loader import build_engine
from gpu.model import LlamaModel
from gpu.model_weights import load_llama_weights, random_hf_tensors
from gpu.sampling_presets import chat_sampling_params

BLOCK = 16
ATOL = 1e-3  # logits of order 1 (measured: 0 with a warm cache, 9e-5 with a cold one)


def _model(config, threads: int) -> LlamaModel:
    backend = CpuQuantBackend("q8", threads)
    tensors = random_hf_tensors(config, seed=5, std=0.1)
    weights = load_llama_weights(
        tensors.__getitem__, config.num_hidden_layers, config.tie_word_embeddings, backend
    )
    model = LlamaModel(config, weights, backend, 128, 8, config.max_position_embeddings)
    model.kv_caches = backend.allocate_kv_cache(
        config.num_hidden_layers, 40, BLOCK, config.num_key_value_heads, config.head_dim
    )
    return model


def _batch(lens: list[int], new: int, table: np.ndarray) -> ForwardBatch:
    """`new` query rows for each sequence, whose context then is lens[b] (sequence b owns rows
    b * 8 .. of the shuffled block table)."""
    rows = [np.arange(n - new, n, dtype=np.int32) for n in lens]
    slots = [table[b, p // BLOCK] * BLOCK + p % BLOCK for b, p in enumerate(rows)]
    return ForwardBatch(
        num_tokens=new * len(lens),
        num_seqs=len(lens),
        input_ids=np.random.default_rng(sum(lens)).integers(0, 250, new * len(lens), np.int32),
        positions=np.concatenate(rows),
        slot_mapping=np.concatenate(slots).astype(np.int32),
        query_start_loc=np.arange(0, new * len(lens) + 1, new, dtype=np.int32),
        seq_lens=np.array(lens, np.int32),
        block_tables=table[: len(lens)],
        logits_indices=np.arange(new - 1, new * len(lens), new, dtype=np.int32),
        max_query_len=new,
        max_seq_len=max(lens),
    )


@pytest.mark.parametrize("lens", [[37], [21, 50, 9]], ids=["batch1", "batch3"])
def test_fused_decode_step_is_the_per_op_step(lens):
    """Three layers, GQA (6 query heads on 2 KV heads), odd widths, a tied head."""
    config = tiny_config(
        hidden_size=48, intermediate_size=80, head_dim=12, num_attention_heads=6,
        num_key_value_heads=2, num_hidden_layers=3, tie_word_embeddings=True,
    )  # fmt: skip
    model = _model(config, threads=2)
    backend = model.backend
    table = np.random.default_rng(0).permutation(40).astype(np.int32).reshape(5, 8)
    for b, n in enumerate(lens):  # each sequence's context, prefilled op by op
        one = _batch([n - 1], n - 1, table[b : b + 1])
        assert not backend.decode_forward(model, one, model.logits[:1])  # prefill: not fused
        model.forward(one, 1)
    step = _batch(lens, 1, table)
    kv = [a.copy() for a in backend._kv]
    fused_step = backend.decode_forward
    ran = []
    backend.decode_forward = lambda *args: ran.append(fused_step(*args)) or ran[-1]
    fused = model.forward(step, len(lens)).copy()
    assert ran == [True]
    stacked = backend._stacked.matrices[0][0]  # [L, N, Kp], and each layer a view of it
    assert all(lw.qkv_proj.qs.base is stacked for lw in model.weights.layers)
    fused_kv = [a.copy() for a in backend._kv]
    for a, saved in zip(backend._kv, kv, strict=True):
        a[...] = saved
    backend.decode_forward = lambda *args: False  # the per-op path
    per_op = model.forward(step, len(lens)).copy()
    np.testing.assert_allclose(fused, per_op, rtol=0, atol=ATOL)
    for a, b in zip(fused_kv, backend._kv, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=ATOL)
    assert np.abs(fused).max() > 0.1  # the logits are real ones


@pytest.mark.parametrize("cut", [2, 5, 18, 22])
def test_a_prompt_prefilled_in_two_chunks_gets_the_logits_of_one(cut):
    """Chunked prefill splits a prompt where the step's token budget runs out: the logits of
    its last token do not depend on where (the chunks' tokens fall into the product's passes of
    four, two and one token at other places), so a seeded request samples the same tokens
    alone and among others. (Both chunks hold two tokens or more: the per-op path. A chunk of
    one token runs the fused decode step, whose rounding is the per-op path's only when both
    were compiled in one process: see the module's docstring.)"""
    config = tiny_config(
        hidden_size=48, intermediate_size=80, head_dim=12, num_attention_heads=6,
        num_key_value_heads=2, num_hidden_layers=3, tie_word_embeddings=True,
    )  # fmt: skip
    model = _model(config, threads=2)
    table = np.random.default_rng(1).permutation(40).astype(np.int32).reshape(5, 8)
    ids = np.random.default_rng(2).integers(0, 250, 24).astype(np.int32)

    def chunk(start: int, stop: int) -> np.ndarray:
        step = _batch([stop], stop - start, table[:1])
        step.input_ids = ids[start:stop].copy()
        return model.forward(step, 1).copy()

    whole = chunk(0, 24)
    chunk(0, cut)
    np.testing.assert_array_equal(chunk(cut, 24), whole)


def test_a_thread_count_other_than_the_shares_runs_op_by_op():
    config = tiny_config(num_hidden_layers=1)
    model = _model(config, threads=2)
    table = np.arange(40, dtype=np.int32).reshape(5, 8)
    step = _batch([5], 1, table)
    model.forward(step, 1)  # sets this thread's Numba threads to the backend's 2
    try:
        numba.set_num_threads(1)
        assert not model.backend.decode_forward(model, step, model.logits[:1])
    finally:
        numba.set_num_threads(2)
    assert model.backend.decode_forward(model, step, model.logits[:1])


def _overloads() -> int:
    """Compiled (or cache-loaded) signatures of every live Numba CPU function."""
    return sum(len(f.overloads) for f in gc.get_objects() if isinstance(f, CPUDispatcher))


def test_the_engine_compiles_every_kernel_before_it_is_ready():
    """build_engine's warm-up runs the quantized path's kernels (a first start compiles them
    there, with the loader's progress line), so a reply with the app's sampling, prefill and
    decode steps both, compiles nothing."""
    config = tiny_config(tie_word_embeddings=True)
    tensors = random_hf_tensors(config, seed=3, std=0.1)
    backend = CpuQuantBackend("q8", numba.get_num_threads())
    stages = []
    engine = build_engine(
        config, tensors.__getitem__, backend, EngineConfig(num_kv_blocks=64),
        progress=lambda stage, done, total: stages.append(stage),
    )  # fmt: skip
    assert any(stage.startswith("warming up") for stage in stages)
    before = _overloads()
    params = chat_sampling_params(max_tokens=6, seed=1, ignore_eos=True)
    engine.add_request(list(range(3, 40)), params)
    engine.add_request(list(range(7, 20)), params)
    while engine.has_unfinished_requests():
        engine.step()
    assert _overloads() == before


@numba.njit(nogil=True)
def _rounds(state, n, share, seen, rounds, errors):
    """Each round every share writes its slot, and after the barrier must see all slots."""
    if not check_in(state, n, 3_000_000_000):
        return False
    sense = 0
    for r in range(rounds):
        seen[share] = r
        sense = barrier_wait(state, n, sense)
        for i in range(n):
            errors[share] += seen[i] != r
        sense = barrier_wait(state, n, sense)
    return True


@pytest.mark.parametrize("n", [2, 3])
def test_barrier_orders_every_round(n):
    """Threads of Python (nogil) as the shares: 3 of them on a 2-core host wait by yielding."""
    state, seen, errors = new_state(), np.full(n, -1), np.zeros(n, np.int64)
    done = [None] * n

    def share(i):
        done[i] = _rounds(state, n, i, seen, 300, errors)

    threads = [threading.Thread(target=share, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert done == [True] * n and not errors.any() and (seen == 299).all()


@numba.njit(nogil=True)
def _check_in(state, n, timeout):
    return check_in(state, n, timeout)


def test_check_in_gives_up_when_a_share_never_comes():
    """A lone share gives up after the timeout; one that comes later learns the step is off."""
    state = new_state()
    assert not _check_in(state, 2, 1_000_000)
    assert not _check_in(state, 2, 1_000_000)
