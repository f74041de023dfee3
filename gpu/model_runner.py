"""The model runner: turns the scheduler's decision into the flat arrays of a forward pass, runs
the model and samples.

Everything here is host-side bookkeeping and must stay cheap: on the GPU a decode step of a
small model takes well under a millisecond, so this Python is on the critical path. The batch is
built with numpy over all sequences at once, from block tables the block manager already keeps as
numpy rows; only what lives in each Sequence object is read in a Python loop.

The step itself runs on an executor: EagerExecutor (below) calls the model's forward and the
backend's sampler one op after another, all the cpu backend needs; the cuda backend brings its
own (gpu/backends/cuda/executor.py), which stages the inputs in one copy and replays captured
CUDA graphs. The backend's sampler keeps the token state of penalties and bans
(gpu/sampling/token_state.py): the executor sizes it, a row per sequence that can run at once.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from gpu.backends.base import Backend, ReadyResult, StepResult
from gpu.block_manager import BlockTableRows
from gpu.forward_batch import ForwardBatch
from gpu.model import LlamaModel
from gpu.sampling import SamplingMetadata
from gpu.sampling_batch import SamplingBatch
from gpu.scheduler import SchedulerOutput
from gpu.sequence import Sequence

__all__ = ["EagerExecutor", "Executor", "ModelRunner", "ReadyResult", "StepResult"]

_NONE = np.zeros(0, dtype=np.int32)


class Executor(Protocol):
    """Runs a prepared batch on a backend and returns one sampled token per sampled row.

    `launch` (optional) starts the step and returns at once; `execute` is launch().result().
    Either way the executor keeps the last step's sampled ids where the next step's embedding
    reads them (ForwardBatch.prev_rows / sampled_prev)."""

    def execute(self, batch: ForwardBatch, metadata: SamplingMetadata) -> np.ndarray: ...


class EagerExecutor:
    """launch() computes the whole step at once (numpy has nothing to overlap with) and keeps
    its sampled ids: the next step's tokens in flight (batch.prev_rows) are read from them."""

    def __init__(self, model: LlamaModel, backend: Backend) -> None:
        self.model = model
        self.backend = backend
        self.sampled_prev = _NONE  # the last step's sampled ids
        reserve = getattr(backend, "reserve_token_state", None)
        if reserve is not None:  # a row per sequence that can run at once, the whole vocab
            reserve(*model.logits.shape)

    def launch(self, batch: ForwardBatch, metadata: SamplingMetadata) -> ReadyResult:
        num_logits = metadata.num_rows
        batch.sampled_prev = self.sampled_prev
        logits = self.model.forward(batch, num_logits)
        if num_logits == 0:
            tokens = _NONE
        else:
            tokens = self.backend.sample(logits, metadata)
        self.sampled_prev = tokens
        return ReadyResult(tokens)

    def execute(self, batch: ForwardBatch, metadata: SamplingMetadata) -> np.ndarray:
        return self.launch(batch, metadata).result()

    warm_up_stage = "warming up (kernels compile on a first start)"  # the loader's label

    def precompile(self, progress: Any = None) -> bool | None:
        """A backend whose kernels Numba compiles on first use (`jit_kernels`: the cpu's
        quantized path, ~30 s on a first start, then loaded from the cache in ~0.4 s) asks for
        the loader's warm-up request, so that they compile before the engine reports ready,
        not inside the first reply. None: nothing compiles (the numpy oracle)."""
        return True if getattr(self.backend, "jit_kernels", False) else None


