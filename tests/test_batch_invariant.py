"""The batch-invariant mode's two ops that differ from the default cuda backend
(gpu/backends/cuda/batch_invariant.py), in the CUDA simulator:

* attention with `invariant=True`: a query row's output is the same bits wherever it comes
  from (a decode row alone, any row of a prompt chunk, a chunk starting anywhere, beside other
  sequences and graph padding), and padding rows (no context) come out zero;
* InvariantGemm: every product it runs has exactly its chunk's row count, and the result is the
  product (accumulating where asked) with nothing written past the step's rows.

The whole engine's tokens, alone and in a batch, are compared on the GPU
(tests/test_batch_invariant_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_helpers import ATOL, RTOL, assert_close, bf16_values, fresh_rng, synced
from numba import cuda

from gpu.backends.cpu import CpuBackend
from gpu.backends.cuda.batch_invariant import InvariantGemm
from gpu.backends.cuda.cublas import SimulatorGemm
from gpu.forward_batch import ForwardBatch
from gpu.kernels.attention_prefill import SPLITS, prefill_attention, split_sizes
from gpu.kernels.bf16 import from_bf16_bits, to_bf16_bits

NH, NKV, HD, BS, CTX = 4, 2, 16, 4, 45  # GQA 2, blocks of 4 tokens, a 45-token sequence


def _steps() -> list[list[tuple[int, int]]]:
    """Steps as lists of (seq_len, query rows) over the one cached sequence: its tokens alone
    as decode rows, the whole prompt, the prompt in chunks that start mid-block and mid-tile,
    and mixed steps with decode rows, padding rows (seq_len 0, one row) and empty sequences."""
    return [
        [(p + 1, 1) for p in (0, 5, 11, 22, 31, 44)],
        [(CTX, CTX)],
        [(7, 7), (16, 9), (33, 17), (CTX, 12)],
        [(3, 3), (CTX, 42)],
        [(10, 1), (0, 1), (14, 2), (CTX, CTX), (0, 0), (19, 5), (0, 1), (40, 3)],
        [(22, 13), (6, 1), (1, 1), (21, 4), (CTX, 2), (37, 29)],
    ]


def _run_step(seqs, q_by_pos, k_bits, v_bits, table) -> np.ndarray:
    """One launch of the invariant attention over `seqs`, every sequence reading the same
    cached sequence (block table `table`); query row of position p = q_by_pos[p]."""
    rows = []
    for seq_len, q_len in seqs:
        rows += [q_by_pos[p] if p >= 0 else q_by_pos[0] for p in range(seq_len - q_len, seq_len)]
    qkv = np.stack(rows).astype(np.float32)
    qsl = np.concatenate([[0], np.cumsum([q for _, q in seqs])]).astype(np.int32)
    tables = np.tile(table, len(seqs)).astype(np.int32)
    out = cuda.to_device(np.full((len(rows), NH * HD), 0x7FC0, np.uint16))  # NaN: must be written
    # Split scratch, as the backend passes it (invariant=True must not split).
    o_size, ml_size = split_sizes(len(rows), NH, HD, SPLITS)
    part_o, part_ml = cuda.device_array(o_size, np.float32), cuda.device_array(ml_size, np.float32)
    prefill_attention(
        cuda.to_device(qkv), cuda.to_device(k_bits), cuda.to_device(v_bits),
        cuda.to_device(tables), cuda.to_device(np.array([len(table)], np.int32)),
        cuda.to_device(qsl), cuda.to_device(np.array([s for s, _ in seqs], np.int32)),
        len(seqs), max(q for _, q in seqs), NH, HD**-0.5, out, part_o=part_o,
        part_ml=part_ml, invariant=True,
    )  # fmt: skip
    return synced(out)


def test_invariant_attention_gives_a_row_the_same_bits_in_every_step():
    rng, seed = fresh_rng()
    nblocks = -(-CTX // BS)
    table = rng.permutation(nblocks + 2)[:nblocks].astype(np.int32)
    shape = (nblocks + 2, BS, NKV, HD)
    k, v = bf16_values(rng, shape), bf16_values(rng, shape)
    width = (NH + 2 * NKV) * HD
    q_by_pos = rng.standard_normal((CTX, width)).astype(np.float32)
    # The numpy twin's attention of every position, for the values.
    batch = ForwardBatch(
        num_tokens=CTX, num_seqs=1, input_ids=np.zeros(CTX, np.int32),
        positions=np.arange(CTX, dtype=np.int32), slot_mapping=np.zeros(CTX, np.int32),
        query_start_loc=np.array([0, CTX], np.int32), seq_lens=np.array([CTX], np.int32),
        block_tables=table[None, :], logits_indices=np.array([CTX - 1], np.int32),
        max_query_len=CTX, max_seq_len=CTX,
    )  # fmt: skip
    expected = np.zeros((CTX, NH * HD), np.float32)
    CpuBackend().attention(q_by_pos, k, v, batch, NH, NKV, HD, HD**-0.5, expected)

    seen: dict[int, np.ndarray] = {}
    k_bits, v_bits = to_bf16_bits(k), to_bf16_bits(v)
    for step in _steps():
        out = _run_step(step, q_by_pos, k_bits, v_bits, table)
        row = 0
        for seq_len, q_len in step:
            for p in range(seq_len - q_len, seq_len):
                if p < 0:  # padding: no context, zeros
                    assert not out[row].any(), f"padding row {row} (KERNEL_TEST_SEED={seed})"
                elif p in seen:
                    assert np.array_equal(out[row], seen[p]), (
                        f"position {p} in step {step} differs from its first result "
                        f"(KERNEL_TEST_SEED={seed})"
                    )
                else:
                    seen[p] = out[row]
                row += 1
    assert len(seen) == CTX
    got = from_bf16_bits(np.stack([seen[p] for p in range(CTX)]))
    assert_close(got, expected, RTOL, ATOL, seed, "invariant attention vs the numpy twin")


class _RecordingGemm(SimulatorGemm):
    def __init__(self, stream) -> None:
        super().__init__(stream)
        self.rows: list[int] = []

    def linear(self, x, w, out, accumulate: bool = False) -> None:
        self.rows.append(x.shape[0])
        super().linear(x, w, out, accumulate)


@pytest.mark.parametrize("t", [1, 3, 4, 9, 12])
@pytest.mark.parametrize(
    "accumulate, out_bf16", [(False, False), (True, False), (False, True)]
)  # the residual add accumulates into float32; gate_up writes bf16
def test_invariant_gemm_runs_whole_chunks_and_writes_only_the_steps_rows(t, accumulate, out_bf16):
    rng, seed = fresh_rng()
    k, n, rows, buffer_rows = 24, 10, 4, 16
    stream = cuda.stream()
    inner = _RecordingGemm(stream)
    gemm = InvariantGemm(inner, stream, rows=rows)
    gemm.reserve(k, n)
    x_host = bf16_values(rng, (buffer_rows, k))
    w_host = bf16_values(rng, (n, k))
    before = rng.standard_normal((buffer_rows, n)).astype(np.float32)
    if out_bf16:
        before = from_bf16_bits(to_bf16_bits(before))
    x, w = cuda.to_device(to_bf16_bits(x_host)), cuda.to_device(to_bf16_bits(w_host))
    out = cuda.to_device(to_bf16_bits(before) if out_bf16 else before)
    gemm.linear(x[:t], w, out[:t], accumulate)
    got = synced(out)
    got = from_bf16_bits(got) if out_bf16 else got

    assert inner.rows == [rows] * -(-t // rows), "every product is one whole chunk"
    product = x_host[:t] @ w_host.T
    expected = product + before[:t] if accumulate else product
    tol = 2.0**-7 if out_bf16 else 1e-5
    assert_close(got[:t], expected, tol, 1e-4, seed, "invariant gemm")
    assert np.array_equal(got[t:], before[t:]), "rows past the step's are untouched"


class _RecordLogits:
    """Wraps an executor: each sampled row's logits, by (request seed, output index)."""

    def __init__(self, executor) -> None:
        self.executor, self.model = executor, executor.model
        self.rows: dict[tuple[int, int], np.ndarray] = {}

    def execute(self, batch, metadata):
        result = self.executor.execute(batch, metadata)
        n = metadata.num_rows
        logits = self.model.backend.to_host(self.model.logits[:n])
        for i in range(n):
            self.rows[int(metadata.seed[i]), int(metadata.step[i])] = logits[i]
        return result


