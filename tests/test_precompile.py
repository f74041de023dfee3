"""No compile stalls: the kernel cache lives under $TINYCHAT_HOME, the precompile covers every
step a reply can run, and (on a GPU) nothing compiles once the engine is ready.

The cache folder and the discovery of kernels run with no GPU: a subprocess with the simulator
off, where Numba builds real dispatchers and the recorder stands in for their launches. The
last test builds an engine and runs replies, so it needs the GPU.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from engine_helpers import tiny_config

from gpu import LLM, EngineConfig, SamplingParams
from gpu.backends import cuda_available
from gpu.loader import build_engine
from gpu.model_weights import random_hf_tensors
from gpu.sampling import SamplingMetadata

ROOT = Path(__file__).resolve().parents[1]


def _run(script: str, **env: str | None) -> dict:
    """Run `script` with the simulator off (real Numba dispatchers, no GPU needed) and the
    environment changed by `env` (None: unset); return the JSON it prints last."""
    # ROOT first, the rest kept: the GPU machine's carried wheels are on PYTHONPATH too.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    environ = dict(os.environ, NUMBA_ENABLE_CUDASIM="0", PYTHONPATH=path)
    for key, value in env.items():
        if value is None:
            environ.pop(key, None)
        else:
            environ[key] = value
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, env=environ,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


CACHE_PATHS = """
    import json{first}
    from numba.core import config
    from gpu.kernels import embedding, gemv
    kernel = gemv.gemv_kernel(512, 1, 8, 256, "rmsnorm", "rope")  # a factory's kernel
    from gpu.kernels.compile_cache import kernel_sources_hash
    kernels = (embedding.embedding_kernel, kernel)
    stamps = [k._cache._impl.locator.get_source_stamp() for k in kernels]
    assert stamps == [kernel_sources_hash()] * 2, stamps
    print(json.dumps([config.CACHE_DIR, embedding.embedding_kernel._cache._cache_path,
                      kernel._cache._cache_path]))
