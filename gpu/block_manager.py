"""The block manager: the paged KV cache's allocator, with prefix caching.

The KV cache is cut into fixed-size blocks (16 tokens). A sequence owns a list of blocks, its
`block_table`; token t lives in block_table[t // block_size] at offset t % block_size. Blocks
need not be contiguous, so memory is never fragmented and a sequence grows one block at a time.

Prefix caching: once a block is full and computed, it is registered under a hash chained over
all the tokens up to its end, hash((parent_hash, its tokens)). A new request whose prompt starts
with the same tokens (the earlier turns of a chat, a shared system prompt) finds those blocks
and skips their prefill. Blocks are reference-counted, so several sequences can share one. A
freed block that holds a registered hash is not erased: it waits in an LRU list, still findable,
until memory runs short and it is evicted (least recently used first; a freed sequence's tail
blocks go first, its shared prefix last).

Every block is in exactly one place: owned (ref count > 0), `free_ids` (no hash) or
`evictable` (hash, no owner).

Each sequence's block table is kept twice: as the Python list `seq.block_table`, and as a row of
one numpy array (`BlockTableRows`), so that a step's [num_seqs, max_blocks] table is one numpy
gather instead of a list-to-array copy per sequence.
"""

from __future__ import annotations

from collections import OrderedDict, deque

import numpy as np

from gpu.sequence import Sequence