def test_the_invariant_backend_gives_a_request_the_same_logits_alone_and_in_a_batch():
    """A tiny model on the batch-invariant backend (simulator: the products are numpy on
    CHUNK_ROWS-row chunks): three seeded requests, each alone, then together with a token
    budget of 8 (chunked prompts in mixed steps beside decodes, batches of 1-3): every sampled
    row's logits are the same bits, and the tokens the same."""
    from engine_helpers import tiny_config

    from gpu import EngineConfig, SamplingParams
    from gpu.backends.cuda.batch_invariant import BatchInvariantCudaBackend
    from gpu.loader import build_engine
    from gpu.model_weights import random_hf_tensors

    config = tiny_config(
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        hidden_size=48, intermediate_size=64, vocab_size=96,
    )  # fmt: skip
    tensors = random_hf_tensors(config, seed=3, std=0.1)
    prompts = [[5, 17, 33, 2, 9, 41, 7, 8, 30, 31, 12], [11, 3], [60, 61, 62, 63, 64]]
    params = [
        SamplingParams(temperature=1.0, seed=s, max_tokens=4, ignore_eos=True) for s in (1, 2, 3)
    ]

    def run(pairs) -> tuple[dict, dict]:
        engine = build_engine(
            config, tensors.__getitem__, BatchInvariantCudaBackend(debug=True),
            EngineConfig(block_size=4, num_kv_blocks=24, max_num_batched_tokens=8, max_num_seqs=3),
        )  # fmt: skip
        engine.runner.executor = recorder = _RecordLogits(engine.runner.executor)
        ids = {engine.add_request(p, q): q.seed for p, q in pairs}
        tokens = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    tokens[ids[out.request_id]] = list(out.outputs[0].token_ids)
        return recorder.rows, tokens

    alone_rows, alone_tokens = {}, {}
    for pair in zip(prompts, params, strict=True):
        rows, tokens = run([pair])
        alone_rows.update(rows)
        alone_tokens.update(tokens)
    batch_rows, batch_tokens = run(list(zip(prompts, params, strict=True)))
    assert sorted(batch_rows) == sorted(alone_rows) and len(alone_rows) == 12
    for key, row in alone_rows.items():
        assert np.array_equal(batch_rows[key], row), f"request seed, output index {key}"
    assert batch_tokens == alone_tokens


def test_the_flag_reaches_the_engine_of_serve_and_of_the_bench():
    """`--batch-invariant` sets EngineConfig.batch_invariant for `tinychat serve` and the bench
    (whose serve workload checks streams against their runs alone with it); a server also
    captures its graphs at start. The cpu backend ignores both (it is invariant as it is)."""
    from chat_app.cli import build_parser
    from gpu.backends import get_backend
    from gpu.bench.fixtures import engine_config
    from gpu.entrypoints.openai.api_server import server_engine_config

    parser = build_parser()
    for flag, want in (([], False), (["--batch-invariant"], True)):
        serve = server_engine_config(parser.parse_args(["serve", "--device", "cpu", *flag]))
        assert serve.batch_invariant is want and serve.capture_graphs_at_start
        bench = engine_config(parser.parse_args(["bench", "serve", "--device", "cpu", *flag]))
        assert bench.batch_invariant is want and not bench.capture_graphs_at_start
    assert get_backend("cpu", "float32", batch_invariant=True).name == "cpu"