"""


@pytest.mark.parametrize("numba_first", [False, True])
def test_kernel_cache_lives_under_tinychat_home(tmp_path, numba_first):
    """With numba imported before the kernels or not, every kernel's cache is in
    $TINYCHAT_HOME/numba-cache/gpu-kernels whatever the install path (a new venv over the same
    home finds it), stamped with the hash of the kernel sources."""
    home = tmp_path / "home"
    script = CACHE_PATHS.format(first="\n    import numba.cuda" if numba_first else "")
    config_dir, *kernel_dirs = _run(script, TINYCHAT_HOME=str(home), NUMBA_CACHE_DIR=None)
    assert config_dir == str(home / "numba-cache")
    assert kernel_dirs == [str(home / "numba-cache" / "gpu-kernels")] * 2


def test_a_users_numba_cache_dir_wins(tmp_path):
    mine = tmp_path / "my-numba-cache"
    config_dir, *kernel_dirs = _run(
        CACHE_PATHS.format(first=""), TINYCHAT_HOME=str(tmp_path / "home"),
        NUMBA_CACHE_DIR=str(mine),
    )  # fmt: skip
    assert config_dir == str(mine)
    assert kernel_dirs == [str(mine / "gpu-kernels")] * 2
    assert not (tmp_path / "home" / "numba-cache").exists()


def test_cpu_kernels_are_stamped_by_every_cpu_kernel_source(tmp_path):
    """The CPU kernels' cache is $TINYCHAT_HOME/numba-cache/cpu-kernels, stamped with the hash
    of gpu/kernels/cpu: the decode step, which inlines the per-op kernels of other files, is
    compiled again when any of them changes."""
    home = tmp_path / "home"
    script = """
        import json
        from gpu.kernels.cpu import decode_step, quant_gemm
        from gpu.kernels.compile_cache import CPU_KERNELS_DIR, kernel_sources_hash
        kernels = (decode_step.decode_forward, quant_gemm.gemm_q8_int16)
        stamps = [k._cache._impl.locator.get_source_stamp() for k in kernels]
        assert stamps == [kernel_sources_hash(CPU_KERNELS_DIR)] * 2, stamps
        print(json.dumps([k._cache._cache_path for k in kernels]))
    """
    paths = _run(script, TINYCHAT_HOME=str(home), NUMBA_CACHE_DIR=None)
    assert paths == [str(home / "numba-cache" / "cpu-kernels")] * 2


def test_the_stamp_changes_with_any_kernel_source(tmp_path):
    """An edit to any file of gpu/kernels (a helper included) gives a new stamp."""
    from gpu.kernels.compile_cache import kernel_sources_hash

    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "helper.py").write_text("y = 2\n")
    before = kernel_sources_hash.__wrapped__(tmp_path)
    assert kernel_sources_hash.__wrapped__(tmp_path) == before
    (tmp_path / "helper.py").write_text("y = 3\n")
    assert kernel_sources_hash.__wrapped__(tmp_path) != before


DISCOVER = """
    import json
    import numpy as np
    from numba.cuda.dispatcher import CUDADispatcher
    from gpu.backends.cuda import precompile as pc
    from gpu.kernels import activation, embedding

    original_call, gemm = CUDADispatcher.call, object()
    backend = type("Backend", (), {"gemm": gemm})()
    gate_up, out = np.zeros((2, 8), np.float32), np.zeros((2, 2), np.uint16)
    gemm_calls = []

    def step(rows):  # two launches of one kernel with the same types, one of another
        def run():
            ids = np.zeros(rows, np.int32)
            table, x = np.zeros((4, 8), np.uint16), np.zeros((rows, 8), np.float32)
            embedding.embedding_kernel[1, 32](ids, ids, ids, table, x)
            backend.gemm.linear(x, table, x)
            embedding.embedding_kernel[1, 32](ids, ids, ids, table, x)
            activation.silu_mul_kernel[1, 32](gate_up, out)
        return run

    uses, steps = pc.discover(backend, [("a", step(2)), ("b", step(3))])
    kinds = [(d.py_func.__name__, [str(t) for t in types]) for d, types in uses]
    restored = CUDADispatcher.call is original_call and backend.gemm is gemm

    # The rest of precompile, its cache and compiler faked: what it reports, in which order.
    calls = []
    progress = lambda stage, done, total: calls.append([stage, done, total])
    pc._load_cached = lambda d, a: d is embedding.embedding_kernel  # only that one is cached
    CUDADispatcher.compile = lambda d, a: calls.append(["compile", d.py_func.__name__])
    report = pc.precompile(backend, [("a", step(2))], progress)
    print(json.dumps({"kinds": kinds, "steps": steps, "restored": restored, "calls": calls,
                      "report": [report.kernels, report.loaded, report.compiled]}))
