"""The quantized CPU path (gpu/backends/cpu_quant.py): each Numba kernel against its float32
numpy twin, the whole forward against the oracle on the same (dequantized) weights, and the
engine on it.

The kernels dequantize exactly (a scale times a small integer, plus Q4_1's minimum), so against
the oracle on the dequantized weights only the order of float32 sums differs: the tolerances
below are float32 rounding, not quantization error. (Where the CPU has AVX2 the q8 product
rounds the activations to int16 first: the oracle gets them rounded the same way,
`_as_the_kernel_sees`.) Quantization error itself is bounded in
test_quantization_error_is_half_a_step.
"""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import byte_tokenizer, random_prompts, tiny_config

from gpu import EngineConfig, SamplingParams
from gpu.backends.cpu import CpuBackend
from gpu.backends.cpu_quant import CpuQuantBackend, QuantizedMatrix
from gpu.backends.cpu_threads import _cgroup_quota, resolve_threads, usable_cpus
from gpu.kernels.cpu import quant_gemm as qg
from gpu.loader import build_engine
from gpu.model_weights import random_hf_tensors

FORMATS = ("q8", "q4")


def _dequantized(w: np.ndarray, fmt: str) -> np.ndarray:
    m = QuantizedMatrix.quantize(w, fmt)
    return m.dequantize_rows(np.arange(w.shape[0]))


def _as_the_kernel_sees(x: np.ndarray, fmt: str) -> np.ndarray:
    return qg.int16_activations(x) if fmt == "q8" and qg.HAS_PMADDWD else x


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantization_error_is_half_a_step(fmt):
    w = np.random.default_rng(0).standard_normal((19, 75)).astype(np.float32)  # K: 2 blocks + 11
    m = QuantizedMatrix.quantize(w, fmt)
    err = np.abs(_dequantized(w, fmt) - w)
    if fmt == "q8":  # one scale a row; rows padded to an even count, K to whole vectors
        assert m.qs.shape == (20, 80) and not m.qs[19].any() and not m.qs[:, 75:].any()
        step = m.d[:19, None]
    else:  # Q4_1 blocks of 32, K zero-padded to whole blocks
        assert m.qs.shape == (19, 48)
        step = np.repeat(m.d, qg.QK, axis=1)[:, :75]
    assert np.all(err <= step / 2 + 1e-6)


def test_q4_1_recovers_a_q4_1_grid():
    """A weight already on a Q4_1 grid (the default model's GGUF) comes back as it was."""
    rng = np.random.default_rng(1)
    q = rng.integers(0, 16, (8, 64)).astype(np.float32)
    q[:, ::32], q[:, 1::32] = 0, 15  # every block spans the whole grid
    d, lo = rng.uniform(0.01, 0.1, (8, 2)), rng.uniform(-1, 0, (8, 2))
    w = (q.reshape(8, 2, 32) * d[..., None] + lo[..., None]).reshape(8, 64).astype(np.float32)
    np.testing.assert_allclose(_dequantized(w, "q4"), w, rtol=0, atol=1e-6)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(
    "n, k, t",
    [(37, 70, 1), (37, 70, 3), (8, 32, 1), (51, 96, 5), (51, 96, 7)],
    ids=["odd-k-one-token", "odd-k-3-tokens", "one-block", "5-tokens", "7-tokens"],
)
@pytest.mark.parametrize("accumulate", [False, True], ids=["store", "accumulate"])
def test_gemm_matches_the_float32_twin(fmt, n, k, t, accumulate):
    rng = np.random.default_rng(n * k + t)
    w = rng.standard_normal((n, k)).astype(np.float32)
    x = rng.standard_normal((t, k)).astype(np.float32)
    start = rng.standard_normal((t, n)).astype(np.float32)
    m = QuantizedMatrix.quantize(w, fmt)
    out = start.copy()
    m.matmul(x, out, accumulate)
    expected = x @ _dequantized(w, fmt).T + (start if accumulate else 0)
    seen = _as_the_kernel_sees(x, fmt) @ _dequantized(w, fmt).T + (start if accumulate else 0)
    np.testing.assert_allclose(out, seen, rtol=1e-5, atol=1e-4)
    if fmt == "q8":  # the float product (CPUs without AVX2) on the same weights
        out = start.copy()
        qg.gemm_q8_float(x, m.qs, m.d, out, accumulate)
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(not qg.HAS_PMADDWD, reason="the integer q8 product needs AVX2")
def test_integer_q8_product_sums_long_rows_without_overflow():
    """Every product at its largest (127 * 32767), K = 9,000: the 32-bit lanes hold a stretch
    of CHUNK elements each, and the stretches are added in float32."""
    w, x = np.ones((3, 9000), np.float32), np.ones((2, 9000), np.float32)
    m = QuantizedMatrix.quantize(w, "q8")
    out = np.zeros((2, 3), np.float32)
    m.matmul(x, out, accumulate=False)
    np.testing.assert_array_equal(out, 9000.0)


