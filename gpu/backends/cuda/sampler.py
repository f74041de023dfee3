"""The device sampler's state: per-row parameters in staged device buffers, the token-state
table of penalties and bans, and the sampled ids coming back through host memory mapped into
the device.

SamplingMetadata (host, numpy) -> pinned staging fields (fparams / iparams / uparams, see
gpu/kernels/sampling.py for their rows) -> one copy with the rest of the step's inputs ->
the sampler kernels -> ids. Every buffer they touch is allocated here once, so a step with
any sampling settings (penalties and min_tokens bans included) replays from a CUDA graph.

Penalties and bans read the token state (gpu/sampling/token_state.py): a uint16 table
[max_rows, vocab] on the device (2 bytes a cell: 65.7 MB at 256 x 128,256) with its bit mask
(a bit a nonzero cell: 4.0 MB), one row per
sequence with a penalty or a ban, counted on by the sampler itself. A step stages only each
row's state row and whether its ban is active; a sequence sampled for the first time in its row
brings a state write (md.state_writes), uploaded packed and written by write_states_kernel on
the stream before the step's forward: the only variable-length upload, and only on the steps
that admit or recompute such a sequence.

The ids come back with no copy on the stream (fetch_async): the sampler kernel stores them both
into `out` (device memory: the next step's embedding reads its fed-back tokens there) and into
a ring of host buffers mapped into the device's address space (cuda.mapped_array), at the slot
the step staged in `ring_slot`; an event after the kernel says they have landed. A copy
engine's device-to-host copy between two graphs costs more than the copy itself: traced on the
H200 (tests/device/trace_loop.py) it started 5.5 us after the step's last kernel, and the next
step's upload followed it 10 us later. Async scheduling launches step N+1
before reading step N's ids, so two slots alternate: N+1's stores never land on ids of N that
are not read yet (at most two results are unread at a time).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from gpu.backends.cuda.staging import Staging
from gpu.kernels import sampling as k
from gpu.kernels.argmax import argmax_rows, argmax_scratch_size
from gpu.kernels.token_state import pack_writes, unpack, write_states
from gpu.sampling import SamplingMetadata
from gpu.sampling.token_state import new_mask, new_state


def sampler_fields(max_rows: int) -> list[tuple[str, type, tuple[int, ...]]]:
    return [
        ("fparams", np.float32, (6, max_rows + 1)),
        ("uparams", np.uint64, (2, max_rows)),
        ("iparams", np.int32, (3, max_rows + 1)),  # top_k, state row, ban active
        ("ring_slot", np.int32, (1,)),  # the row of the host ring this step's ids go to
    ]


RING_SLOTS = 2  # results unread at a time, at most (async scheduling: see above)


class DeviceResult:
    """A launched step's sampled ids, on their way to a slot of the host ring."""

    __slots__ = ("host", "n", "event")

    def __init__(self, host: np.ndarray, n: int, event) -> None:
        self.host, self.n, self.event = host, n, event

    def result(self) -> np.ndarray:
        """Wait for the sampler (the step's only synchronisation) and return the ids."""
        self.event.synchronize()
        return self.host[: self.n].copy()


