"""Pinned host staging with a device twin: one copy per step carries all of a step's inputs.

A step's inputs (token ids, positions, slots, sequence metadata, block table, sampling
parameters) are small, and each separate host-to-device copy costs a driver call and some
Python. So they share one layout: a pinned host buffer and a device buffer of the same size,
cut into named fields at fixed byte offsets. The runner's arrays are written into the pinned
views, and one asynchronous copy of the used prefix moves them all. The device views never
move, so kernels (and a captured CUDA graph) always read the same addresses; only their
contents change. The last field is the only one whose used length varies (the block table),
so the copy stops where it ends.

OverlappedStaging (decode steps) moves the copy off the step's critical path. A host-to-device
copy queued between two graphs delays the second by 10-12 us whatever its size (2 KB to 128 KB,
`tests/device/bench_graph_gap.py` on the H200), while a device-to-device copy
that is the graph's own first node costs ~2 us. So the host's copy goes, on a second stream,
into a side buffer while the step before is still running, and the step's graph begins by
copying the side buffer into the fixed buffers its kernels read. Two events keep the side
buffer safe: the copy waits until the previous step's graph has taken its inputs (`consumed`,
recorded by the graph itself right after its copy node: an external event record node), and
the step waits until the copy has landed (`uploaded`).
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from gpu.kernels.launch import SIMULATOR

if not SIMULATOR:
    from cuda.bindings import driver as drv

ALIGN = 16


class Staging:
    def __init__(self, fields: list[tuple[str, type, tuple[int, ...]]], stream) -> None:
        """fields: (name, numpy dtype, shape), laid out in this order."""
        self.stream = stream
        self.offsets: dict[str, int] = {}
        offset = 0
        for name, dtype, shape in fields:
            offset = -(-offset // ALIGN) * ALIGN
            self.offsets[name] = offset
            offset += np.dtype(dtype).itemsize * math.prod(shape)
        self.nbytes = -(-offset // ALIGN) * ALIGN
        self.host_bytes = cuda.pinned_array(self.nbytes, dtype=np.uint8)
        self.host_bytes[:] = 0
        self.device_bytes = cuda.to_device(self.host_bytes, stream=stream)
        self.host: dict[str, np.ndarray] = {}
        self.device: dict[str, object] = {}
        for name, dtype, shape in fields:
            start = self.offsets[name]
            size = np.dtype(dtype).itemsize * math.prod(shape)
            self.host[name] = self.host_bytes[start : start + size].view(dtype).reshape(shape)
            self.device[name] = self.device_bytes[start : start + size].view(dtype).reshape(shape)

    def end_of(self, name: str, num_elements: int) -> int:
        """The byte offset just past the first num_elements of field `name`."""
        return self.offsets[name] + self.host[name].dtype.itemsize * num_elements

    def _padded(self, nbytes: int | None) -> int:
        n = self.nbytes if nbytes is None else -(-nbytes // ALIGN) * ALIGN
        return min(n, self.nbytes)

    def upload(self, nbytes: int | None = None):
        """Copy the first nbytes (default: all) of the pinned buffer to the device, async;
        returns the stream the copy was queued on (an event recorded there passes once the
        pinned buffer may be rewritten)."""
        n = self._padded(nbytes)
        self.device_bytes[:n].copy_to_device(self.host_bytes[:n], stream=self.stream)
        return self.stream


def _raw_event():
    flags = drv.CUevent_flags.CU_EVENT_DISABLE_TIMING
    err, event = drv.cuEventCreate(flags)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuEventCreate failed: {err}")
    return event


class OverlappedStaging(Staging):
    """A Staging whose upload overlaps the step before (see the module docstring): upload()
    fills a side buffer on a second stream, and take(), the first thing a step does on the
    main stream (inside its graph), copies the side buffer into the fixed device buffers."""

    def __init__(self, fields: list[tuple[str, type, tuple[int, ...]]], stream) -> None:
        super().__init__(fields, stream)
        self.side_bytes = cuda.to_device(self.host_bytes, stream=stream)
        if SIMULATOR:  # one thread of Python: a second stream would change nothing
            self.copy_stream = stream
            return
        self.copy_stream = cuda.stream()
        self._main = drv.CUstream(int(stream.handle))
        self._copy = drv.CUstream(int(self.copy_stream.handle))
        self._consumed = _raw_event()
        self._uploaded = _raw_event()

    def upload(self, nbytes: int | None = None):
        n = self._padded(nbytes)
        if SIMULATOR:
            self.side_bytes[:n].copy_to_device(self.host_bytes[:n], stream=self.stream)
            return self.stream
        _ok(drv.cuStreamWaitEvent(self._copy, self._consumed, 0))
        self.side_bytes[:n].copy_to_device(self.host_bytes[:n], stream=self.copy_stream)
        _ok(drv.cuEventRecord(self._uploaded, self._copy))
        _ok(drv.cuStreamWaitEvent(self._main, self._uploaded, 0))
        return self.copy_stream

    def take(self, nbytes: int) -> None:
        """On the main stream: copy the first nbytes of the side buffer into the device buffers,
        then mark the side buffer free for the next upload (a graph captures both as nodes)."""
        n = self._padded(nbytes)
        self.device_bytes[:n].copy_to_device(self.side_bytes[:n], stream=self.stream)
        if SIMULATOR:
            return
        err, status = drv.cuStreamIsCapturing(self._main)
        _ok(err)
        if status == drv.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE:
            # A node of the graph: the event is recorded each time the graph replays. (The
            # external flag is refused outside a capture, where a plain record does the same.)
            external = drv.CUevent_record_flags.CU_EVENT_RECORD_EXTERNAL
            _ok(drv.cuEventRecordWithFlags(self._consumed, self._main, external))
        else:
            _ok(drv.cuEventRecord(self._consumed, self._main))


def _ok(result) -> None:
    err = result[0] if isinstance(result, tuple) else result
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA call failed: {err}")
