"""The device sampler's state: per-row parameters in staged device buffers, the penalty scratch,
and the sampled ids coming back through pinned memory.

SamplingMetadata (host, numpy) -> pinned staging fields (fparams / iparams / uparams, see
gpu/kernels/sampling.py for their rows) -> one copy with the rest of the step's inputs ->
penalty_counts (only when some row has a token history) -> sample_kernel -> ids -> pinned ->
host. Banned ids and token histories are variable-length, so they go in their own device
buffers, copied only on the steps that have them (min_tokens, penalties: the eager path).

The ids come back asynchronously (fetch_async): a copy into pinned memory and an event after
it. Async scheduling launches step N+1 before reading step N's ids, so two pinned buffers
alternate: N+1's copy never lands on ids of N that are not read yet.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from gpu.backends.cuda.staging import Staging
from gpu.kernels import sampling as k
from gpu.kernels.argmax import argmax_rows, argmax_scratch_size
from gpu.sampling import SamplingMetadata


def sampler_fields(max_rows: int) -> list[tuple[str, type, tuple[int, ...]]]:
    return [
        ("fparams", np.float32, (6, max_rows + 1)),
        ("uparams", np.uint64, (2, max_rows)),
        ("iparams", np.int32, (4, max_rows + 1)),
    ]


class DeviceResult:
    """A launched step's sampled ids, on their way to a pinned buffer."""

    __slots__ = ("host", "n", "event")

    def __init__(self, host: np.ndarray, n: int, event) -> None:
        self.host, self.n, self.event = host, n, event

    def result(self) -> np.ndarray:
        """Wait for the copy (the step's only synchronisation) and return the ids."""
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
        self.counts = cuda.to_device(np.zeros((max_rows, vocab_size), np.int32), stream=stream)
        self.out = cuda.device_array(max_rows, dtype=np.int32, stream=stream)
        scratch = argmax_scratch_size(max_rows, vocab_size)
        self._argmax_val = cuda.device_array(scratch, dtype=np.float32, stream=stream)
        self._argmax_idx = cuda.device_array(scratch, dtype=np.int32, stream=stream)
        self.out_hosts = [cuda.pinned_array(max_rows, dtype=np.int32) for _ in range(2)]
        self.out_events = [cuda.event() for _ in range(2)]
        self._next_out = 0  # the pinned buffer the next fetch copies into
        self._banned = self._grow(None, 64)
        self._history = self._grow(None, 4096)
        self.has_history = False

    def _grow(self, buffer, size: int):
        if buffer is not None and buffer.shape[0] >= size:
            return buffer
        # Rare path (min_tokens bans, penalties): variable-length data, eager steps only.
        return cuda.device_array(
            max(size, 2 * (0 if buffer is None else buffer.shape[0])), np.int32
        )

    def stage(self, md: SamplingMetadata) -> None:
        """Write md's parameters into the pinned fields; copy bans and histories if any."""
        n = md.num_rows
        if n > self.max_rows:
            raise ValueError(f"{n} rows to sample, the sampler holds {self.max_rows}")
        f = self.staging.host["fparams"]
        f[k.F_TEMPERATURE, :n] = md.temperature
        f[k.F_TOP_P, :n] = md.top_p
        f[k.F_MIN_P, :n] = md.min_p
        f[k.F_REPETITION, :n] = md.repetition_penalty
        f[k.F_PRESENCE, :n] = md.presence_penalty
        f[k.F_FREQUENCY, :n] = md.frequency_penalty
        u = self.staging.host["uparams"]
        u[k.U_SEED, :n] = md.seed
        u[k.U_STEP, :n] = md.step
        i = self.staging.host["iparams"]
        i[k.I_TOP_K, :n] = md.top_k
        i[k.I_BANNED, : n + 1] = 0
        i[k.I_HISTORY, : n + 1] = 0
        i[k.I_PROMPT_LEN, :n] = 0
        if md.banned_token_ids is not None:
            lengths = [len(b) for b in md.banned_token_ids]
            i[k.I_BANNED, 1 : n + 1] = np.cumsum(lengths)
            flat = np.fromiter(
                (t for b in md.banned_token_ids for t in b), np.int32, count=sum(lengths)
            )
            if flat.size:
                self._banned = self._grow(self._banned, flat.size)
                self._banned[: flat.size].copy_to_device(flat, stream=self.stream)
        self.has_history = md.has_penalties
        if md.has_penalties:
            rows = [
                np.concatenate([p, o]).astype(np.int32)
                for p, o in zip(md.prompt_token_ids, md.output_token_ids, strict=True)
            ]
            i[k.I_HISTORY, 1 : n + 1] = np.cumsum([len(r) for r in rows])
            i[k.I_PROMPT_LEN, :n] = [len(p) for p in md.prompt_token_ids]
            flat = np.concatenate(rows) if rows else np.zeros(0, np.int32)
            if flat.size:
                self._history = self._grow(self._history, flat.size)
                self._history[: flat.size].copy_to_device(flat, stream=self.stream)

    def pad(self, n: int, rows: int) -> None:
        """Rows n..rows-1 of a padded (graph) step: greedy, nothing banned, no history."""
        f = self.staging.host["fparams"]
        f[:, n:rows] = 0.0
        f[k.F_TOP_P, n:rows] = 1.0
        f[k.F_REPETITION, n:rows] = 1.0
        u = self.staging.host["uparams"]
        u[:, n:rows] = 0
        i = self.staging.host["iparams"]
        i[k.I_TOP_K, n:rows] = 0
        i[k.I_PROMPT_LEN, n:rows] = 0
        if n == 0:
            i[k.I_BANNED, 0] = i[k.I_HISTORY, 0] = 0
        i[k.I_BANNED, n + 1 : rows + 1] = i[k.I_BANNED, n]
        i[k.I_HISTORY, n + 1 : rows + 1] = i[k.I_HISTORY, n]

    def launch(self, logits) -> None:
        """Sample every row of logits [n, V] into self.out[:n] (on the stream, no sync)."""
        n = logits.shape[0]
        d = self.staging.device
        if self.has_history:
            k.penalty_counts(self._history, d["iparams"], self.counts, n, self.stream)
        k.sample(
            logits, d["fparams"], d["iparams"], d["uparams"], self._banned, self.counts,
            self.out[:n], self.stream,
        )  # fmt: skip

    def launch_greedy(self, logits) -> None:
        """Every row greedy, nothing banned, no penalties: a two-stage argmax over many blocks
        (the general kernel gives each row one block, 40 us for a 128k vocabulary)."""
        n = logits.shape[0]
        argmax_rows(logits, self.out[:n], self._argmax_val, self._argmax_idx, self.stream)

    def fetch_async(self, n: int) -> DeviceResult:
        """Enqueue the copy of the n sampled ids into the next pinned buffer, and an event."""
        i = self._next_out
        self._next_out = 1 - i
        host, event = self.out_hosts[i], self.out_events[i]
        if n:
            self.out[:n].copy_to_host(host[:n], stream=self.stream)
        event.record(self.stream)
        return DeviceResult(host, n, event)

    def fetch(self, n: int) -> np.ndarray:
        """Copy the n sampled ids back and wait for them: the step's only synchronisation."""
        return self.fetch_async(n).result()

    def sample(self, logits, md: SamplingMetadata) -> np.ndarray:
        """Stage, copy, sample and fetch: the whole job for a sampler with its own staging."""
        self.stage(md)
        if self.own_staging:
            self.staging.upload()
        self.launch(logits)
        return self.fetch(md.num_rows)
