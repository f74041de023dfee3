"""The cuda backend end to end on a tiny random model: the engine's steps (chunked prefill
mixed with decodes, paged KV, split-KV decode) give the logits and greedy tokens of the cpu
backend. In the simulator the matrix products are numpy (SimulatorGemm); on a GPU, cuBLAS.

Weights are rounded to bf16 for both backends, so what differs is the cuda backend's bf16
activations and KV cache: logits agree to ~1e-2. Fixed seeds: a glue test, not a kernel test.
"""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import tiny_config
from kernel_helpers import gpu_code_path

from gpu import EngineConfig, SamplingParams
from gpu.backends.cpu import CpuBackend
from gpu.backends.cuda import CudaBackend
from gpu.kernels import attention_decode, gemv_mma
from gpu.kernels.bf16 import round_to_bf16
from gpu.loader import build_engine
from gpu.model_weights import random_hf_tensors


def _engines(config, cuda_backend=CudaBackend, **engine_args):
    tensors = {k: round_to_bf16(v) for k, v in random_hf_tensors(config, seed=3, std=0.1).items()}
    engines = []
    for backend in (CpuBackend(), cuda_backend(debug=True)):
        engines.append(
            build_engine(config, tensors.__getitem__, backend, EngineConfig(**engine_args))
        )
    return engines


class RecordRows:
    """Wraps an executor to remember how many rows the last step sampled."""

    def __init__(self, executor) -> None:
        self.executor, self.model, self.rows = executor, executor.model, 0

    def execute(self, batch, metadata):
        self.rows = metadata.num_rows
        return self.executor.execute(batch, metadata)


def _logits(engine) -> np.ndarray:
    recorder = engine.runner.executor
    return recorder.model.backend.to_host(recorder.model.logits[: recorder.rows])


# Steps of one token run gpu/kernels/gemv.py's fused kernels; on a GPU, steps of 2-8 tokens
# gemv_mma.py's; larger ones (all of them in the simulator) the composed ops over the
# (simulated) cuBLAS path. Three prompts: chunked prefill mixed with decodes of 2-3
# sequences, then single-sequence decode steps as they finish; one prompt: every decode step
# is a single token.
PROMPTS = [[5, 17, 33, 2, 9, 41, 7], [11, 3], [60, 61, 62, 63, 64]]


@pytest.mark.parametrize(("gqa", "budget", "prompts"), [(2, 8, PROMPTS), (3, 16, PROMPTS),
                                                        (2, 8, PROMPTS[:1])])  # fmt: skip
def test_engine_steps_match_the_cpu_backend(gqa, budget, prompts):
    config = tiny_config(
        num_hidden_layers=1, num_attention_heads=2 * gqa, num_key_value_heads=2, head_dim=16,
        hidden_size=48, intermediate_size=64, vocab_size=96,
    )  # fmt: skip
    _compare_steps(config, prompts, block_size=4, budget=budget, max_tokens=3)


def test_engine_steps_with_the_tensor_core_decode():
    """head_dim 64 and GQA 4 (Llama-3.2-1B's attention shape), the decode attention on its
    tensor-core walk (in the simulator: mma.py's twin, and the GPU path's shuffles)."""
    config = tiny_config(
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=1, head_dim=64,
        hidden_size=64, intermediate_size=64, vocab_size=96,
    )  # fmt: skip
    with gpu_code_path(attention_decode):
        # the engine's default build for this shape is the tensor-core one
        default = attention_decode.decode_kernel(64, 4, 16)
        assert default is attention_decode.decode_kernel(64, 4, 16, tensor_cores=True)
        _compare_steps(config, PROMPTS, block_size=16, budget=8, max_tokens=4)


def test_engine_steps_through_the_tensor_core_gemv(monkeypatch):
    """Steps of 2-8 tokens through gpu/kernels/gemv_mma.py (rmsnorm, then the product with
    its rope / SiLU / residual epilogue), as on a GPU; the simulator sends them to the
    composed ops unless told to (its mma twin is slow). Prefill chunks of up to 8 tokens and
    decodes of 2 sequences."""
    monkeypatch.setattr(gemv_mma, "SERVE_TOKENS", gemv_mma.MAX_TOKENS)
    config = tiny_config(
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        hidden_size=48, intermediate_size=64, vocab_size=96,
    )  # fmt: skip
    _compare_steps(config, PROMPTS[:2], block_size=4, budget=8, max_tokens=2)


def test_batch_invariant_engine_steps_match_the_cpu_backend():
    """The batch-invariant mode's ops (gpu/backends/cuda/batch_invariant.py: every product in
    whole chunks, every attention row through the wide prefill tiles, decode rows included)."""
    from gpu.backends.cuda.batch_invariant import BatchInvariantCudaBackend

    config = tiny_config(
        num_hidden_layers=1, num_attention_heads=6, num_key_value_heads=2, head_dim=16,
        hidden_size=48, intermediate_size=64, vocab_size=96,
    )  # fmt: skip
    _compare_steps(config, PROMPTS, 4, 8, 3, cuda_backend=BatchInvariantCudaBackend)


def _compare_steps(
    config, prompts, block_size: int, budget: int, max_tokens: int, cuda_backend=CudaBackend
) -> None:
    """Both backends step the same requests: every sampling step's logits agree to 2e-2 of
    their largest, and the greedy tokens are the same."""
    cpu, gpu = _engines(
        config, cuda_backend, block_size=block_size, num_kv_blocks=24,
        max_num_batched_tokens=budget, max_num_seqs=3,
    )  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for engine in (cpu, gpu):
        engine.runner.executor = RecordRows(engine.runner.executor)
        for p in prompts:
            engine.add_request(p, params)
    finished: list[dict] = [{}, {}]
    steps = compared = 0
    while cpu.has_unfinished_requests() or gpu.has_unfinished_requests():
        outs = [cpu.step(), gpu.step()]
        steps += 1
        for i, out in enumerate(outs):
            for o in out:
                if o.finished:
                    finished[i][o.request_id] = o.outputs[0].token_ids
        want, got = _logits(cpu), _logits(gpu)
        assert want.shape == got.shape
        if want.size:
            err = np.abs(got - want).max() / np.abs(want).max()
            assert err < 2e-2, f"step {steps}: relative logits error {err}"
            compared += 1
        assert steps < 20
    assert compared >= steps - 1  # the wrapper saw the steps (every one but a prefill's first)
    assert finished[0] == finished[1]
    assert gpu.block_manager.num_used_blocks == 0