def build_forward_batch(
    sched: SchedulerOutput, block_size: int, table_rows: BlockTableRows
) -> tuple[ForwardBatch, list[Sequence]]:
    """Lay the step's tokens end to end and describe each sequence's slice of them.

    Returns the batch and the sequences that sample a token this step (those whose last token
    is computed in it), in the order of batch.logits_indices.

    Only what must be read off each sequence (its computed length, its new token ids, its
    block-table row) is gathered in Python; positions, slots, lengths and the padded block
    table are then computed with numpy for the whole batch at once.

    A placeholder id -(1 + r) (a token still in flight, see Sequence) becomes input id 0 with
    prev_rows r; every known id gets prev_rows -1. Two vector ops, no per-sequence test.
    """
    seqs = sched.seqs
    num_seqs = len(seqs)
    starts = np.array([seq.num_computed_tokens for seq in seqs], dtype=np.int32)
    rows = np.array([seq.table_row for seq in seqs], dtype=np.intp)
    if sched.num_prefill_tokens == 0:
        # All decodes, the steady state: each sequence computes its last token and samples the
        # next, so token i is sequence i and the layout arrays are plain ranges.
        num_tokens, max_query_len = num_seqs, 1
        input_ids = np.array([seq.token_ids[-1] for seq in seqs], dtype=np.int32)
        positions = starts
        seq_lens = starts + 1
        query_start_loc = np.arange(num_seqs + 1, dtype=np.int32)
        logits_indices = query_start_loc[:-1]
        token_rows = logits_indices
        sampled = seqs
    else:
        ids: list[int] = []
        sampled = []
        sampled_rows = []
        for i, (seq, n) in enumerate(zip(seqs, sched.num_new_tokens, strict=True)):
            start = seq.num_computed_tokens
            ids.extend(seq.token_ids[start : start + n])
            if start + n == len(seq.token_ids):  # the last known token is computed: sample
                sampled.append(seq)
                sampled_rows.append(i)
        input_ids = np.array(ids, dtype=np.int32)
        num_tokens = len(ids)
        query_lens = np.array(sched.num_new_tokens, dtype=np.int32)
        max_query_len = int(query_lens.max())
        seq_lens = starts + query_lens
        query_start_loc = np.zeros(num_seqs + 1, dtype=np.int32)
        np.cumsum(query_lens, out=query_start_loc[1:])
        logits_indices = query_start_loc[1:][sampled_rows] - 1
        token_rows = np.repeat(np.arange(num_seqs, dtype=np.int32), query_lens)
        # Token j of the step belongs to sequence b = token_rows[j], at position
        # starts[b] + (j - query_start_loc[b]).
        offsets = starts - query_start_loc[:-1]
        positions = np.arange(num_tokens, dtype=np.int32) + offsets[token_rows]
    prev_rows = np.maximum(-1 - input_ids, -1)  # r for -(1 + r), -1 for a real id
    np.maximum(input_ids, 0, out=input_ids)
    max_blocks = max(int(table_rows.lens[rows].max()), 1)
    block_tables = table_rows.array[:, :max_blocks][rows]
    block_index, offset = np.divmod(positions, np.int32(block_size))
    slot_mapping = block_tables[token_rows, block_index] * np.int32(block_size) + offset
    batch = ForwardBatch(
        num_tokens=num_tokens,
        num_seqs=num_seqs,
        input_ids=input_ids,
        positions=positions,
        slot_mapping=slot_mapping,
        query_start_loc=query_start_loc,
        seq_lens=seq_lens,
        block_tables=block_tables,
        logits_indices=logits_indices,
        max_query_len=max_query_len,
        max_seq_len=int(seq_lens.max()),
        prev_rows=prev_rows,
    )
    return batch, sampled


class ModelRunner:
    """Prepares each step's inputs and hands them to the backend's executor."""

    def __init__(
        self, executor: Executor, block_size: int, table_rows: BlockTableRows, vocab_size: int
    ) -> None:
        self.executor = executor
        self.block_size = block_size
        self.table_rows = table_rows  # the block manager's: read, never written, here
        self.vocab_size = vocab_size
        self.sampling = SamplingBatch(vocab_size)
        self.state_owners = self.sampling.state_owners

    def launch(self, sched: SchedulerOutput) -> tuple[list[Sequence], StepResult, SamplingMetadata]:
        """Build and start the step; returns the sequences that sample (in row order), the
        handle to their ids, and the step's sampling metadata."""
        batch, sampled = build_forward_batch(sched, self.block_size, self.table_rows)
        if not sampled:  # only prefill chunks that end mid-prompt: nothing to sample
            md = SamplingMetadata.greedy(0)
        else:
            md = self.sampling.metadata(sampled)
        # An executor with only execute() (a test stub, a wrapper) computes at launch. Looked
        # up each step: a test may wrap the executor after the runner is built.
        launch = getattr(self.executor, "launch", None)
        if launch is not None:
            return sampled, launch(batch, md), md
        return sampled, ReadyResult(self.executor.execute(batch, md)), md
