"""Runs one prepared step on a backend: the forward, then the sampler.

The eager executor calls the ops one by one. It is all the cpu backend needs; the cuda backend
adds a graph executor that replays captured decode steps (gpu/backends/cuda/).
"""

from __future__ import annotations

import numpy as np

from gpu.backends.base import Backend
from gpu.forward_batch import ForwardBatch
from gpu.model import LlamaModel
from gpu.sampling import SamplingMetadata


class EagerExecutor:
    def __init__(self, model: LlamaModel, backend: Backend) -> None:
        self.model = model
        self.backend = backend

    def execute(self, batch: ForwardBatch, metadata: SamplingMetadata) -> np.ndarray:
        num_logits = metadata.num_rows
        logits = self.model.forward(batch, num_logits)
        if num_logits == 0:
            return np.zeros(0, dtype=np.int32)
        return self.backend.sample(logits, metadata)