class DeviceSampler:
    def __init__(
        self, max_rows: int, vocab_size: int, stream, staging: Staging | None = None
    ) -> None:
        self.max_rows = max_rows
        self.vocab_size = vocab_size
        self.stream = stream
        self.own_staging = staging is None
        self.staging = staging or Staging(sampler_fields(max_rows), stream)
        self.state = cuda.to_device(new_state(max_rows, vocab_size), stream=stream)
        self.state_mask = cuda.to_device(new_mask(max_rows, vocab_size), stream=stream)
        self.scratch = k.sampler_scratch(max_rows, vocab_size, stream)
        self.out = cuda.device_array(max_rows, dtype=np.int32, stream=stream)
        scratch = argmax_scratch_size(max_rows, vocab_size)
        self._argmax_val = cuda.device_array(scratch, dtype=np.float32, stream=stream)
        self._argmax_idx = cuda.device_array(scratch, dtype=np.int32, stream=stream)
        # Host memory the kernels store into (zero-copy): row i is slot i's ids.
        self.ring = cuda.mapped_array((RING_SLOTS, max_rows), dtype=np.int32)
        # The host's view of the same memory as a plain ndarray: Numba's MappedNDArray subclass
        # would make every slice, and the ids handed to the engine, one of its own.
        self.ring_host = np.asarray(self.ring)
        self.ring_events = [cuda.event() for _ in range(RING_SLOTS)]
        self._slot = 0  # the slot the step being staged writes
        self._writes = cuda.device_array(4096, np.int32, stream=stream)  # packed state writes

    def write_states(self, md: SamplingMetadata) -> None:
        """Enqueue md's state writes (rows of sequences sampled for the first time in them):
        one upload of the packed rows and cells, one kernel. Call it before the step's forward:
        the sampler of the step reads the rows, and in stream order the writes follow every
        earlier step's sampler."""
        writes = md.state_writes
        if not writes:
            return
        for row, _, _ in writes:
            if not 0 <= row < self.max_rows:
                raise ValueError(f"state row {row} outside the table's {self.max_rows} rows")
        packed = pack_writes(writes)
        if packed.size > self._writes.shape[0]:  # rare: long prompts, many admissions at once
            self._writes = cuda.device_array(2 * packed.size, np.int32, stream=self.stream)
        # From pageable memory the copy returns once `packed` is staged: it may be dropped.
        self._writes[: packed.size].copy_to_device(packed, stream=self.stream)
        total = sum(len(t) for _, t, _ in writes)
        rows, offsets, tokens, values = unpack(self._writes, len(writes), total)
        write_states(self.state, self.state_mask, rows, offsets, tokens, values, self.stream)

    def stage(self, md: SamplingMetadata, staging: Staging | None = None) -> None:
        """Write md's parameters (and the ring slot its ids go to) into the pinned fields of
        staging (default: the sampler's)."""
        n = md.num_rows
        if n > self.max_rows:
            raise ValueError(f"{n} rows to sample, the sampler holds {self.max_rows}")
        host = (staging or self.staging).host
        host["ring_slot"][0] = self._slot
        f = host["fparams"]
        f[k.F_TEMPERATURE, :n] = md.temperature
        f[k.F_TOP_P, :n] = md.top_p
        f[k.F_MIN_P, :n] = md.min_p
        f[k.F_REPETITION, :n] = md.repetition_penalty
        f[k.F_PRESENCE, :n] = md.presence_penalty
        f[k.F_FREQUENCY, :n] = md.frequency_penalty
        u = host["uparams"]
        u[k.U_SEED, :n] = md.seed
        u[k.U_STEP, :n] = md.step
        i = host["iparams"]
        i[k.I_TOP_K, :n] = md.top_k
        i[k.I_STATE_ROW, :n] = md.state_rows
        i[k.I_BAN_ACTIVE, :n] = md.ban_active

    def pad(self, n: int, rows: int, staging: Staging | None = None) -> None:
        """Rows n..rows-1 of a padded (graph) step: greedy, no token state."""
        host = (staging or self.staging).host
        host["ring_slot"][0] = self._slot
        f = host["fparams"]
        f[:, n:rows] = 0.0
        f[k.F_TOP_P, n:rows] = 1.0
        f[k.F_REPETITION, n:rows] = 1.0
        u = host["uparams"]
        u[:, n:rows] = 0
        i = host["iparams"]
        i[k.I_TOP_K, n:rows] = 0
        i[k.I_STATE_ROW, n:rows] = -1
        i[k.I_BAN_ACTIVE, n:rows] = 0

    def launch(self, logits, staging: Staging | None = None) -> None:
        """Sample every row of logits [n, V] into self.out[:n] and the staged slot of the host
        ring (on the stream, no sync), with the parameters staged in staging; rows with a state
        row count their token there."""
        n = logits.shape[0]
        d = (staging or self.staging).device
        k.sample(
            logits, d["fparams"], d["iparams"], d["uparams"], self.state, self.state_mask,
            self.scratch, self.out[:n], self.stream, self.ring, d["ring_slot"],
        )  # fmt: skip

    def launch_greedy(self, logits, staging: Staging | None = None) -> None:
        """Every row greedy with no token state (md.all_greedy): a two-stage argmax over many
        blocks, and the state is neither read nor written."""
        n = logits.shape[0]
        slot = (staging or self.staging).device["ring_slot"]
        argmax_rows(
            logits, self.out[:n], self._argmax_val, self._argmax_idx, self.stream, self.ring, slot
        )

    def fetch_async(self, n: int) -> DeviceResult:
        """The result of the step just launched: its slot of the ring and an event after its
        sampler. The next step stages the other slot."""
        i = self._slot
        self._slot = (i + 1) % RING_SLOTS
        event = self.ring_events[i]
        event.record(self.stream)
        return DeviceResult(self.ring_host[i], n, event)

    def fetch(self, n: int) -> np.ndarray:
        """Wait for the n sampled ids: the step's only synchronisation."""
        return self.fetch_async(n).result()

    def sample(self, logits, md: SamplingMetadata) -> np.ndarray:
        """Write states, stage, copy, sample and wait: the whole job for a sampler with its own
        staging."""
        self.write_states(md)
        self.stage(md)
        if self.own_staging:
            self.staging.upload()
        self.launch(logits)
        return self.fetch(md.num_rows)
