"""The sampler's token state (gpu/sampling/token_state.py): penalties and min_tokens bans read a
per-sequence uint16 row written once and counted on by the sampler.

- the numpy twin with the state equals the history-based definition of the penalties (written
  here as the reference) on random histories with repeats; counts saturate at 16,383;
- the runner writes a row exactly when a sequence is first sampled in it, and at every step
  each row with state holds its sequence's real history: across preemption (recompute), abort,
  finish, and reuse of a row by another sequence (a count the sampler added for a discarded
  token never reaches the next owner), with async scheduling on and off;
- the write kernel (simulator) and the device sampler against the twin.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from engine_helpers import random_prompts, tiny_engine
from kernel_helpers import fresh_rng, synced
from numba import cuda

from gpu import SamplingParams
from gpu.sampling import SamplingMetadata
from gpu.sampling.numpy_sampler import sample
from gpu.sampling.token_state import (
    BAN_BIT,
    COUNT_MASK,
    PROMPT_BIT,
    STATE_DTYPE,
    add_tokens,
    new_state,
    row_state,
    state_mask,
    write_states,
)
from gpu.sampling_batch import SamplingBatch, StateOwners
from gpu.sampling_params import RequestOutputKind
from gpu.sequence import Sequence


# --- the twin against the history-based definition -------------------------------------------
def history_penalties(logits, prompt_ids, output_ids, repetition, presence, frequency) -> None:
    """The reference: vLLM's penalties from the token ids themselves, in place on one row."""
    vocab = logits.shape[0]
    if repetition != 1.0:
        seen = np.zeros(vocab, dtype=bool)
        seen[prompt_ids] = True
        seen[output_ids] = True
        row = logits[seen]
        logits[seen] = np.where(row > 0, row / repetition, row * repetition)
    if presence != 0.0 or frequency != 0.0:
        counts = np.bincount(output_ids, minlength=vocab).astype(np.float32)
        logits -= np.float32(frequency) * counts + np.float32(presence) * (counts > 0)


def history_sample(logits, md, prompts, outputs, banned) -> np.ndarray:
    """The sampler as it was defined on histories: penalties, bans, then the twin's own
    truncation and draw on rows without state."""
    rows = logits.copy()
    for i in range(rows.shape[0]):
        history_penalties(
            rows[i], prompts[i], outputs[i], float(md.repetition_penalty[i]),
            float(md.presence_penalty[i]), float(md.frequency_penalty[i]),
        )  # fmt: skip
        rows[i, list(banned[i])] = -np.inf
    plain = dataclasses.replace(md, state_rows=None, ban_active=None, state_writes=None)
    plain.__post_init__()
    return sample(rows, plain)


def random_metadata(rng, n: int) -> SamplingMetadata:
    md = SamplingMetadata.greedy(n)
    md.temperature = np.where(rng.random(n) < 0.3, 0.0, rng.uniform(0.5, 1.5, n)).astype(np.float32)
    md.top_k = np.where(rng.random(n) < 0.3, rng.integers(1, 40, n), 0).astype(np.int32)
    md.top_p = np.where(rng.random(n) < 0.3, rng.uniform(0.5, 1.0, n), 1.0).astype(np.float32)
    md.min_p = np.where(rng.random(n) < 0.2, 0.05, 0.0).astype(np.float32)
    md.repetition_penalty = rng.choice([1.0, 1.1, 1.5, 0.8], n).astype(np.float32)
    md.presence_penalty = rng.choice([0.0, 0.5, -0.3], n).astype(np.float32)
    md.frequency_penalty = rng.choice([0.0, 0.25, 1.0], n).astype(np.float32)
    md.seed = rng.integers(0, 2**63, n).astype(np.uint64)
    md.step = rng.integers(0, 100, n).astype(np.uint64)
    return md


def test_the_state_twin_equals_the_history_definition():
    rng = np.random.default_rng(7)
    vocab, n = 300, 12
    for _ in range(5):
        logits = (rng.standard_normal((n, vocab)) * 3).astype(np.float32)
        md = random_metadata(rng, n)
        # Histories with repeats: few distinct ids, drawn many times.
        prompts = [rng.integers(0, 40, rng.integers(0, 30)) for _ in range(n)]
        outputs = [rng.integers(0, 40, rng.integers(0, 60)) for _ in range(n)]
        outputs[0] = np.full(7, int(np.argmax(logits[0])))  # the favourite, penalised
        banned = [tuple(rng.integers(0, 40, rng.integers(0, 3))) for _ in range(n)]
        state = new_state(n + 3, vocab)
        rows = rng.permutation(n + 3)[:n].astype(np.int32)
        md.state_rows = rows
        md.ban_active = np.ones(n, np.int32)
        md.state_writes = [
            (int(rows[i]), *row_state(prompts[i], outputs[i], banned[i], vocab)) for i in range(n)
        ]
        write_states(state, md.state_writes)
        before = state.copy()
        got = sample(logits, md, state)
        assert got.tolist() == history_sample(logits, md, prompts, outputs, banned).tolist()
        # Each row counted its token once; nothing else moved.
        added = state.astype(np.int64) - before
        assert added[rows, got].tolist() == [1] * n and added.sum() == n


