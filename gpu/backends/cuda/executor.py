"""The CUDA executor: one step = copy the inputs in, run the forward and the sampler on the
stream, read the sampled ids back.

    host ForwardBatch + SamplingMetadata --(pinned staging, ONE async copy)--> device buffers
    -> model.forward (kernels + cuBLAS on one stream) -> sample_kernel -> ids --(pinned)--> host

Everything the step touches on the device was allocated when the executor was built: the input
fields are sized for max_num_batched_tokens tokens, max_num_seqs sequences and a block table of
max_blocks_per_seq columns. The block table is copied packed, [num_seqs, width] with this step's
width, and its row stride travels as a one-element device array: kernels read
block_tables[b * stride[0] + j], so no launch depends on the width and a graph captured once
stays valid when sequences grow. A step allocates nothing and synchronises once, at the end,
to read the sampled ids. That is the shape issue 5 captures into CUDA graphs per batch-size
bucket.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu.backends.cuda.sampler import DeviceSampler, sampler_fields
from gpu.backends.cuda.staging import Staging
from gpu.forward_batch import ForwardBatch
from gpu.model import LlamaModel
from gpu.sampling import SamplingMetadata


@dataclass
class DeviceForwardBatch(ForwardBatch):
    """A ForwardBatch whose arrays are device views; block_tables is flat, rows of
    block_table_stride[0] entries (a device scalar, so the stride is not baked into a graph)."""

    block_table_stride: Any = None


def batch_fields(max_tokens: int, max_seqs: int, max_blocks_per_seq: int) -> list:
    return [
        ("input_ids", np.int32, (max_tokens,)),
        ("positions", np.int32, (max_tokens,)),
        ("slot_mapping", np.int32, (max_tokens,)),
        ("query_start_loc", np.int32, (max_seqs + 1,)),
        ("seq_lens", np.int32, (max_seqs,)),
        ("logits_indices", np.int32, (max_seqs,)),
        ("block_table_stride", np.int32, (1,)),
        ("block_tables", np.int32, (max_seqs * max_blocks_per_seq,)),  # last: variable length
    ]


class StepInputs:
    """The step's input buffers: pinned staging and their device twins, one copy per step."""

    def __init__(self, max_tokens: int, max_seqs: int, max_blocks_per_seq: int, stream) -> None:
        self.max_tokens, self.max_seqs = max_tokens, max_seqs
        self.max_blocks_per_seq = max_blocks_per_seq
        fields = sampler_fields(max_seqs) + batch_fields(max_tokens, max_seqs, max_blocks_per_seq)
        self.staging = Staging(fields, stream)

    def stage(self, batch: ForwardBatch) -> int:
        """Write the batch into the pinned fields; returns the bytes to copy."""
        t, s = batch.num_tokens, batch.num_seqs
        width = batch.block_tables.shape[1] if s else 0
        if t > self.max_tokens or s > self.max_seqs or width > self.max_blocks_per_seq:
            raise ValueError(
                f"step of {t} tokens, {s} sequences, {width} blocks per sequence exceeds the "
                f"buffers ({self.max_tokens}, {self.max_seqs}, {self.max_blocks_per_seq})"
            )
        h = self.staging.host
        h["input_ids"][:t] = batch.input_ids
        h["positions"][:t] = batch.positions
        h["slot_mapping"][:t] = batch.slot_mapping
        h["query_start_loc"][: s + 1] = batch.query_start_loc
        h["seq_lens"][:s] = batch.seq_lens
        n_logits = len(batch.logits_indices)
        h["logits_indices"][:n_logits] = batch.logits_indices
        h["block_table_stride"][0] = width
        h["block_tables"][: s * width] = np.asarray(batch.block_tables).reshape(-1)
        return self.staging.end_of("block_tables", s * width)

    def device_batch(self, batch: ForwardBatch) -> DeviceForwardBatch:
        """The same batch over the device views (sliced to this step's sizes)."""
        d = self.staging.device
        t, s = batch.num_tokens, batch.num_seqs
        return DeviceForwardBatch(
            num_tokens=t,
            num_seqs=s,
            input_ids=d["input_ids"][:t],
            positions=d["positions"][:t],
            slot_mapping=d["slot_mapping"][:t],
            query_start_loc=d["query_start_loc"][: s + 1],
            seq_lens=d["seq_lens"][:s],
            block_tables=d["block_tables"],
            logits_indices=d["logits_indices"][: len(batch.logits_indices)],
            max_query_len=batch.max_query_len,
            max_seq_len=batch.max_seq_len,
            block_table_stride=d["block_table_stride"],
        )


class CudaExecutor:
    def __init__(self, model: LlamaModel, backend: Any) -> None:
        self.model = model
        self.backend = backend
        max_tokens = model.residual.shape[0]
        max_seqs, vocab = model.logits.shape
        block_size = model.kv_caches[0][0].shape[1]
        max_positions = model.cos.shape[0]
        max_blocks = -(-max_positions // block_size)
        self.inputs = StepInputs(max_tokens, max_seqs, max_blocks, backend.stream)
        self.sampler = DeviceSampler(max_seqs, vocab, backend.stream, self.inputs.staging)
        backend.reserve_attention_scratch(
            max_seqs, model.num_heads, model.num_kv_heads, model.head_dim
        )

    def execute(self, batch: ForwardBatch, metadata: SamplingMetadata) -> np.ndarray:
        nbytes = self.inputs.stage(batch)
        num_logits = metadata.num_rows
        if num_logits:
            self.sampler.stage(metadata)
        self.inputs.staging.upload(nbytes)
        logits = self.model.forward(self.inputs.device_batch(batch), num_logits)
        if num_logits == 0:
            self.backend.synchronize()
            return np.zeros(0, dtype=np.int32)
        self.sampler.launch(logits)
        self.backend.check("sample")
        return self.sampler.fetch(num_logits)
