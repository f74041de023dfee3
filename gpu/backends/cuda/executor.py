"""The CUDA executor: one step = copy the inputs in, run the forward and the sampler on the
stream, read the sampled ids back.

    host ForwardBatch + SamplingMetadata --(pinned staging, ONE async copy)--> device buffers
    -> model.forward (kernels + cuBLAS on one stream) -> sampler -> ids --(mapped)--> host

Everything the step touches on the device was allocated when the executor was built: the input
fields are sized for max_num_batched_tokens tokens, max_num_seqs sequences and a block table of
max_blocks_per_seq columns. The block table is copied packed, [num_seqs, width] with this step's
width, and its row stride travels as a one-element device array: kernels read
block_tables[b * stride[0] + j], so no launch depends on the width and a graph captured once
stays valid when sequences grow. A step allocates nothing and synchronises once, at the end,
to read the sampled ids. That is what lets graphs.py capture a step into a CUDA graph per
batch-size bucket.

Decode steps have their own, smaller staging, sized for max_num_seqs tokens: the copy moves the
used prefix of the layout, ~20 KB for one decode token, where the per-token fields of the
prefill staging (8,192 tokens) would make it ~130 KB. Their copy also overlaps the step before:
it goes to a side buffer on a second stream, and the decode graph's first node copies it into
place (OverlappedStaging, staging.py), because a copy queued between two graphs cost ~10 us of
waiting whatever its size.

Async scheduling: `launch` enqueues all of that and an event after the sampler, which stores the
ids straight into mapped host memory, and returns at once; `DeviceResult.result()` waits for the
event. The engine launches step N+1 before it reads step N's ids, so the host prepares N+1
while N runs. Two things then must not be overwritten too early: the pinned input staging (the
next launch waits for an event recorded after the previous upload, which the GPU passes as soon
as the copy has run) and the host's ids (two slots of a ring, alternating: see DeviceSampler).
Step N+1's tokens sampled by N never visit the host: prev_rows points the embedding at the
sampler's device output of step N, which N+1 reads before its own sampler overwrites it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import cuda

from gpu.backends.base import ForwardModel, ReadyResult
from gpu.backends.cuda.graphs import (
    CudaGraph,
    bucket_for,
    capture_buckets,
    pays_to_overlap,
    token_buckets,
)
from gpu.backends.cuda.sampler import DeviceResult, DeviceSampler, sampler_fields
from gpu.backends.cuda.staging import OverlappedStaging, Staging
from gpu.forward_batch import ForwardBatch
from gpu.kernels.launch import SIMULATOR
from gpu.sampling import SamplingMetadata

_NONE = np.zeros(0, dtype=np.int32)
# The prefill/mixed steps capture_all captures: a burst of up to 64 chat turns arriving
# together (64 x 32-token turns and their decode rows fit 2,560 tokens).
CAPTURE_MIXED_SEQS, CAPTURE_MIXED_TOKENS = 64, 2560


@dataclass
class DeviceForwardBatch(ForwardBatch):
    """A ForwardBatch whose arrays are device views; block_tables is flat, rows of
    block_table_stride[0] entries (a device scalar, so the stride is not baked into a graph)."""

    block_table_stride: Any = None


def batch_fields(max_tokens: int, max_seqs: int, max_blocks_per_seq: int) -> list:
    return [
        ("input_ids", np.int32, (max_tokens,)),
        ("positions", np.int32, (max_tokens,)),
        ("slot_mapping", np.int32, (max_tokens,)),
        ("query_start_loc", np.int32, (max_seqs + 1,)),
        ("seq_lens", np.int32, (max_seqs,)),
        ("logits_indices", np.int32, (max_seqs,)),
        ("prev_rows", np.int32, (max_tokens,)),  # -1: the token is input_ids[t]
        ("block_table_stride", np.int32, (1,)),
        ("block_tables", np.int32, (max_seqs * max_blocks_per_seq,)),  # last: variable length
    ]


class StepInputs:
    """The step's input buffers: pinned staging and their device twins, one copy per step."""

    def __init__(
        self, max_tokens: int, max_seqs: int, max_blocks_per_seq: int, stream, overlap=False
    ) -> None:
        """overlap: upload through an OverlappedStaging (decode graphs: see staging.py)."""
        self.max_tokens, self.max_seqs = max_tokens, max_seqs
        self.max_blocks_per_seq = max_blocks_per_seq
        fields = sampler_fields(max_seqs) + batch_fields(max_tokens, max_seqs, max_blocks_per_seq)
        self.staging = (OverlappedStaging if overlap else Staging)(fields, stream)
        self.sampled_prev = None  # the sampler's device output (set by the executor)

    def stage(self, batch: ForwardBatch) -> int:
        """Write the batch into the pinned fields; returns the bytes to copy."""
        t, s = batch.num_tokens, batch.num_seqs
        width = batch.block_tables.shape[1] if s else 0
        if t > self.max_tokens or s > self.max_seqs or width > self.max_blocks_per_seq:
            raise ValueError(
                f"step of {t} tokens, {s} sequences, {width} blocks per sequence exceeds the "
                f"buffers ({self.max_tokens}, {self.max_seqs}, {self.max_blocks_per_seq})"
            )
        h = self.staging.host
        h["input_ids"][:t] = batch.input_ids
        h["prev_rows"][:t] = -1 if batch.prev_rows is None else batch.prev_rows
        h["positions"][:t] = batch.positions
        h["slot_mapping"][:t] = batch.slot_mapping
        h["query_start_loc"][: s + 1] = batch.query_start_loc
        h["seq_lens"][:s] = batch.seq_lens
        n_logits = len(batch.logits_indices)
        h["logits_indices"][:n_logits] = batch.logits_indices
        h["block_table_stride"][0] = width
        h["block_tables"][: s * width] = np.asarray(batch.block_tables).reshape(-1)
        return self.staging.end_of("block_tables", s * width)

    def pad_decode(self, n: int, rows: int) -> None:
        """Rows n..rows-1 of a padded decode step: no KV write, an empty context."""
        h = self.staging.host
        h["input_ids"][n:rows] = 0
        h["prev_rows"][n:rows] = -1
        h["positions"][n:rows] = 0
        h["slot_mapping"][n:rows] = -1
        h["query_start_loc"][n + 1 : rows + 1] = np.arange(n + 1, rows + 1, dtype=np.int32)
        h["seq_lens"][n:rows] = 0
        h["logits_indices"][n:rows] = np.arange(n, rows, dtype=np.int32)

    def pad_mixed(self, t: int, s: int, n: int, tokens: int, seqs: int) -> None:
        """Pad a step of t tokens, s sequences and n sampled rows to a (tokens, seqs) bucket:
        padding tokens belong to no sequence (no KV write), padding sequences have no query
        rows and no context, padding logits rows read row 0."""
        h = self.staging.host
        h["input_ids"][t:tokens] = 0
        h["prev_rows"][t:tokens] = -1
        h["positions"][t:tokens] = 0
        h["slot_mapping"][t:tokens] = -1
        h["query_start_loc"][s + 1 : seqs + 1] = t
        h["seq_lens"][s:seqs] = 0
        h["logits_indices"][n:seqs] = 0

    def fixed_batch(self, tokens: int, seqs: int, max_query_len: int) -> DeviceForwardBatch:
        """The fixed device views of a graph bucket: a decode step (max_query_len 1) or a
        prefill/mixed step, where max_query_len is a bound, the bucket's token count (each
        sequence's rows come from query_start_loc)."""
        d = self.staging.device
        return DeviceForwardBatch(
            num_tokens=tokens,
            num_seqs=seqs,
            input_ids=d["input_ids"][:tokens],
            positions=d["positions"][:tokens],
            slot_mapping=d["slot_mapping"][:tokens],
            query_start_loc=d["query_start_loc"][: seqs + 1],
            seq_lens=d["seq_lens"][:seqs],
            block_tables=d["block_tables"],
            logits_indices=d["logits_indices"][:seqs],
            max_query_len=max_query_len,
            max_seq_len=0,  # not read by the kernels: shapes come from seq_lens
            prev_rows=d["prev_rows"][:tokens],
            sampled_prev=self.sampled_prev,
            block_table_stride=d["block_table_stride"],
        )

    def device_batch(self, batch: ForwardBatch) -> DeviceForwardBatch:
        """The same batch over the device views (sliced to this step's sizes)."""
        d = self.staging.device
        t, s = batch.num_tokens, batch.num_seqs
        return DeviceForwardBatch(
            num_tokens=t,
            num_seqs=s,
            input_ids=d["input_ids"][:t],
            positions=d["positions"][:t],
            slot_mapping=d["slot_mapping"][:t],
            query_start_loc=d["query_start_loc"][: s + 1],
            seq_lens=d["seq_lens"][:s],
            block_tables=d["block_tables"],
            logits_indices=d["logits_indices"][: len(batch.logits_indices)],
            max_query_len=batch.max_query_len,
            max_seq_len=batch.max_seq_len,
            prev_rows=d["prev_rows"][:t],
            sampled_prev=self.sampled_prev,
            block_table_stride=d["block_table_stride"],
        )


