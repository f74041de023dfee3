"""Runs one prepared step on a backend: the forward, then the sampler.

The eager executor calls the ops one by one. It is all the cpu backend needs; the cuda backend
adds a graph executor that replays captured decode steps (gpu/backends/cuda/). The backend's
sampler keeps the token state of penalties and bans (gpu/sampling/token_state.py): the executor
sizes it, a row per sequence that can run at once (max_num_seqs, the model's logits rows).
"""

from __future__ import annotations

import numpy as np

from gpu.backends.base import Backend
from gpu.forward_batch import ForwardBatch
from gpu.model import LlamaModel
from gpu.model_runner import ReadyResult
from gpu.sampling import SamplingMetadata

_NONE = np.zeros(0, dtype=np.int32)


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