@pytest.mark.skipif(not qg.HAS_PMADDWD, reason="the integer q8 product needs AVX2")
@pytest.mark.parametrize("accumulate", [False, True], ids=["store", "accumulate"])
def test_integer_q8_product_of_a_token_does_not_depend_on_the_batch(accumulate):
    """Each token's row of a product of 1 to 9 tokens (the four-, two- and one-token passes)
    is bit for bit its product alone: with `out += value` fused into an FMA in some passes and
    not others, 15% of a row differed by an ulp, and a seeded request sampled other tokens in
    a batch than alone."""
    rng = np.random.default_rng(8)
    m = QuantizedMatrix.quantize(rng.standard_normal((70, 96)).astype(np.float32), "q8")
    x = rng.standard_normal((9, 96)).astype(np.float32)
    start = rng.standard_normal((9, 70)).astype(np.float32)
    alone = start.copy()
    for t in range(9):
        m.matmul(x[t : t + 1], alone[t : t + 1], accumulate)
    for tokens in range(2, 10):
        out = start[:tokens].copy()
        m.matmul(x[:tokens], out, accumulate)
        np.testing.assert_array_equal(out, alone[:tokens])


@pytest.mark.parametrize("fmt", FORMATS)
def test_backend_ops_match_the_oracle(fmt):
    rng = np.random.default_rng(2)
    quant, oracle = CpuQuantBackend(fmt), CpuBackend()
    w = rng.standard_normal((45, 40)).astype(np.float32)
    x = rng.standard_normal((5, 40)).astype(np.float32)
    qw, fw = quant.weight(w, "matrix"), oracle.weight(_dequantized(w, fmt), "matrix")
    got, expected = np.empty((5, 45), np.float32), np.empty((5, 45), np.float32)
    quant.linear(x, qw, got)
    oracle.linear(_as_the_kernel_sees(x, fmt), fw, expected)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
    residual, scratch = rng.standard_normal((5, 45)).astype(np.float32), np.empty((5, 45))
    want = residual + expected
    quant.linear_residual(x, qw, residual, scratch)
    np.testing.assert_allclose(residual, want, rtol=1e-5, atol=1e-4)
    # The embedding (per-row int8 on both paths): rows looked up, a token still in flight
    # taken from the last step's ids.
    table = quant.weight(w, "embedding")
    assert table.fmt == "q8"
    ids, prev_rows = np.array([3, 0, 44], np.int32), np.array([-1, 1, -1])
    sampled = np.array([9, 7])
    got, expected = np.empty((3, 40), np.float32), np.empty((3, 40), np.float32)
    quant.embed(ids, table, got, prev_rows, sampled)
    oracle.embed(
        ids, oracle.weight(_dequantized(w, "q8"), "embedding"), expected, prev_rows, sampled
    )
    np.testing.assert_array_equal(got, expected)


def _engines(fmt: str, config, seed: int = 0, std: float = 0.35, **engine_args):
    """The same random model on the quantized path and, on its dequantized weights, on the
    float32 oracle."""
    tensors = random_hf_tensors(config, seed=seed, std=std)
    matrices = {n: t for n, t in tensors.items() if t.ndim == 2}
    dequantized = {
        **tensors,
        **{n: _dequantized(t, "q8" if "embed" in n else fmt) for n, t in matrices.items()},
    }
    engine_args.setdefault("num_kv_blocks", 128)

    def build(backend, weights):
        return build_engine(
            config, weights.__getitem__, backend, EngineConfig(**engine_args),
            tokenizer=byte_tokenizer(), model_name="tiny-random",
        )  # fmt: skip

    return build(CpuQuantBackend(fmt), tensors), build(CpuBackend(), dequantized)