def test_a_row_state_holds_prompt_bits_counts_and_bans():
    tokens, values = row_state([3, 3, 9], [9, 4, 4, 4, 300], [4, 7, 1000], vocab=256)
    assert tokens.tolist() == [3, 4, 7, 9]  # 300 and 1000 are outside the vocabulary
    assert tokens.dtype == np.int32 and values.dtype == STATE_DTYPE
    assert values.tolist() == [PROMPT_BIT, BAN_BIT | 3, BAN_BIT, PROMPT_BIT | 1]


def test_the_state_mask_has_a_bit_a_nonzero_cell():
    state = new_state(2, 70)  # not a multiple of 32: the last word's high bits stay clear
    state[0, [0, 31, 32, 69]] = [1, PROMPT_BIT, BAN_BIT, 3]
    mask = state_mask(state)
    assert mask.shape == (2, 3) and mask.dtype == np.uint32
    assert mask[0].tolist() == [1 | 1 << 31, 1, 1 << 5] and not mask[1].any()


def test_counts_saturate_at_16383():
    vocab = 8
    tokens, values = row_state([], [5] * 20_000 + [2], [5], vocab)
    assert values.tolist() == [1, BAN_BIT | COUNT_MASK] and COUNT_MASK == 16_383
    state = new_state(2, vocab)
    write_states(state, [(1, tokens, values)])
    add_tokens(state, np.array([1, 0]), np.array([5, 5]))
    assert state[1, 5] == BAN_BIT | COUNT_MASK  # no carry into the ban bit
    assert state[0, 5] == 1
    state[0, 3] = COUNT_MASK - 1
    add_tokens(state, np.array([-1, 0]), np.array([3, 3]))
    add_tokens(state, np.array([0]), np.array([3]))
    assert state[0, 3] == COUNT_MASK
    # The frequency penalty stops growing there: 16,383 x 0.001 subtracted, not 20,000 x.
    md = SamplingMetadata.greedy(1)
    md.frequency_penalty = np.array([0.001], np.float32)
    md.state_rows = np.array([1], np.int32)
    logits = np.zeros((1, vocab), np.float32)
    logits[0, 5] = 17.0  # 17 - 16.383 > 0 and 17 - 20 < 0: token 5 still wins
    assert sample(logits, md, state)[0] == 5


# --- the runner's state rows: written exactly when needed ---------------------------------
def test_state_owners_write_a_row_for_each_new_owner():
    owners = StateOwners()
    a, b = object(), object()
    assert owners.claim(a, 0) and not owners.claim(a, 0)  # first time in the row, then not
    assert owners.claim(b, 0)  # another sequence in the same row
    assert owners.claim(a, 0)  # a comes back: b wrote the row in between
    assert owners.claim(a, 1)  # a moves (preempted, readmitted elsewhere)
    assert owners.claim(a, 0)  # ... and back: row 0 stopped being its history when it left
    assert owners.owner == {0: a} and owners.row_of == {a: 0}


def _expected_metadata(seqs: list) -> dict[str, list]:
    """What a step's SamplingMetadata must hold, from each sequence's params and outputs."""
    rows = {"temperature": [], "top_k": [], "top_p": [], "seed": [], "step": []}
    rows |= {"repetition_penalty": [], "state_rows": [], "ban_active": []}
    for s in seqs:
        p, k = s.params, len(s.output_token_ids)
        banning = k < p.min_tokens and bool(s.finishing_token_ids)
        rows["temperature"].append(0.0 if p.greedy else p.temperature)
        rows["top_k"].append(p.top_k)
        rows["top_p"].append(p.top_p)
        rows["repetition_penalty"].append(p.repetition_penalty)
        rows["seed"].append(s.seed)
        rows["step"].append(k)
        rows["state_rows"].append(s.table_row if p.has_penalties or banning else -1)
        rows["ban_active"].append(int(banning))
    return rows