class CudaExecutor:
    """Runs steps on the GPU. Decode steps are padded to a batch-size bucket, prefill and mixed
    steps to a (tokens, sequences) bucket, and unless enforce_eager each bucket is replayed
    from a CUDA graph captured the first time it is used (gpu/backends/cuda/graphs.py), whatever
    their sampling settings: penalties and min_tokens bans read the sampler's token state on the
    device, and a step's state writes (its newly sampled sequences') are enqueued before its
    graph. A graph is keyed by whether every row is a plain argmax (md.all_greedy: the fast
    argmax path) or not.

    Eager steps are padded to the same buckets, so a graph replays exactly the launches (and
    cuBLAS algorithms) of the eager step it was captured from: same bits, same tokens.
    """

    def __init__(self, model: ForwardModel, backend: Any, config: Any = None) -> None:
        self.model = model
        self.backend = backend
        max_tokens = model.residual.shape[0]
        max_seqs, vocab = model.logits.shape
        block_size = model.kv_caches[0][0].shape[1]
        max_positions = model.cos.shape[0]
        max_blocks = -(-max_positions // block_size)
        self.inputs = StepInputs(max_tokens, max_seqs, max_blocks, backend.stream)
        self.decode_inputs = StepInputs(
            max_seqs, max_seqs, max_blocks, backend.stream, overlap=True
        )
        self.sampler = DeviceSampler(max_seqs, vocab, backend.stream, self.inputs.staging)
        self.inputs.sampled_prev = self.decode_inputs.sampled_prev = self.sampler.out
        # Recorded after each upload: the pinned staging may be rewritten once it has passed.
        self._uploaded = cuda.event()
        self._upload_pending = False
        backend.reserve_attention_scratch(
            max_seqs, model.num_heads, model.num_kv_heads, model.head_dim
        )
        backend.reserve_prefill_scratch(max_tokens, model.num_heads, model.head_dim)
        # The simulator has no driver to capture with: eager there (padding still exercised).
        # Debug mode synchronises after every op, which a capture cannot contain: eager too.
        self.enforce_eager = (
            SIMULATOR or backend.debug or bool(getattr(config, "enforce_eager", False))
        )
        self.buckets = capture_buckets(min(max_seqs, max_tokens))
        self.seq_buckets = capture_buckets(max_seqs)
        self.token_buckets = token_buckets(max_tokens)
        # ("decode", bucket, all greedy) or ("mixed", tokens, seqs, all greedy) -> graph
        self.graphs: dict[tuple, Any] = {}
        self._decode_batches: dict[int, DeviceForwardBatch] = {}
        self._mixed_batches: dict[tuple[int, int], DeviceForwardBatch] = {}
        self.capture_time_s = 0.0

    def execute(self, batch: ForwardBatch, metadata: SamplingMetadata) -> np.ndarray:
        """Run the step and wait for its sampled ids (the serial step)."""
        return self.launch(batch, metadata).result()

    def launch(self, batch: ForwardBatch, metadata: SamplingMetadata) -> DeviceResult | ReadyResult:
        """Enqueue the step (upload, forward, sampler) and return at once; the handle's result()
        waits for the ids. At most two results may be unread at a time (the two slots of the
        sampler's host ring): the engine reads step N's before launching N+2."""
        self._wait_for_upload()
        self.sampler.write_states(metadata)  # before the forward: the sampler reads the rows
        bucket = self._decode_bucket(batch, metadata)
        if bucket is not None:
            key = ("decode", bucket, metadata.all_greedy)
            return self._launch_padded(batch, metadata, key, bucket)
        mixed = self._mixed_bucket(batch, metadata)
        if mixed is not None:
            tokens, seqs = mixed
            key = ("mixed", tokens, seqs, metadata.all_greedy or metadata.num_rows == 0)
            return self._launch_padded(batch, metadata, key, seqs)
        nbytes = self.inputs.stage(batch)
        num_logits = metadata.num_rows
        if num_logits:
            self.sampler.stage(metadata)
        self._upload(self.inputs, nbytes)
        logits = self.model.forward(self.inputs.device_batch(batch), num_logits)
        if num_logits == 0:
            return ReadyResult(_NONE)
        self.sampler.launch(logits)
        self.backend.check("sample")
        return self.sampler.fetch_async(num_logits)

    def _upload(self, inputs: StepInputs, nbytes: int) -> None:
        copy_stream = inputs.staging.upload(nbytes)
        self._uploaded.record(copy_stream)
        self._upload_pending = True

    def _wait_for_upload(self) -> None:
        """Before a pinned staging is written again: the last copy (of either staging, in
        stream order) must have run (at the start of the previous step on the device, so this
        rarely waits)."""
        if self._upload_pending:
            self._uploaded.synchronize()
            self._upload_pending = False

    # --- decode: padded to a bucket, replayed from a graph --------------------------------
    def _decode_bucket(self, batch: ForwardBatch, md: SamplingMetadata) -> int | None:
        is_decode = batch.max_query_len == 1 and batch.num_tokens == batch.num_seqs
        if not is_decode or md.num_rows != batch.num_seqs or batch.num_seqs == 0:
            return None
        return bucket_for(batch.num_seqs, self.buckets)

    def _launch_padded(self, batch: ForwardBatch, md: SamplingMetadata, key: tuple, rows: int):
        """Stage the step, pad it to its bucket (`rows` sequences), replay (or run and
        capture) the bucket's graph, and return the handle of its sampled ids."""
        n = md.num_rows
        inputs = self._inputs_for(key)
        nbytes = inputs.stage(batch)
        if key[0] == "decode":
            inputs.pad_decode(n, rows)
        else:
            inputs.pad_mixed(batch.num_tokens, batch.num_seqs, n, key[1], rows)
        if n:
            self.sampler.stage(md, inputs.staging)
        self.sampler.pad(n, rows, inputs.staging)
        self._upload(inputs, nbytes)
        self._run(key)
        if n == 0:
            return ReadyResult(_NONE)
        return self.sampler.fetch_async(n)

    # --- prefill and mixed steps: padded to (tokens, seqs), replayed from a graph ---------
    def _mixed_bucket(self, batch: ForwardBatch, md: SamplingMetadata) -> tuple | None:
        if batch.num_seqs == 0:
            return None
        tokens = bucket_for(batch.num_tokens, self.token_buckets)
        seqs = bucket_for(batch.num_seqs, self.seq_buckets)
        if tokens is None or seqs is None:
            return None
        return tokens, seqs

    def _mixed_step(self, tokens: int, seqs: int, greedy: bool) -> None:
        key = (tokens, seqs)
        if key not in self._mixed_batches:
            self._mixed_batches[key] = self.inputs.fixed_batch(tokens, seqs, tokens)
        logits = self.model.forward(self._mixed_batches[key], seqs)
        if greedy:
            self.sampler.launch_greedy(logits, self.inputs.staging)
        else:
            self.sampler.launch(logits, self.inputs.staging)

    def _upload_padding(self, inputs: StepInputs, rows: int) -> None:
        """Copy an all-padding step (staged by pad_decode or pad_mixed from 0) to the device,
        for the warm-up run before a capture."""
        inputs.staging.host["query_start_loc"][0] = 0
        inputs.staging.host["block_table_stride"][0] = 0
        self.sampler.pad(0, rows, inputs.staging)
        self._upload(inputs, inputs.staging.end_of("block_tables", 0))

    # --- graphs -------------------------------------------------------------------------
    def _run(self, key: tuple) -> None:
        """Replay key's graph; the first time, run the step eagerly and capture it."""
        graph = self.graphs.get(key)
        if graph is not None:
            graph.replay()
            return
        step = self._step_fn(key)
        step()  # eager (also the warm-up before a capture)
        if not self.enforce_eager:
            t0 = time.perf_counter()
            # key[1]: the step's tokens (a decode bucket, or a mixed step's token bucket)
            overlap = pays_to_overlap(key[1])
            self.graphs[key] = CudaGraph(self.backend.stream, step, programmatic=overlap)
            self.capture_time_s += time.perf_counter() - t0

    def _inputs_for(self, key: tuple) -> StepInputs:
        """The staging a graph key's step reads: decode steps have their own (small) one."""
        return self.decode_inputs if key[0] == "decode" else self.inputs

    def _step_fn(self, key: tuple):
        if key[0] == "decode":
            return lambda: self._decode_step(*key[1:])
        return lambda: self._mixed_step(*key[1:])

    def _decode_step(self, bucket: int, greedy: bool) -> None:
        inputs = self.decode_inputs
        # The inputs of up to `bucket` sequences, from the side buffer the upload filled.
        width = inputs.max_blocks_per_seq
        inputs.staging.take(inputs.staging.end_of("block_tables", bucket * width))
        if bucket not in self._decode_batches:
            self._decode_batches[bucket] = inputs.fixed_batch(bucket, bucket, 1)
        logits = self.model.forward(self._decode_batches[bucket], bucket)
        staging = self.decode_inputs.staging
        if greedy:
            self.sampler.launch_greedy(logits, staging)
        else:
            self.sampler.launch(logits, staging)

    def replay_ms(self, num_seqs: int, reps: int = 50) -> float | None:
        """GPU milliseconds per replay of the greedy decode graph of num_seqs' bucket, replayed
        back to back on the last step's inputs (None before that graph exists). Beside the
        measured step time it shows the host's share of a step. Writes the KV of the last step's
        tokens again, so run it only when no sequence is live (the bench, between runs)."""
        bucket = bucket_for(num_seqs, self.buckets)
        graph = self.graphs.get(("decode", bucket, True))
        if graph is None:
            return None
        stream = self.backend.stream
        start, end = cuda.event(), cuda.event()
        graph.replay()  # warm
        start.record(stream)
        for _ in range(reps):
            graph.replay()
        end.record(stream)
        end.synchronize()
        return cuda.event_elapsed_time(start, end) / reps

    def capture_all(
        self, mixed_max_seqs: int = CAPTURE_MIXED_SEQS, mixed_max_tokens: int = CAPTURE_MIXED_TOKENS
    ) -> float:
        """Capture every decode bucket, and the prefill/mixed buckets of up to mixed_max_seqs
        sequences and mixed_max_tokens tokens, each with both samplers, now instead of lazily
        (EngineConfig.capture_graphs_at_start); returns the seconds it took.

        Each bucket runs once eagerly on an all-padding step (no KV write) to compile its
        kernels and settle cuBLAS, then is captured. Larger prefill/mixed buckets (a burst of
        more admissions, long prompts) are still captured the first time they are used."""
        t0 = time.perf_counter()
        for bucket in self.buckets:
            self._wait_for_upload()  # the pinned staging is rewritten each time
            self.decode_inputs.pad_decode(0, bucket)
            self._upload_padding(self.decode_inputs, bucket)
            for greedy in (True, False):
                self._run(("decode", bucket, greedy))
        for seqs in (b for b in self.seq_buckets if b <= mixed_max_seqs):
            for tokens in (t for t in self.token_buckets if seqs <= t <= mixed_max_tokens):
                self._wait_for_upload()
                self.inputs.pad_mixed(0, 0, 0, tokens, seqs)
                self._upload_padding(self.inputs, seqs)
                for greedy in (True, False):
                    self._run(("mixed", tokens, seqs, greedy))
        self.backend.synchronize()
        return time.perf_counter() - t0

    # --- precompile ---------------------------------------------------------------------
    def warm_up_steps(self):
        """Every step a reply can run, as (graph key, a callable that enqueues that step on the
        inputs staged last): each decode bucket, and each prefill/mixed (tokens, seqs) bucket
        a step can round up to (a step has at least one token per sequence), each with the
        all-greedy sampler and the general one."""
        keys = [("decode", b, greedy) for b in self.buckets for greedy in (True, False)]
        keys += [
            ("mixed", tokens, seqs, greedy)
            for tokens in self.token_buckets
            for seqs in self.seq_buckets
            if seqs <= tokens
            for greedy in (True, False)
        ]
        return [(key, self._step_fn(key)) for key in keys]

    def precompile(self, progress=None):
        """Compile (or load from the disk cache) every kernel of warm_up_steps now, before the
        engine reports ready, so that no reply waits for a compile (precompile.py); returns
        its PrecompileReport, also kept as `precompile_report` (None in the simulator, which
        compiles nothing). The steps run over the first layer alone: every layer launches the
        same kernels with the same argument types, and discovery costs Python time per launch."""
        self.precompile_report = None
        if not SIMULATOR:
            from gpu.backends.cuda.precompile import precompile

            weights = self.model.weights
            layers, weights.layers = weights.layers, weights.layers[:1]
            try:
                self.precompile_report = precompile(self.backend, self.warm_up_steps(), progress)
            finally:
                weights.layers = layers
        return self.precompile_report