@pytest.mark.parametrize("fmt", FORMATS)
def test_engine_matches_the_oracle_on_the_same_weights(fmt):
    """Odd widths (hidden 48, intermediate 80: K not a multiple of 32), a tied head, batched
    prompts of mixed lengths with chunked prefill and decode: the tokens are the oracle's."""
    config = tiny_config(
        hidden_size=48, intermediate_size=80, head_dim=12, tie_word_embeddings=True
    )
    quant, oracle = _engines(fmt, config, max_num_batched_tokens=32)
    prompts = random_prompts(5, seed=3)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, detokenize=False)

    def run(engine):
        ids = [engine.add_request(p, params) for p in prompts]
        done = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = out.outputs[0].token_ids
        return [done[i] for i in ids]

    assert run(quant) == run(oracle)


def test_usable_cpus_and_thread_choice(tmp_path, monkeypatch):
    import os

    assert 1 <= usable_cpus() <= len(os.sched_getaffinity(0))
    limit = tmp_path / "cpu.max"
    limit.write_text("150000 100000\n")
    assert _cgroup_quota(limit) == 1.5
    limit.write_text("max 100000\n")
    assert _cgroup_quota(limit) is None
    assert _cgroup_quota(tmp_path / "absent") is None
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert resolve_threads(3) == 3
    assert resolve_threads(None) == usable_cpus()
    assert resolve_threads(None, reserve=64) == 1  # never below one
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    assert resolve_threads(None) == 1


def test_precision_is_checked():
    with pytest.raises(ValueError, match="precision"):
        EngineConfig(precision="q3")
    with pytest.raises(ValueError, match="precision"):
        CpuQuantBackend("float16")


