"""The block manager's invariants, under random sequences of add / step / abort / finish."""

from __future__ import annotations

from collections import Counter

import numpy as np
from engine_helpers import scripted_engine
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu import SamplingParams
from gpu.block_manager import BlockManager
from gpu.sequence import Sequence


def check_invariants(engine) -> None:
    bm = engine.block_manager
    owners: Counter[int] = Counter()
    for seq in engine.requests.values():
        owners.update(seq.block_table)
        # A running sequence's table covers exactly its computed tokens' blocks (or more).
        assert len(seq.block_table) * bm.block_size >= seq.num_computed_tokens
    # Reference counts equal the number of owners; nobody owns a free block.
    for block in range(bm.num_blocks):
        assert bm.ref_counts[block] == owners.get(block, 0), block
    free = set(bm.free_ids)
    evictable = set(bm.evictable)
    owned = set(owners)
    assert len(free) == len(bm.free_ids) and not (free & evictable)
    assert not (owned & free) and not (owned & evictable)
    assert len(free) + len(evictable) + len(owned) == bm.num_blocks
    assert bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks
    # No block owned twice by one sequence.
    for seq in engine.requests.values():
        assert len(set(seq.block_table)) == len(seq.block_table)
    # The numpy mirror of the block tables holds exactly the lists, zero-padded.
    rows = bm.table_rows
    live = {seq.table_row for seq in engine.requests.values() if seq.table_row >= 0}
    for seq in engine.requests.values():
        assert (seq.table_row >= 0) == bool(seq.block_table)
        if seq.table_row >= 0:
            assert rows.lens[seq.table_row] == len(seq.block_table)
            assert rows.array[seq.table_row, : len(seq.block_table)].tolist() == seq.block_table
    for row in range(len(rows.array)):
        if row not in live:
            assert rows.lens[row] == 0 and row in rows.free_rows
    padding = np.arange(rows.array.shape[1]) >= rows.lens[:, None]
    assert not rows.array[padding].any()
    # Every cached hash points at a block whose key is its own, and owners agree on contents.
    for h, block in bm.cached.items():
        assert bm.block_hash[block] == h
        key = bm.block_key[block]
        assert key is not None and hash(key) == h
    for seq in engine.requests.values():
        for i, block in enumerate(seq.block_table[: len(seq.block_hashes)]):
            key = bm.block_key[block]
            if key is not None:
                lo = i * bm.block_size
                assert key[1] == tuple(seq.token_ids[lo : lo + bm.block_size])


def script(seed: int, step: int) -> int:
    return (seed * 31 + step * 7) % 200


ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 70), st.integers(0, 3), st.integers(1, 30)),
        st.tuples(st.just("step"), st.integers(1, 4)),
        st.tuples(st.just("abort"), st.integers(0, 20)),
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(ops)
def test_invariants_hold_under_random_operations(operations):
    engine = scripted_engine(script, num_kv_blocks=24, max_num_seqs=6, max_num_batched_tokens=24)
    shared = [5, 6, 7, 8] * 10  # prompts share prefixes so the cache gets hits
    seeds = iter(range(10_000))
    ids: list[str] = []
    for op in operations:
        if op[0] == "add":
            _, length, prefix_kind, max_tokens = op
            prompt = (shared[: prefix_kind * 12] + list(range(1, length + 1)))[:300]
            params = SamplingParams(temperature=1.0, seed=next(seeds), max_tokens=max_tokens)
            ids.append(engine.add_request(prompt, params))
        elif op[0] == "step":
            for _ in range(op[1]):
                engine.step()
        elif ids:
            engine.abort_request(ids[op[1] % len(ids)])
        check_invariants(engine)
    while engine.has_unfinished_requests():
        engine.step()
        check_invariants(engine)
    assert engine.block_manager.num_used_blocks == 0


def make_seq(tokens: list[int]) -> Sequence:
    params = SamplingParams()
    return Sequence("r", None, tokens, params, 0, 0.0, frozenset(), 4096)


def test_cached_prefix_survives_free_and_is_evicted_last():
    bm = BlockManager(num_blocks=4, block_size=4)
    a = make_seq(list(range(12)))
    assert bm.admit(a, [], 12)
    a.num_computed_tokens = 12
    bm.register_full_blocks(a)
    blocks = list(a.block_table)
    bm.free(a)
    assert bm.num_used_blocks == 0 and len(bm.evictable) == 3
    # The same prompt plus one token finds all three blocks.
    b = make_seq(list(range(13)))
    assert bm.find_cached_prefix(b) == blocks
    # Memory pressure evicts the tail block first, the shared prefix last.
    c = make_seq([99] * 8)
    assert bm.admit(c, [], 8)  # takes the never-used block and the LRU one
    assert bm.find_cached_prefix(b) == blocks[:2]


def test_full_prompt_hit_still_computes_the_last_token():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = make_seq(list(range(8)))
    bm.admit(a, [], 8)
    a.num_computed_tokens = 8
    bm.register_full_blocks(a)
    bm.free(a)
    same = make_seq(list(range(8)))
    assert len(bm.find_cached_prefix(same)) == 1  # 7 tokens at most -> one full block


def test_block_table_rows_grow_and_mirror_the_lists():
    """More sequences than rows and longer tables than columns: the array grows to fit."""
    bm = BlockManager(num_blocks=1000, block_size=2)
    seqs = [make_seq(list(range(i, i + 3))) for i in range(40)]
    for seq in seqs:
        assert bm.admit(seq, [], 3)
    for step in range(1, 40):  # grow every table past the array's first 32 columns
        for seq in seqs[: 40 - step]:
            seq.num_computed_tokens = len(seq.block_table) * 2
            assert bm.allocate(seq, 1)  # one more block each
    for seq in seqs[::3]:
        bm.free(seq)
    rows = bm.table_rows
    assert rows.array.shape[0] >= 40 and rows.array.shape[1] > 32
    for seq in seqs:
        if seq.block_table:
            row = rows.array[seq.table_row]
            assert row[: len(seq.block_table)].tolist() == seq.block_table
            assert not row[len(seq.block_table) :].any()
        else:
            assert seq.table_row == -1
    again = make_seq([7, 8, 9])
    assert bm.admit(again, [], 3)
    assert rows.array[again.table_row].tolist()[:3] == again.block_table + [0]