def test_sampling_batch_reuses_a_batch_constants_and_recomputes_what_moves():
    """SamplingBatch keeps the last batch's parameter arrays while its sequences stay the same
    ones in the same order; step counters, state rows, bans and writes are every step's own:
    a ban that ends, a sequence that moves row, a batch that changes, all as a fresh build."""

    def seq(i: int, **params) -> Sequence:
        s = Sequence(f"r{i}", None, [1, 2, 3], SamplingParams(**params), 100 + i, 0.0,
                     frozenset({7}), 4096)  # fmt: skip
        s.table_row = i
        return s

    chat = seq(0, temperature=0.7, top_p=0.9, repetition_penalty=1.1)
    banned = seq(1, temperature=0.0, min_tokens=2)  # greedy, bans eos (7) for two tokens
    plain = seq(2, temperature=1.0, top_k=5)
    batch = SamplingBatch(vocab_size=16)
    history = []
    for step, seqs in enumerate([[chat, banned, plain]] * 3 + [[chat, plain], [chat, plain]]):
        if step == 3:
            chat.table_row = 5  # preempted and readmitted elsewhere: its history is written again
        md = batch.metadata(seqs)
        want = _expected_metadata(seqs)
        for name, values in want.items():
            assert getattr(md, name).tolist() == pytest.approx(values), (step, name)
        written = {row for row, _, _ in md.state_writes or ()}
        history.append((md, written))
        for s in seqs:
            s.output_token_ids.append(3)
    (md0, w0), (md1, w1), (md2, w2), (md3, w3), (md4, w4) = history
    assert w0 == {0, 1} and w1 == w2 == set() and w3 == {5} and w4 == set()
    assert md1.state_rows.tolist() == [0, 1, -1]  # still banning at its second token
    assert md2.state_rows.tolist() == [0, -1, -1] and md2.ban_active.tolist() == [0, 0, 0]
    assert md1.temperature is md0.temperature and md2.top_p is md0.top_p  # reused
    assert md3.temperature is not md0.temperature and md4.seed is md3.seed  # rebuilt once
    with pytest.raises(ValueError):
        md4.top_p[0] = 1.0  # shared between steps: read-only


class StateChecker:
    """Wraps the cpu backend's sample: after the step's state writes, every row with state
    must hold exactly its sequence's real history (prompt bits, counts of its output tokens,
    ban bits while banned), the token in flight included (read from the executor's last ids).
    """

    def __init__(self, engine) -> None:
        self.engine = engine
        self.backend = engine.runner.executor.backend
        self.sample = self.backend.sample
        self.backend.sample = self
        self.rows_checked = 0
        self.writes = 0
        self.rows_written: set[int] = set()
        self.last_checked: dict[int, object] = {}  # row -> the sequence last checked there
        self.discarded_erased = 0  # writes that erased a count of a discarded token

    def __call__(self, logits, md):
        state = self.backend.token_state
        for row, _, _ in md.state_writes or ():
            self.writes += 1
            self.rows_written.add(row)
            previous = self.last_checked.get(row)
            if previous is not None and previous.params.has_penalties:
                # More counts than the previous owner's final output: a token sampled for it
                # and then discarded (it had stopped, or was aborted, first).
                stale = int((state[row] & COUNT_MASK).astype(np.int64).sum())
                self.discarded_erased += stale > len(previous.output_token_ids)
        write_states(state, md.state_writes)
        vocab = state.shape[1]
        in_flight = self.engine.runner.executor.sampled_prev
        for i, row in enumerate(md.state_rows.tolist()):
            if row < 0:
                continue
            seq = self.engine.runner.state_owners.owner[row]
            outputs = [t if t >= 0 else int(in_flight[-1 - t]) for t in seq.output_token_ids]
            cells = state[row]
            if seq.params.has_penalties:
                counts = np.minimum(np.bincount(outputs, minlength=vocab), COUNT_MASK)
                assert (cells & COUNT_MASK).tolist() == counts.tolist(), seq
                prompt = np.zeros(vocab, bool)
                prompt[seq.prompt_token_ids] = True
                assert ((cells & PROMPT_BIT) != 0).tolist() == prompt.tolist(), seq
            if md.ban_active[i]:
                banned = np.zeros(vocab, bool)
                banned[[t for t in seq.finishing_token_ids if t < vocab]] = True
                assert ((cells & BAN_BIT) != 0).tolist() == banned.tolist(), seq
            self.rows_checked += 1
            self.last_checked[row] = seq
        return self.sample(logits, dataclasses.replace(md, state_writes=None))


