"""What the sampler needs to know about each row it samples, built by the runner each step."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpu.sampling.token_state import StateWrite


@dataclass
class SamplingMetadata:
    """Host-side, one entry per sampled row (numpy arrays of length S).

    `step` is the index of the token being sampled within its request's output: together with
    `seed` it keys the counter-based random numbers, so a recomputed or re-batched request
    draws the same numbers again.

    Penalties and min_tokens bans read the row's token state (gpu/sampling/token_state.py), a
    row of a table the backend keeps: `state_rows[i]` is that row (-1: no penalty and no ban
    now or later, the state is neither read nor written), `ban_active[i]` says the row's
    banned ids are banned this step, and `state_writes` lists the rows to (re)initialise
    before this step samples (a sequence sampled for the first time in its row).
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
    state_rows: np.ndarray | None = None  # int32; -1 = no state (None: all -1)
    ban_active: np.ndarray | None = None  # int32; 1 = the row's banned ids are -inf (None: 0)
    # (state row, token ids int32 unique, values uint16): zero the row, then scatter.
    state_writes: list[StateWrite] | None = None

    def __post_init__(self) -> None:
        n = len(self.temperature)
        if self.state_rows is None:
            self.state_rows = np.full(n, -1, dtype=np.int32)
        if self.ban_active is None:
            self.ban_active = np.zeros(n, dtype=np.int32)

    @property
    def num_rows(self) -> int:
        return len(self.temperature)

    @property
    def has_state(self) -> bool:
        """Some row reads and updates its token state (a penalty or a ban)."""
        return bool(self.state_rows.size) and int(self.state_rows.max()) >= 0

    @property
    def all_greedy(self) -> bool:
        """Every row is a plain argmax: greedy, and no row with token state."""
        return bool(np.all(self.temperature == 0.0)) and not self.has_state

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
