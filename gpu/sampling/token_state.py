"""Each running sequence's token history as one row of a uint16 table, for penalties and bans.

Penalties need, per vocabulary id, whether it occurs in the prompt and how often it occurs in
the output; min_tokens bans need which ids are banned. So a sequence that has a penalty or a
ban keeps a row of `state` [num_state_rows, vocab] (its Sequence.table_row):

    bit 15 (PROMPT_BIT)      the id occurs in the prompt (the repetition penalty sees it)
    bit 14 (BAN_BIT)         banned while the row's ban is active (EOS and stop ids under
                             min_tokens)
    bits 0-13 (COUNT_MASK)   occurrences in the output so far, saturating at 16,383

The row is written once, when the sequence is first sampled in it (`row_state`: the prompt, the
output known then and the banned ids), and the sampler itself adds every token it samples
(`add_tokens`), so no step uploads a history. Two bytes a cell: 65.7 MB at 256 rows x 128,256
ids (an int32 table would be 131 MB), 25 MB at 256 x 49,152. Beyond 16,383 repeats of one id
the frequency penalty stops growing.

On the device the table has a bit mask beside it (`state_mask`: uint32 words [rows, vocab / 32],
a bit set where a cell is nonzero: 4.0 MB at 256 x 128,256), so the sampler applies penalties
and bans to the few hundred ids a row has seen, in place, instead of reading two bytes of state
for every logit (gpu/kernels/sampling_scores.py).

The numpy helpers here are the cpu backend's sampler state and the oracle of the CUDA kernels
(gpu/kernels/token_state.py writes rows; gpu/kernels/sampling.py applies and updates them).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

STATE_DTYPE = np.uint16
PROMPT_BIT = 0x8000
BAN_BIT = 0x4000
COUNT_MASK = 0x3FFF

StateWrite = tuple[int, np.ndarray, np.ndarray]  # (state row, token ids int32, values uint16)


def _ids(tokens: Iterable[int] | np.ndarray, vocab: int) -> np.ndarray:
    ids = np.asarray(tokens if isinstance(tokens, np.ndarray) else list(tokens), dtype=np.int64)
    return ids[(ids >= 0) & (ids < vocab)]


def row_state(
    prompt_ids: Iterable[int] | np.ndarray,
    output_ids: Iterable[int] | np.ndarray,
    banned_ids: Iterable[int],
    vocab: int,
) -> tuple[np.ndarray, np.ndarray]:
    """A row's nonzero cells: (token ids, int32, unique and sorted; values, uint16).

    Ids outside [0, vocab) are left out (a stop id past the vocabulary can never be sampled).
    Output ids must be known ids: a placeholder of a token in flight has no place here.
    """
    prompt = np.unique(_ids(prompt_ids, vocab))
    output, counts = np.unique(_ids(output_ids, vocab), return_counts=True)
    banned = np.unique(_ids(banned_ids, vocab))
    tokens = np.union1d(np.union1d(prompt, output), banned)
    values = np.zeros(tokens.shape, dtype=STATE_DTYPE)
    values[np.searchsorted(tokens, prompt)] |= STATE_DTYPE(PROMPT_BIT)
    values[np.searchsorted(tokens, banned)] |= STATE_DTYPE(BAN_BIT)
    values[np.searchsorted(tokens, output)] |= np.minimum(counts, COUNT_MASK).astype(STATE_DTYPE)
    return tokens.astype(np.int32), values


def new_state(num_rows: int, vocab: int) -> np.ndarray:
    return np.zeros((num_rows, vocab), dtype=STATE_DTYPE)


def new_mask(num_rows: int, vocab: int) -> np.ndarray:
    """An empty bit mask for a table of num_rows x vocab: uint32 [num_rows, ceil(vocab / 32)]."""
    return np.zeros((num_rows, -(-vocab // 32)), dtype=np.uint32)


def state_mask(state: np.ndarray) -> np.ndarray:
    """The device's bit mask of a table: bit v % 32 of word v // 32 set where cell v of the row
    is nonzero."""
    mask = new_mask(*state.shape)
    bits = np.packbits(state != 0, axis=1, bitorder="little")  # byte j: cells 8j..8j+7
    mask.view(np.uint8)[:, : bits.shape[1]] = bits  # (little-endian words, as the device's)
    return mask


def write_states(state: np.ndarray, writes: Iterable[StateWrite] | None) -> None:
    """Apply a step's state_writes: each row zeroed, then its values scattered."""
    for row, tokens, values in writes or ():
        state[row] = 0
        state[row, tokens] = values


def apply_state(
    logits: np.ndarray,
    cells: np.ndarray,
    ban_active: bool,
    repetition: float,
    presence: float,
    frequency: float,
) -> None:
    """Step 1 of the sampler on one row of float32 logits, in place: bans, then vLLM's
    penalties from the row's cells (uint16 [vocab]).

    repetition: ids of the prompt or the output have positive logits divided by it and
    negative ones multiplied. frequency / presence: subtract frequency * count +
    presence * (count > 0) for ids of the output (float32 arithmetic, as the kernel).
    """
    if ban_active:
        logits[(cells & BAN_BIT) != 0] = -np.inf
    counts = cells & STATE_DTYPE(COUNT_MASK)
    if repetition != 1.0:
        seen = ((cells & PROMPT_BIT) != 0) | (counts > 0)
        row = logits[seen]
        logits[seen] = np.where(row > 0, row / np.float32(repetition), row * np.float32(repetition))
    if presence != 0.0 or frequency != 0.0:
        c = counts.astype(np.float32)
        logits -= np.float32(frequency) * c + np.float32(presence) * (c > 0)


def add_tokens(state: np.ndarray, rows: np.ndarray, tokens: np.ndarray) -> None:
    """Step 4: each sampled token counted once more in its row (rows < 0 skipped), saturating
    at COUNT_MASK. Rows are distinct (one sequence a row), so no cell is hit twice."""
    rows = np.asarray(rows)
    mine = rows >= 0
    r, t = rows[mine], np.asarray(tokens)[mine]
    cells = state[r, t]
    state[r, t] = np.where((cells & STATE_DTYPE(COUNT_MASK)) < COUNT_MASK, cells + 1, cells)