@pytest.mark.parametrize("q_lens", [(1, 1, 1), (5, 1, 3)], ids=["decode", "mixed-prefill"])
def test_paged_attention_matches_the_oracle(q_lens):
    """Three sequences over shuffled blocks (contexts 1, 17 and 40 with block size 16), GQA 6/2,
    head_dim 12; each sequence's last q_len rows are this step's queries."""
    from types import SimpleNamespace

    from gpu.kernels.cpu.attention import paged_attention

    rng = np.random.default_rng(5)
    nh, nkv, hd, bs = 6, 2, 12, 16
    ctx = np.array([max(1, q_lens[0]), 17, 40], np.int32)
    k_cache = rng.standard_normal((12, bs, nkv, hd)).astype(np.float32)
    v_cache = rng.standard_normal((12, bs, nkv, hd)).astype(np.float32)
    tables = rng.permutation(12)[:9].reshape(3, 3).astype(np.int32)
    qsl = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    qkv = rng.standard_normal((qsl[-1], (nh + 2 * nkv) * hd)).astype(np.float32)
    batch = SimpleNamespace(
        num_seqs=3, query_start_loc=qsl, seq_lens=ctx, block_tables=tables, max_seq_len=40
    )
    expected = np.zeros((qsl[-1], nh * hd), np.float32)
    CpuBackend().attention(qkv, k_cache, v_cache, batch, nh, nkv, hd, hd**-0.5, expected)
    got = np.zeros_like(expected)
    k_heads, v_heads = (np.ascontiguousarray(c.transpose(0, 2, 1, 3)) for c in (k_cache, v_cache))
    paged_attention(
        qkv, k_heads, v_heads, qsl, ctx, tables, nh, hd, nh // nkv, np.float32(hd**-0.5), 40, got
    )
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_small_ops_match_the_oracle():
    """RMSNorm, RoPE + KV write (one row skipped by a negative slot) and SiLU-mul against the
    oracle's numpy ops, on 3 rows of odd widths."""
    from gpu.rope import rope_cos_sin

    rng = np.random.default_rng(6)
    quant, oracle = CpuQuantBackend("q8"), CpuBackend()
    x, w = rng.standard_normal((3, 45)).astype(np.float32), rng.standard_normal(45)
    got, expected = np.empty_like(x), np.empty_like(x)
    quant.rmsnorm(x, w.astype(np.float32), 1e-5, got)
    oracle.rmsnorm(x, w.astype(np.float32), 1e-5, expected)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)

    nh, nkv, hd = 3, 1, 10
    cos, sin = rope_cos_sin(hd, 10000.0, 64, None)
    qkv = rng.standard_normal((3, (nh + 2 * nkv) * hd)).astype(np.float32)
    positions, slots = np.array([5, 17, 63], np.int32), np.array([3, -1, 30], np.int32)
    mine_kv = quant.allocate_kv_cache(1, 2, 16, nkv, hd)[0]  # head-major blocks
    theirs_kv = oracle.allocate_kv_cache(1, 2, 16, nkv, hd)[0]
    mine, theirs = qkv.copy(), qkv.copy()
    quant.rope_kv_write(mine, positions, cos, sin, *mine_kv, slots, nh, nkv, hd)
    oracle.rope_kv_write(theirs, positions, cos, sin, *theirs_kv, slots, nh, nkv, hd)
    np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
    k_heads, v_heads = (c.transpose(0, 2, 1, 3) for c in theirs_kv)
    np.testing.assert_allclose(mine_kv[0], k_heads, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(mine_kv[1], v_heads)

    gate_up = rng.standard_normal((3, 2 * 37)).astype(np.float32) * 10
    got, expected = np.empty((3, 37), np.float32), np.empty((3, 37), np.float32)
    quant.silu_mul(gate_up, got)
    oracle.silu_mul(gate_up, expected)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_cpu_paths_table(capsys, tmp_path, monkeypatch):
    """The bench's cpu comparison prints every path's rows, the batch ratio and the accuracy
    columns; without llama_cpp it says so (llama.cpp is a bench-only import)."""
    import sys

    from gpu.bench.cpu_paths import open_llama_cpp, print_cpu_paths

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if not installed
    assert open_llama_cpp(tmp_path / "m.gguf", 2, 8, 8) is None
    golden = [{"first_divergence": None, "gap": None}, {"first_divergence": 3, "gap": 0.0731}]
    paths = {
        "q8": {"load_s": 1.0, "tok_s": {1: 30.0, 8: 120.0}, "perplexity": 56.7, "golden": golden},
        "float32": {"load_s": 1.0, "tok_s": {1: 25.0, 8: 50.0}},
    }
    print_cpu_paths({"threads": 2, "paths": paths})
    text = capsys.readouterr().out
    assert "q8" in text and "4.00x" in text and "2.00x" in text
    assert "56.70  1/2 agree: =, 3 (0.073)" in text
    assert "llama.cpp: not measured" in text
    paths["q8"]["vs_llama_cpp"] = 0.5
    llama = {"tok_s_b1": 60.0, "runs": [50.0, 60.0, 70.0], "version": "x"}
    print_cpu_paths({"threads": 2, "paths": paths, "llama_cpp": llama})
    text = capsys.readouterr().out
    assert "(50.0-70.0 over 3 runs)" in text
    assert "q8 b1 / llama.cpp b1, run by run: 0.50x" in text


def test_every_cpu_kernel_states_its_float_flags():
    """A Numba function that leaves fastmath or error_model unset is compiled with the flags of
    the caller that compiles it first: the q8 product's strict activation rounding took its
    fastmath caller's, and rounded apart fresh and cache-loaded. Each kernel says its own."""
    import importlib
    import pkgutil

    from numba.core.registry import CPUDispatcher

    import gpu.kernels.cpu as cpu_kernels

    kernels = []
    for info in pkgutil.iter_modules(cpu_kernels.__path__):
        module = importlib.import_module(f"gpu.kernels.cpu.{info.name}")
        kernels += [
            f for f in vars(module).values()
            if isinstance(f, CPUDispatcher) and f.__module__ == module.__name__
        ]  # fmt: skip
    assert len(kernels) > 20
    unstated = [
        k.__name__ for k in kernels if not {"fastmath", "error_model"} <= set(k.targetoptions)
    ]
    assert not unstated