class BlockTableRows:
    """The block tables of every sequence that holds blocks, one row each, zero-padded.

    Why: the model runner needs the step's block tables as one int32 array. Copying each
    sequence's list into it costs about a microsecond a sequence every step; with the tables
    already in rows, a step takes them with one fancy index (`array[rows, :max_blocks]`). A row
    changes only when its sequence gets a new block (once every block_size tokens) or frees them.
    Both dimensions grow by doubling, so the array stays as small as the tables it holds.
    """

    def __init__(self, num_rows: int = 16, num_cols: int = 32) -> None:
        self.array = np.zeros((num_rows, num_cols), dtype=np.int32)
        self.lens = np.zeros(num_rows, dtype=np.int32)  # blocks in each row
        self.free_rows = list(range(num_rows - 1, -1, -1))  # popped from the end: row 0 first

    def acquire(self) -> int:
        if not self.free_rows:
            old = len(self.array)
            self.array = np.concatenate([self.array, np.zeros_like(self.array)])
            self.lens = np.concatenate([self.lens, np.zeros_like(self.lens)])
            self.free_rows = list(range(2 * old - 1, old - 1, -1))
        return self.free_rows.pop()

    def append(self, row: int, block: int) -> None:
        n = int(self.lens[row])
        if n == self.array.shape[1]:
            self.array = np.concatenate([self.array, np.zeros_like(self.array)], axis=1)
        self.array[row, n] = block
        self.lens[row] = n + 1

    def release(self, row: int) -> None:
        self.array[row, : self.lens[row]] = 0  # keep the padding zero for the next owner
        self.lens[row] = 0
        self.free_rows.append(row)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1:
            raise ValueError("the KV cache needs at least one block")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        # What each registered hash stands for, to rule out collisions: (parent hash, tokens).
        self.block_key: list[tuple[int | None, tuple[int, ...]] | None] = [None] * num_blocks
        self.free_ids: deque[int] = deque(range(num_blocks))
        self.evictable: OrderedDict[int, None] = OrderedDict()  # oldest first
        self.cached: dict[int, int] = {}  # chained hash -> block id
        self.table_rows = BlockTableRows()  # seq.block_table as numpy rows, for the runner
        self.prefix_queries = 0  # prompt tokens looked up
        self.prefix_hits = 0  # of which were found in the cache

    # --- accounting -----------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids) + len(self.evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        total = seq.num_computed_tokens + num_new_tokens
        return max(0, -(-total // self.block_size) - len(seq.block_table))

    # --- prefix cache ---------------------------------------------------------------------
    def _key(self, parent: int | None, token_ids: list[int], index: int):
        bs = self.block_size
        return (parent, tuple(token_ids[index * bs : (index + 1) * bs]))

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Blocks holding the longest cached prefix of seq's tokens.

        At most (num_tokens - 1) tokens are taken from the cache: the last one must be computed
        so the step has logits to sample from.
        """
        if not self.enable_prefix_caching:
            return []
        hits: list[int] = []
        parent: int | None = None
        for i in range((seq.num_tokens - 1) // self.block_size):
            key = self._key(parent, seq.token_ids, i)
            h = hash(key)
            block = self.cached.get(h)
            if block is None or self.block_key[block] != key:
                break
            hits.append(block)
            parent = h
        return hits

    def register_full_blocks(self, seq: Sequence) -> None:
        """Give a hash to each block of seq that became full and computed since the last call.

        Only blocks of known tokens: a placeholder of a step in flight (Sequence.num_pending)
        is computed but not known yet, so its block waits for the engine's next call."""
        num_full = min(seq.num_computed_tokens, seq.num_known_tokens) // self.block_size
        if num_full <= len(seq.block_hashes) or not self.enable_prefix_caching:
            return  # the common decode step: no block filled up
        num_full = min(num_full, len(seq.block_table))
        for i in range(len(seq.block_hashes), num_full):
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            key = self._key(parent, seq.token_ids, i)
            h = hash(key)
            seq.block_hashes.append(h)
            block = seq.block_table[i]
            if h not in self.cached and self.block_hash[block] is None:
                self.cached[h] = block
                self.block_hash[block] = h
                self.block_key[block] = key

    # --- allocation -----------------------------------------------------------------------
    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self.blocks_needed(seq, num_new_tokens) <= self.num_free_blocks

    def admit(self, seq: Sequence, cached_blocks: list[int], num_new_tokens: int) -> bool:
        """Give a waiting sequence its cached prefix blocks plus room for num_new_tokens more.

        Returns False (and changes nothing) when there is not enough free memory.
        """
        reclaimed = sum(1 for b in cached_blocks if self.ref_counts[b] == 0)
        num_cached_tokens = len(cached_blocks) * self.block_size
        total = num_cached_tokens + num_new_tokens
        needed = -(-total // self.block_size) - len(cached_blocks)
        if needed > self.num_free_blocks - reclaimed:
            return False
        for block in cached_blocks:
            if self.ref_counts[block] == 0:
                del self.evictable[block]
            self.ref_counts[block] += 1
        seq.block_table = []
        for block in cached_blocks:
            self._append_block(seq, block)
        seq.block_hashes = [self.block_hash[b] for b in cached_blocks]  # type: ignore[misc]
        seq.num_computed_tokens = num_cached_tokens
        seq.num_cached_tokens = num_cached_tokens
        self.prefix_queries += seq.num_prompt_tokens
        self.prefix_hits += num_cached_tokens
        self._grow(seq, needed)
        return True

    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Make room for num_new_tokens more tokens of a running sequence."""
        needed = self.blocks_needed(seq, num_new_tokens)
        if needed > self.num_free_blocks:
            return False
        self._grow(seq, needed)
        return True

    def _grow(self, seq: Sequence, count: int) -> None:
        for _ in range(count):
            self._append_block(seq, self._take_block())

    def _append_block(self, seq: Sequence, block: int) -> None:
        if seq.table_row < 0:
            seq.table_row = self.table_rows.acquire()
        seq.block_table.append(block)
        self.table_rows.append(seq.table_row, block)

    def _take_block(self) -> int:
        if self.free_ids:
            block = self.free_ids.popleft()
        else:
            block, _ = self.evictable.popitem(last=False)  # least recently used
            h = self.block_hash[block]
            if h is not None and self.cached.get(h) == block:
                del self.cached[h]
            self.block_hash[block] = None
            self.block_key[block] = None
        self.ref_counts[block] = 1
        return block

    def free(self, seq: Sequence) -> None:
        """Release seq's blocks. Registered ones stay findable until evicted."""
        for block in reversed(seq.block_table):  # tail first: evicted before the shared prefix
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                if self.block_hash[block] is not None:
                    self.evictable[block] = None
                else:
                    self.free_ids.append(block)
        if seq.table_row >= 0:
            self.table_rows.release(seq.table_row)
            seq.table_row = -1
        seq.block_table = []
        seq.block_hashes = []

    def reset_prefix_cache(self) -> int:
        """Forget every unowned cached block (e.g. after a weight change). Returns how many."""
        count = len(self.evictable)
        while self.evictable:
            block, _ = self.evictable.popitem(last=False)
            h = self.block_hash[block]
            if h is not None and self.cached.get(h) == block:
                del self.cached[h]
            self.block_hash[block] = None
            self.block_key[block] = None
            self.free_ids.append(block)
        return count
