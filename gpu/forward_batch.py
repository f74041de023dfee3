"""The flat batch one forward pass consumes.

Continuous batching mixes sequences at different stages in one step: some decode one token,
some prefill a chunk of their prompt. The model does not care: it sees `num_tokens` tokens laid
end to end, and per-sequence metadata says where each sequence's queries start
(`query_start_loc`), how long its context is after this step (`seq_lens`), where its KV blocks
live (`block_tables`) and where each new token's K and V go (`slot_mapping`). This is vLLM's
attention metadata, and both backends read the same arrays (host numpy arrays for the cpu
backend, device buffers for the cuda one).

Async scheduling adds one indirection to the token ids: a decode token sampled by the previous
step, still in flight when this step was built, is not known on the host. Its row of
`prev_rows` names the row of the previous step's sampled ids that holds it (-1: the id is in
`input_ids`), and the embedding reads it from `sampled_prev`, the executor's buffer of those
ids (on the GPU it never leaves the device).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class ForwardBatch:
    num_tokens: int  # T: query tokens in this step, all sequences together
    num_seqs: int  # B
    input_ids: Any  # [T] int32
    positions: Any  # [T] int32: absolute position of each query token
    slot_mapping: Any  # [T] int32: block_id * block_size + offset, where its K/V is written
    query_start_loc: Any  # [B + 1] int32: sequence b owns query rows [qsl[b], qsl[b + 1])
    seq_lens: Any  # [B] int32: context length of each sequence including this step's tokens
    block_tables: Any  # [B, max_blocks_per_seq] int32: physical block of each logical block
    logits_indices: Any  # [S] int32: rows whose next token is sampled (the last of a sequence)
    max_query_len: int  # 1 for a pure decode step
    max_seq_len: int
    prev_rows: Any = None  # [T] int32: row of sampled_prev holding token t, or -1 (None: all -1)
    sampled_prev: Any = None  # [S_prev] int32: the previous step's sampled ids (set by executor)

    @property
    def is_decode(self) -> bool:
        return self.max_query_len == 1
