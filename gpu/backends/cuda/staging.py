"""Pinned host staging with a device twin: one copy per step carries all of a step's inputs.

A step's inputs (token ids, positions, slots, sequence metadata, block table, sampling
parameters) are small, and each separate host-to-device copy costs a driver call and some
Python. So they share one layout: a pinned host buffer and a device buffer of the same size,
cut into named fields at fixed byte offsets. The runner's arrays are written into the pinned
views, and one asynchronous copy of the used prefix moves them all. The device views never
move, so kernels (and a captured CUDA graph) always read the same addresses; only their
contents change. The last field is the only one whose used length varies (the block table),
so the copy stops where it ends.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

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

    def upload(self, nbytes: int | None = None) -> None:
        """Copy the first nbytes (default: all) of the pinned buffer to the device, async."""
        n = self.nbytes if nbytes is None else -(-nbytes // ALIGN) * ALIGN
        n = min(n, self.nbytes)
        self.device_bytes[:n].copy_to_device(self.host_bytes[:n], stream=self.stream)
