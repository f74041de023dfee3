"""Each step's SamplingMetadata, and who owns each row of the token state.

A decode step samples the same sequences, in the same order, as the step before it, until one
finishes or joins; and most of SamplingMetadata does not change between such steps: the seven
sampling parameters and the seed of each row. Built from 256 SamplingParams every step they
cost ~220 us of Python on the 2-core CI host (~280 with penalties), a third of a whole host
step with the app's defaults, where an all-greedy step (cached arrays) costs ~12. So
SamplingBatch keeps the last batch's constant arrays, read-only, and rebuilds them only when
its sequences change (vLLM's persistent InputBatch keeps per-row sampling arrays for the same
reason); a step computes only what moves: the step counters, the state rows, the ban flags and
the state writes of sequences new to their row: ~15 us at 256 rows (~42 with penalties, whose
rows' owners are checked every step) on the same host.
"""

from __future__ import annotations

import functools

import numpy as np

from gpu.sampling import SamplingMetadata
from gpu.sampling.token_state import row_state
from gpu.sequence import Sequence

_PARAMETERS = (
    "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"
)  # fmt: skip
_DTYPES = {"top_k": np.int32}  # the others float32


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


@functools.lru_cache(maxsize=64)
def _greedy_arrays(num_rows: int) -> dict[str, np.ndarray]:
    """The arrays of SamplingMetadata.greedy(num_rows), built once per row count (nine arrays
    cost more than the rest of a one-sequence step's preparation); read-only, as steps share
    them."""
    md = SamplingMetadata.greedy(num_rows)
    names = [*_PARAMETERS, "temperature", "seed", "step", "state_rows", "ban_active"]
    return {name: _read_only(getattr(md, name)) for name in names}


def greedy_metadata(num_rows: int) -> SamplingMetadata:
    """All rows plain argmax: a fresh SamplingMetadata over the shared read-only arrays."""
    return SamplingMetadata(**_greedy_arrays(num_rows))


class StateOwners:
    """The sequence whose token state each state row holds (gpu/sampling/token_state.py).

    A row is written when a sequence is sampled in it for the first time, and from then on only
    the sampler updates it. So the host must know, per row, whose history the device holds: a
    sequence sampled in a row that is not its own (new, recomputed after a preemption, or in
    the row another sequence left) gets a write. Sequences without penalties or bans never
    touch the state and leave the row's owner as it was: a sequence preempted and readmitted
    to the same row finds its history there, unless another sequence with state wrote it in
    between. A write queued in step N+1 lands after every sampler of step N (stream order), so
    the count the sampler added for a token that was then discarded (its sequence stopped or
    was aborted first) never reaches the row's next owner.
    """

    __slots__ = ("owner", "row_of")

    def __init__(self) -> None:
        self.owner: dict[int, Sequence] = {}
        self.row_of: dict[Sequence, int] = {}  # each owner's row (one row each)

    def claim(self, seq: Sequence, row: int) -> bool:
        """Make seq the owner of row; True if the row must be (re)written for it."""
        if self.owner.get(row) is seq:
            return False
        old = self.row_of.pop(seq, None)
        if old is not None and self.owner.get(old) is seq:
            del self.owner[old]  # a row it left holds a history that stopped growing
        previous = self.owner.get(row)
        if previous is not None:
            del self.row_of[previous]
        self.owner[row] = seq
        self.row_of[seq] = row
        return True


class _BatchConstants:
    """What a batch's rows keep from step to step: the parameter arrays (read-only, shared by
    the steps' metadata), the rows that read the token state and, of those, the rows that can
    ban ids (min_tokens with stop ids) with their min_tokens."""

    __slots__ = ("seqs", "arrays", "stateful", "stateful_index", "banning")

    def __init__(self, seqs: tuple[Sequence, ...]) -> None:
        self.seqs = seqs
        params = [s.params for s in seqs]
        temperature = [0.0 if p.greedy else p.temperature for p in params]
        arrays = {"temperature": np.array(temperature, np.float32)}
        for name in _PARAMETERS:
            values = [getattr(p, name) for p in params]
            arrays[name] = np.array(values, _DTYPES.get(name, np.float32))
        arrays["seed"] = np.array([s.seed for s in seqs], np.uint64)
        self.arrays = {name: _read_only(a) for name, a in arrays.items()}
        self.stateful = [  # (row index, sequence, has penalties, min_tokens of a possible ban)
            (i, s, p.has_penalties, p.min_tokens if s.finishing_token_ids else 0)
            for i, (s, p) in enumerate(zip(seqs, params, strict=True))
            if p.has_penalties or (p.min_tokens > 0 and s.finishing_token_ids)
        ]
        self.stateful_index = np.array([r[0] for r in self.stateful], np.intp)
        self.banning = any(r[3] > 0 for r in self.stateful)


class SamplingBatch:
    """Builds a step's SamplingMetadata, reusing the last batch's constants (module docstring)."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.state_owners = StateOwners()
        self._last: _BatchConstants | None = None

    def metadata(self, seqs: list[Sequence]) -> SamplingMetadata:
        """Per-row sampling parameters, the token-state rows of those with penalties or a ban,
        and the state writes of the sequences sampled for the first time in their row.

        Counts include a placeholder still in flight (len(output_token_ids)): the RNG's step
        and min_tokens need only how many tokens came before, not what they are. A state write
        does need the ids: it happens only when a sequence is first sampled in a row, after its
        admission or its recomputation, and the engine drains before it preempts a sequence
        with a token in flight.
        """
        n = len(seqs)
        if all(len(s.output_token_ids) >= s.argmax_from for s in seqs):
            return greedy_metadata(n)
        num_output = [len(s.output_token_ids) for s in seqs]
        key = tuple(seqs)
        c = self._last
        if c is None or c.seqs != key:  # == is identity first: ~3 us at 256 when equal
            c = self._last = _BatchConstants(key)
        md = SamplingMetadata(**c.arrays, step=np.array(num_output, np.uint64))
        if not c.stateful:
            return md
        active = c.stateful
        index = c.stateful_index
        if c.banning:  # a row without penalties reads the state only while it bans
            active = [r for r in active if r[2] or num_output[r[0]] < r[3]]
            if not active:
                return md
            index = np.array([r[0] for r in active], np.intp)
            md.ban_active[index] = [num_output[i] < min_tokens for i, _, _, min_tokens in active]
        md.state_rows[index] = [s.table_row for _, s, _, _ in active]
        owners = self.state_owners.owner
        writes = []
        for i, s, penalties, _ in active:
            row = s.table_row
            assert row >= 0, f"{s!r} is sampled but holds no row"
            if owners.get(row) is s or not self.state_owners.claim(s, row):
                continue
            assert s.num_pending == 0, f"{s!r}: its state is written with a token in flight"
            banning = bool(md.ban_active[i])
            tokens, values = row_state(
                s.prompt_token_ids if penalties else (),
                s.output_token_ids if penalties else (),
                s.finishing_token_ids if banning else (),
                self.vocab_size,
            )
            writes.append((row, tokens, values))
        md.state_writes = writes or None
        return md
