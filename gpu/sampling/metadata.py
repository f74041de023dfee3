"""What the sampler needs to know about each row it samples, built by the runner each step."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class SamplingMetadata:
    """Host-side, one entry per sampled row (numpy arrays of length S).

    `step` is the index of the token being sampled within its request's output: together with
    `seed` it keys the counter-based random numbers, so a recomputed or re-batched request
    draws the same numbers again.
    """

    temperature: np.ndarray  # float32; 0 = greedy
    top_k: np.ndarray  # int32; 0 = off
    top_p: np.ndarray  # float32; 1 = off
    min_p: np.ndarray  # float32; 0 = off
    repetition_penalty: np.ndarray  # float32; 1 = off
    presence_penalty: np.ndarray  # float32; 0 = off
    frequency_penalty: np.ndarray  # float32; 0 = off
    seed: np.ndarray  # uint64
    step: np.ndarray  # uint64
    # Token history, only filled when some row has a penalty (else None): per row, int32 arrays.
    prompt_token_ids: list[np.ndarray] | None = None
    output_token_ids: list[np.ndarray] | None = None
    # Per row, token ids that must not be sampled yet (EOS and stop ids under min_tokens).
    banned_token_ids: list[tuple[int, ...]] | None = None

    @property
    def num_rows(self) -> int:
        return len(self.temperature)

    @property
    def all_greedy(self) -> bool:
        return bool(np.all(self.temperature == 0.0))

    @property
    def has_penalties(self) -> bool:
        return self.prompt_token_ids is not None

    @classmethod
    def greedy(cls, num_rows: int) -> SamplingMetadata:
        """All rows greedy, no penalties: the metadata of a plain argmax step."""
        zeros = np.zeros(num_rows, dtype=np.float32)
        return cls(
            temperature=zeros,
            top_k=np.zeros(num_rows, dtype=np.int32),
            top_p=np.ones(num_rows, dtype=np.float32),
            min_p=zeros,
            repetition_penalty=np.ones(num_rows, dtype=np.float32),
            presence_penalty=zeros,
            frequency_penalty=zeros,
            seed=np.zeros(num_rows, dtype=np.uint64),
            step=np.zeros(num_rows, dtype=np.uint64),
        )