def drive(engine, prompts, params, abort_after: dict | None = None) -> dict[int, tuple]:
    """Add every request, step to the end (abort_after[i] = k: abort request i once k of its
    tokens are known, with another in flight if async); returns request index -> (token ids,
    finish reason)."""
    pairs = zip(prompts, params, strict=True)
    ids = {engine.add_request(p, q): i for i, (p, q) in enumerate(pairs)}
    by_index = {i: rid for rid, i in ids.items()}
    results: dict[int, tuple] = {}
    step = 0
    while engine.has_unfinished_requests():
        for i, k in (abort_after or {}).items():
            seq = engine.requests.get(by_index[i])
            if seq is not None and seq.num_output_tokens >= k:
                engine.abort_request(by_index[i])
        for out in engine.step():
            if out.finished:
                c = out.outputs[0]
                results[ids[out.request_id]] = (list(c.token_ids), c.finish_reason)
        step += 1
        assert step < 3000
    assert engine.block_manager.num_used_blocks == 0
    return results


def penalised(i: int, max_tokens: int = 24, **kw) -> SamplingParams:
    """Strong penalties (so a leaked count would change tokens), seeded, varied per request."""
    values = dict(
        temperature=[0.0, 0.9][i % 2], repetition_penalty=1.6, frequency_penalty=0.7,
        presence_penalty=0.4, seed=1000 + i, max_tokens=max_tokens, ignore_eos=True,
    )  # fmt: skip
    values.update(kw)
    return SamplingParams(**values)


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_rows_hold_each_sequences_history_across_preemption(async_scheduling):
    prompts = random_prompts(6, seed=31, low=20, high=40)
    params = [penalised(i, 40) if i % 3 else penalised(i, 40, min_tokens=30) for i in range(6)]
    alone = [drive(tiny_engine(), [p], [q])[0] for p, q in zip(prompts, params, strict=True)]
    engine = tiny_engine(
        num_kv_blocks=12, block_size=8, max_num_seqs=6, async_scheduling=async_scheduling
    )
    checker = StateChecker(engine)
    together = drive(engine, prompts, params)
    assert engine.scheduler.num_preemptions > 0
    assert [together[i] for i in range(6)] == alone
    assert checker.rows_checked > 100
    assert checker.writes > 6  # recomputed sequences wrote their rows again


@pytest.mark.parametrize("async_scheduling", [True, False])
def test_rows_reused_after_abort_and_finish_start_clean(async_scheduling):
    """Two rows, eight requests: every row passes from sequence to sequence. Requests stop on a
    stop id or are aborted with a token in flight, whose count the sampler has already added to
    the row: the next owner's check proves the write erased it."""
    prompts = random_prompts(8, seed=41, low=5, high=30)
    first = [drive(tiny_engine(), [p], [penalised(i)])[0][0] for i, p in enumerate(prompts)]
    # A stop id met mid-reply (the async engine computes one token past it, then discards it).
    params = [
        penalised(i, stop_token_ids=[first[i][5]]) if i % 2 else penalised(i)
        for i in range(len(prompts))
    ]
    alone = [drive(tiny_engine(), [p], [q])[0] for p, q in zip(prompts, params, strict=True)]
    engine = tiny_engine(max_num_seqs=2, async_scheduling=async_scheduling)
    checker = StateChecker(engine)
    together = drive(engine, prompts, params, abort_after={2: 10, 4: 3})
    for i in range(len(prompts)):
        if i in (2, 4):
            assert together[i][1] == "abort"
            assert together[i][0] == alone[i][0][: len(together[i][0])]
        else:
            assert together[i] == alone[i], i
    assert any(r[1] == "stop" for r in together.values())
    assert checker.rows_written == {0, 1} and checker.writes == len(prompts)
    assert checker.rows_checked > 60
    # Async: stopped and aborted sequences left counts of discarded tokens, which the next
    # owners' writes erased (serial: nothing is computed past a stop).
    assert (checker.discarded_erased > 0) == async_scheduling


def test_a_ban_only_sequence_uses_its_row_only_while_banned():
    engine = tiny_engine(max_num_seqs=2)
    checker = StateChecker(engine)
    seen_rows = []
    original = checker.sample

    def spy(logits, md):
        seen_rows.append(md.state_rows.copy())
        return original(logits, md)

    checker.sample = spy
    params = SamplingParams(temperature=0, max_tokens=10, min_tokens=4)
    drive(engine, [[1, 2, 3]], [params])
    with_state = [int((r >= 0).sum()) for r in seen_rows]
    assert with_state[:4] == [1, 1, 1, 1] and with_state[4:] == [0] * (len(with_state) - 4)
    assert len(with_state) > 4  # after the ban: plain argmax steps, no state
    assert checker.writes == 1