"""


def test_discovery_records_each_kernel_once_and_launches_nothing():
    """The recorder sees every launch of the steps (no GPU needed: nothing runs), keeps each
    (kernel, argument types) once, skips the cuBLAS products, and puts everything back; then
    precompile loads what the cache has, compiles the rest, and reports progress in order."""
    r = _run(DISCOVER)
    assert r["steps"] == 2 and r["restored"]
    names = [name for name, _ in r["kinds"]]
    assert names == ["embedding_kernel", "silu_mul_kernel"]
    assert "int32, 1d, C" in r["kinds"][0][1][0]
    assert r["calls"] == [
        ["loading kernels", 1, 2],
        ["compile", "silu_mul_kernel"],
        ["compiling kernels", 2, 2],
    ]
    assert r["report"] == [2, 1, 1]


def _simulated_cuda_engine(**engine_args):
    """A cuda engine in the simulator (CI) or on the GPU: tiny shapes."""
    from gpu.backends.cuda import CudaBackend

    config = tiny_config(num_hidden_layers=1)
    tensors = random_hf_tensors(config, seed=5, std=0.3)
    return build_engine(
        config, tensors.__getitem__, CudaBackend(), EngineConfig(num_kv_blocks=64, **engine_args)
    )


@pytest.mark.skipif(cuda_available(), reason="the simulator's engine (the GPU test is below)")
def test_warm_up_steps_cover_every_bucket_a_step_can_take():
    """Every step shape the executor can be asked for (decode of 1..max_num_seqs sequences;
    prefill/mixed of t tokens over s <= t sequences) rounds up to a key warm_up_steps holds,
    with both samplers; and no key lies beyond max_num_seqs / max_num_batched_tokens."""
    from types import SimpleNamespace

    max_seqs, max_tokens = 20, 70
    engine = _simulated_cuda_engine(max_num_seqs=max_seqs, max_num_batched_tokens=max_tokens)
    executor = engine.runner.executor
    keys = {key for key, _ in executor.warm_up_steps()}
    for greedy in (True, False):
        for s in range(1, max_seqs + 1):
            batch = SimpleNamespace(num_seqs=s, num_tokens=s, max_query_len=1)
            bucket = executor._decode_bucket(batch, SamplingMetadata.greedy(s))
            assert ("decode", bucket, greedy) in keys
        for t in range(1, max_tokens + 1):
            for s in range(1, min(t, max_seqs) + 1):
                batch = SimpleNamespace(num_seqs=s, num_tokens=t, max_query_len=t - s + 1)
                tokens, seqs = executor._mixed_bucket(batch, SamplingMetadata.greedy(s))
                assert ("mixed", tokens, seqs, greedy) in keys, (t, s)
    assert max(k[1] for k in keys if k[0] == "decode") == max_seqs
    assert max(k[1] for k in keys if k[0] == "mixed") == max_tokens
    assert all(k[2] <= min(k[1], max_seqs) for k in keys if k[0] == "mixed")
    assert executor.precompile() is None  # the simulator compiles nothing


@pytest.mark.skipif(not cuda_available(), reason="needs an NVIDIA GPU (real kernel compiles)")
def test_nothing_compiles_after_the_engine_is_ready():
    """SmolLM2-135M's shapes (2 layers, random weights): once build_engine returns, replies of
    every batch size up to max_num_seqs with every sampling setting compile no kernel."""
    from gpu.backends.cuda import CudaBackend
    from gpu.backends.cuda.precompile import count_compiled_kernels
    from gpu.presets import preset_config

    config = preset_config("smollm2-135m", num_hidden_layers=2)
    tensors = random_hf_tensors(config, seed=1, std=0.05)
    engine = build_engine(
        config, tensors.__getitem__, CudaBackend(),
        EngineConfig(max_num_seqs=8, max_num_batched_tokens=128, num_kv_blocks=256),
    )  # fmt: skip
    report = engine.runner.executor.precompile_report
    assert report is not None and report.kernels > 0
    assert report.already + report.loaded + report.compiled == report.kernels
    ready = count_compiled_kernels()
    llm = LLM(engine=engine)
    settings = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=0.8),
        SamplingParams(temperature=0.8, top_k=40),
        SamplingParams(temperature=0.8, top_p=0.9),
        SamplingParams(temperature=0.8, min_p=0.05),
        SamplingParams(temperature=0.7, top_p=0.9, repetition_penalty=1.1),
        SamplingParams(temperature=0.7, presence_penalty=0.5, frequency_penalty=0.5, min_tokens=3),
    ]
    for params in settings:
        params = dataclasses.replace(params, max_tokens=10, ignore_eos=True, seed=3)
        for batch in range(1, 9):
            prompts = [[(11 * b + 5 * i) % config.vocab_size for i in range(3 + 13 * b)]
                       for b in range(batch)]  # fmt: skip
            outputs = llm.generate(prompts, params)
            assert all(len(o.outputs[0].token_ids) == 10 for o in outputs)
            assert count_compiled_kernels() == ready, (params, batch)
