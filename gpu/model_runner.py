"""The model runner: turns the scheduler's decision into the flat arrays of a forward pass, runs
it, and samples.

Everything here is host-side bookkeeping and must stay cheap: on the GPU a decode step of a
small model takes well under a millisecond, so this Python is on the critical path. Decode rows
(one token each, the common case) take a fast path with no numpy per sequence.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from gpu.forward_batch import ForwardBatch
from gpu.sampling import SamplingMetadata
from gpu.scheduler import SchedulerOutput
from gpu.sequence import Sequence


class Executor(Protocol):
    """Runs a prepared batch on a backend and returns one sampled token per sampled row."""

    def execute(self, batch: ForwardBatch, metadata: SamplingMetadata) -> np.ndarray: ...


def build_forward_batch(
    scheduled: list[tuple[Sequence, int]], block_size: int
) -> tuple[ForwardBatch, list[Sequence]]:
    """Lay the step's tokens end to end and describe each sequence's slice of them.

    Returns the batch and the sequences that sample a token this step (those whose last token
    is computed in it), in the order of batch.logits_indices.
    """
    num_seqs = len(scheduled)
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start_loc = [0]
    seq_lens: list[int] = []
    logits_indices: list[int] = []
    sampled: list[Sequence] = []
    tables: list[list[int]] = []
    max_query_len = max_seq_len = max_blocks = 0
    num_tokens = 0
    for seq, n in scheduled:
        start = seq.num_computed_tokens
        end = start + n
        table = seq.block_table
        tables.append(table)
        if n == 1:  # decode: one token, no numpy
            input_ids.append(seq.token_ids[start])
            positions.append(start)
            slots.append(table[start // block_size] * block_size + start % block_size)
        else:
            pos = np.arange(start, end, dtype=np.int64)
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            blocks = np.asarray(table)[pos // block_size]
            slots.extend((blocks * block_size + pos % block_size).tolist())
            if n > max_query_len:
                max_query_len = n
        num_tokens += n
        query_start_loc.append(num_tokens)
        seq_lens.append(end)
        if end == len(seq.token_ids):  # the last known token is computed: sample the next
            logits_indices.append(num_tokens - 1)
            sampled.append(seq)
        if end > max_seq_len:
            max_seq_len = end
        if len(table) > max_blocks:
            max_blocks = len(table)
    max_query_len = max(max_query_len, 1)
    block_tables = np.zeros((num_seqs, max(max_blocks, 1)), dtype=np.int32)
    for i, table in enumerate(tables):
        block_tables[i, : len(table)] = table
    batch = ForwardBatch(
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        input_ids=np.asarray(input_ids, dtype=np.int32),
        positions=np.asarray(positions, dtype=np.int32),
        slot_mapping=np.asarray(slots, dtype=np.int32),
        query_start_loc=np.asarray(query_start_loc, dtype=np.int32),
        seq_lens=np.asarray(seq_lens, dtype=np.int32),
        block_tables=block_tables,
        logits_indices=np.asarray(logits_indices, dtype=np.int32),
        max_query_len=max_query_len,
        max_seq_len=max_seq_len,
    )
    return batch, sampled


def build_sampling_metadata(seqs: list[Sequence]) -> SamplingMetadata:
    """Per-row sampling parameters; token history only when some row has a penalty."""
    n = len(seqs)
    params = [s.params for s in seqs]
    if all(p.greedy and not p.has_penalties for p in params) and all(
        s.num_output_tokens >= s.params.min_tokens for s in seqs
    ):
        return SamplingMetadata.greedy(n)
    md = SamplingMetadata(
        temperature=np.array([0.0 if p.greedy else p.temperature for p in params], np.float32),
        top_k=np.array([p.top_k for p in params], np.int32),
        top_p=np.array([p.top_p for p in params], np.float32),
        min_p=np.array([p.min_p for p in params], np.float32),
        repetition_penalty=np.array([p.repetition_penalty for p in params], np.float32),
        presence_penalty=np.array([p.presence_penalty for p in params], np.float32),
        frequency_penalty=np.array([p.frequency_penalty for p in params], np.float32),
        seed=np.array([s.seed for s in seqs], np.uint64),
        step=np.array([s.num_output_tokens for s in seqs], np.uint64),
    )
    if any(p.has_penalties for p in params):
        md.prompt_token_ids = [np.asarray(s.prompt_token_ids, np.int32) for s in seqs]
        md.output_token_ids = [np.asarray(s.output_token_ids, np.int32) for s in seqs]
    banned = []
    for s in seqs:
        if s.num_output_tokens < s.params.min_tokens:
            ids = set(s.params.all_stop_token_ids)
            if not s.params.ignore_eos:
                ids |= s.eos_token_ids
            banned.append(tuple(sorted(ids)))
        else:
            banned.append(())
    if any(banned):
        md.banned_token_ids = banned
    return md


class ModelRunner:
    """Prepares each step's inputs and hands them to the backend's executor."""

    def __init__(self, executor: Executor, block_size: int) -> None:
        self.executor = executor
        self.block_size = block_size

    def run(self, sched: SchedulerOutput) -> tuple[list[Sequence], np.ndarray]:
        batch, sampled = build_forward_batch(sched.scheduled, self.block_size)
        if not sampled:  # only prefill chunks that end mid-prompt: nothing to sample
            md = SamplingMetadata.greedy(0)
        else:
            md = build_sampling_metadata(sampled)
        tokens = self.executor.execute(batch, md)
        return sampled, tokens