def test_async_penalties_keep_streaming_without_drains():
    engine = tiny_engine()
    params = dataclasses.replace(penalised(1, 30), output_kind=RequestOutputKind.DELTA)
    engine.add_request(random_prompts(1, seed=3)[0], params)
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.num_drains == 0


# --- the device side (the simulator here; a real GPU on the device machine) ----------------
def test_write_states_kernel_matches_the_twin():
    from gpu.kernels.token_state import pack_writes, unpack
    from gpu.kernels.token_state import write_states as device_write

    rng, seed = fresh_rng()
    rows, vocab = 5, 700  # not a multiple of the block
    start = rng.integers(0, 1 << 16, (rows, vocab)).astype(np.uint16)  # stale contents
    writes = [
        (3, *row_state(rng.integers(0, vocab, 40), rng.integers(0, 50, 90), [vocab - 1], vocab)),
        (0, *row_state([], [], [], vocab)),  # an empty row: zeroed
        (4, *row_state([1, 2], [2, 2, 2], [], vocab)),
    ]
    expected = start.copy()
    write_states(expected, writes)
    packed = pack_writes(writes)
    total = sum(len(t) for _, t, _ in writes)
    assert packed.size == 2 * len(writes) + 1 + 2 * total
    host = unpack(packed, len(writes), total)
    assert host[0].tolist() == [3, 0, 4] and host[1][-1] == total
    state = cuda.to_device(start)
    stale = rng.integers(0, 1 << 32, (rows, -(-vocab // 32)), dtype=np.uint64).astype(np.uint32)
    mask = cuda.to_device(stale)
    device_write(state, mask, *unpack(cuda.to_device(packed), len(writes), total))
    got = synced(state)
    assert np.array_equal(got, expected), f"KERNEL_TEST_SEED={seed}"
    assert np.array_equal(got[[1, 2]], start[[1, 2]])  # rows not written are left alone
    got_mask = synced(mask)
    assert np.array_equal(got_mask[[3, 0, 4]], state_mask(expected)[[3, 0, 4]]), seed
    assert np.array_equal(got_mask[[1, 2]], stale[[1, 2]])


def _device_sampler_or_skip():
    from gpu.kernels import sampling

    if not hasattr(sampling, "sampler_scratch"):
        pytest.skip("the CUDA sampler with token state (gpu/kernels/sampling.py) is not in yet")
    from gpu.backends.cuda.sampler import DeviceSampler

    return DeviceSampler


def test_device_sampler_with_state_matches_the_twin():
    """Two steps on one table: the first writes the rows (DeviceSampler.write_states) and
    samples; the second samples from the rows as the first left them (its counts added)."""
    DeviceSampler = _device_sampler_or_skip()
    rng, seed = fresh_rng()
    n, vocab = 6, 300
    sampler = DeviceSampler(n + 2, vocab, cuda.stream())
    state = new_state(n + 2, vocab)
    md = random_metadata(rng, n)
    md.state_rows = np.array([5, -1, 0, 7, 2, 3], np.int32)
    md.ban_active = np.array([1, 0, 1, 0, 1, 0], np.int32)
    md.state_writes = []
    for row in md.state_rows.tolist():
        if row >= 0:
            history = (rng.integers(0, 30, 20), rng.integers(0, 30, 40), rng.integers(0, 30, 2))
            md.state_writes.append((row, *row_state(*history, vocab)))
    for step in range(2):
        logits = (rng.standard_normal((n, vocab)) * 3).astype(np.float32)
        write_states(state, md.state_writes)
        expected = sample(logits, md, state)
        got = sampler.sample(cuda.to_device(logits), md)
        assert got.tolist() == expected.tolist(), f"step {step}, KERNEL_TEST_SEED={seed}"
        assert np.array_equal(synced(sampler.state), state), f"KERNEL_TEST_SEED={seed}"
        assert np.array_equal(synced(sampler.state_mask), state_mask(state)), seed
        md.state_writes = None
        md.step = md.step + 1


def test_write_states_kernel_compiles_for_sm90():
    """As tests/test_kernels_compile.py does for the other kernels: PTX for sm_90, no GPU."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from test_kernels_compile import SCRIPT

    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, "gpu.kernels.token_state"],
        cwd=root, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    r = results["gpu.kernels.token_state.write_states_kernel"]
    assert r["sm_90"] and r["waits"] >= 1
