"""The runner's vectorised batch equals the plain per-sequence definition of a ForwardBatch, step
after step, through chunked prefill, prefix-cache hits, preemption and aborts (with async
scheduling, the engine's default: tokens still in flight come through prev_rows)."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import ScriptedExecutor, scripted_engine

from gpu import SamplingParams

FIELDS = (
    "input_ids",
    "positions",
    "slot_mapping",
    "query_start_loc",
    "seq_lens",
    "block_tables",
    "logits_indices",
    "prev_rows",
)


def reference_batch(scheduled, block_size: int) -> dict:
    """The definition, one sequence at a time: its new tokens laid end to end after the others."""
    out: dict = {name: [] for name in FIELDS}
    out["query_start_loc"] = [0]
    num_tokens = 0
    max_blocks = max(max(len(seq.block_table) for seq, _ in scheduled), 1)
    for seq, n in scheduled:
        start, end = seq.num_computed_tokens, seq.num_computed_tokens + n
        for pos in range(start, end):
            token = seq.token_ids[pos]  # a token in flight: -(1 + its row in the last step)
            out["input_ids"].append(max(token, 0))
            out["prev_rows"].append(-1 - token if token < 0 else -1)
            out["positions"].append(pos)
            block = seq.block_table[pos // block_size]
            out["slot_mapping"].append(block * block_size + pos % block_size)
        num_tokens += n
        out["query_start_loc"].append(num_tokens)
        out["seq_lens"].append(end)
        out["block_tables"].append(seq.block_table + [0] * (max_blocks - len(seq.block_table)))
        if end == len(seq.token_ids):
            out["logits_indices"].append(num_tokens - 1)
    ns = [n for _, n in scheduled]
    out["max_query_len"] = max(ns)
    out["max_seq_len"] = max(out["seq_lens"])
    out["num_tokens"] = num_tokens
    return out


class CheckingExecutor(ScriptedExecutor):
    """Compares every batch with reference_batch(the step's schedule) before sampling."""

    def __init__(self, script, engine_ref) -> None:
        super().__init__(script)
        self.engine_ref = engine_ref
        self.checked = 0
        self.in_flight_rows = 0

    def execute(self, batch, metadata):
        engine = self.engine_ref[0]
        expected = reference_batch(engine.last_schedule.scheduled, engine.block_size)
        for name in FIELDS:
            got = getattr(batch, name)
            assert got.dtype == np.int32, name
            np.testing.assert_array_equal(got, np.array(expected[name], np.int32), err_msg=name)
        assert batch.block_tables.flags.c_contiguous
        for name in ("max_query_len", "max_seq_len", "num_tokens"):
            assert getattr(batch, name) == expected[name], name
            assert type(getattr(batch, name)) is int, name
        self.checked += 1
        self.in_flight_rows += int((batch.prev_rows >= 0).sum())
        return super().execute(batch, metadata)


def script(seed: int, step: int) -> int:
    return (seed * 31 + step * 7) % 250


@pytest.mark.parametrize("seed", range(6))
def test_batches_match_the_per_sequence_definition(seed):
    rng = np.random.default_rng(seed)
    run_and_check(
        rng,
        num_kv_blocks=int(rng.integers(10, 40)),
        max_num_seqs=int(rng.integers(2, 9)),
        max_num_batched_tokens=int(rng.integers(5, 70)),
        block_size=4,
    )


def test_many_sequences_with_long_tables():
    """More sequences than the block-table array's first rows, tables wider than its columns."""
    rng = np.random.default_rng(7)
    engine = run_and_check(
        rng,
        arrivals=2.0,
        num_kv_blocks=3000,
        max_num_seqs=48,
        max_num_batched_tokens=256,
        block_size=1,
    )
    rows, cols = engine.block_manager.table_rows.array.shape
    assert rows > 16 and cols > 32  # both grew from their initial size


def run_and_check(rng, arrivals: float = 0.3, **engine_args):
    """Random requests (`arrivals` a step on average) and aborts; every batch is checked."""
    engine_ref: list = []
    executor = CheckingExecutor(script, engine_ref)
    engine = scripted_engine(executor=executor, **engine_args)
    engine_ref.append(engine)
    schedule = engine.scheduler.schedule

    def recording_schedule(**kwargs):
        engine.last_schedule = schedule(**kwargs)
        return engine.last_schedule

    engine.scheduler.schedule = recording_schedule
    shared = [int(t) for t in rng.integers(0, 250, 24)]
    ids = []
    for step in range(300):
        for _ in range(rng.poisson(arrivals)):
            prompt = shared[: int(rng.integers(0, 24))] + [int(t) for t in rng.integers(0, 250, 9)]
            params = SamplingParams(
                temperature=1.0, seed=step, max_tokens=int(rng.integers(1, 40)), ignore_eos=True
            )
            ids.append(engine.add_request(prompt, params))
        if ids and rng.random() < 0.03:
            engine.abort_request(ids[int(rng.integers(0, len(ids)))])
        engine.step()
    while engine.has_unfinished_requests():
        engine.step()
    assert executor.checked > 100
    assert executor.in_flight_rows > 0  # some steps read tokens still in flight
    assert engine.stats().prefix_cache_hits > 0
    assert engine.block_manager.num_used_blocks == 0
    return engine
