"""The safetensors file format, read and written with numpy alone.

A safetensors file is:

    8 bytes      little-endian u64 N, the length of the header
    N bytes      a JSON object: {name: {"dtype": "BF16", "shape": [rows, cols],
                 "data_offsets": [begin, end]}, ..., "__metadata__": {...}}
    the rest     the tensors' bytes, each at [8 + N + begin, 8 + N + end)

We parse it ourselves instead of using the `safetensors` package because its numpy API cannot
return bf16 (numpy has no such dtype) and its torch API would pull in torch. Reading memory-maps
the file: a tensor is a view into the page cache, nothing is copied until someone computes with
it, so opening a 2.5 GB checkpoint costs milliseconds.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .bf16 import bf16_bits_to_float32, float32_to_bf16_bits
from .errors import fail

# The dtypes a Llama checkpoint comes in, and how numpy holds their raw bytes.
NUMPY_DTYPES: dict[str, np.dtype] = {
    "BF16": np.dtype("<u2"),  # raw bits; see bf16.py
    "F16": np.dtype("<f2"),
    "F32": np.dtype("<f4"),
}
_MAX_HEADER = 100 * 1024 * 1024  # the reference implementation's limit
_ALIGN = 8  # data starts 8-byte aligned so views are aligned


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: file, dtype, shape and absolute byte range."""

    name: str
    path: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


@dataclass
class Tensor:
    """One named tensor: `data` is a raw, usually memory-mapped, view (uint16 bits for BF16)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    data: np.ndarray

    def float32(self) -> np.ndarray:
        """The values as float32 (a new array; exact for all three dtypes)."""
        if self.dtype == "BF16":
            return bf16_bits_to_float32(self.data)
        return self.data.astype(np.float32)

    def bf16_bits(self) -> np.ndarray:
        """The values as bf16 bits (uint16): BF16 as stored, F16/F32 rounded to nearest even."""
        if self.dtype == "BF16":
            return self.data
        return float32_to_bf16_bits(self.data)

    @classmethod
    def from_float32(cls, name: str, values: np.ndarray, dtype: str = "BF16") -> Tensor:
        """A tensor holding `values` stored as `dtype` (rounded when that is narrower)."""
        values = np.asarray(values, dtype=np.float32)
        if dtype == "BF16":
            data = float32_to_bf16_bits(values)
        elif dtype in NUMPY_DTYPES:
            data = values.astype(NUMPY_DTYPES[dtype])
        else:
            raise ValueError(f"unknown dtype {dtype!r}")
        return cls(name, dtype, tuple(values.shape), data)


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Parse and check a safetensors header: every tensor must fit inside the file."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise fail(path, f"truncated safetensors file ({size} bytes, no header)")
            (header_len,) = struct.unpack("<Q", prefix)
            if header_len > min(_MAX_HEADER, size - 8):
                raise fail(
                    path,
                    f"corrupt or truncated safetensors file (header of {header_len} "
                    f"bytes in a file of {size})",
                )
            raw = f.read(header_len)
    except OSError as exc:
        raise fail(path, f"cannot read ({exc.strerror or exc})") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise fail(path, "corrupt safetensors file (the header is not valid JSON)") from None
    if not isinstance(header, dict):
        raise fail(path, "corrupt safetensors file (the header is not a JSON object)")

    base = 8 + header_len
    infos: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = entry["dtype"]
            shape = tuple(int(d) for d in entry["shape"])
            begin, end = (int(x) for x in entry["data_offsets"])
        except (TypeError, KeyError, ValueError):
            raise fail(path, f"corrupt safetensors header entry for {name!r}") from None
        if dtype not in NUMPY_DTYPES:
            raise fail(
                path,
                f"tensor {name!r} has unsupported dtype {dtype} "
                f"(supported: {', '.join(NUMPY_DTYPES)})",
            )
        nbytes = math.prod(shape) * NUMPY_DTYPES[dtype].itemsize
        if begin < 0 or end - begin != nbytes or any(d < 0 for d in shape):
            raise fail(
                path,
                f"corrupt safetensors header: {name!r} {dtype}{list(shape)} "
                f"does not match its byte range [{begin}, {end})",
            )
        if base + end > size:
            raise fail(
                path,
                f"truncated safetensors file: tensor {name!r} ends at byte "
                f"{base + end} but the file has {size}",
            )
        infos[name] = TensorInfo(name, path, dtype, shape, base + begin, base + end)
    return infos


def map_tensors(infos: Iterable[TensorInfo]) -> dict[str, Tensor]:
    """Memory-map the files behind `infos` (once per file) and return zero-copy tensor views."""
    maps: dict[Path, np.memmap] = {}
    tensors: dict[str, Tensor] = {}
    for info in infos:
        if info.path not in maps:
            maps[info.path] = np.memmap(info.path, dtype=np.uint8, mode="r")
        raw = maps[info.path][info.start : info.end]
        data = raw.view(NUMPY_DTYPES[info.dtype]).reshape(info.shape)
        tensors[info.name] = Tensor(info.name, info.dtype, info.shape, data)
    return tensors


class SafetensorsWriter:
    """Streams tensors into a safetensors file whose header is fixed up front.

    Knowing every name, dtype and shape first lets us write the header, then each tensor as it is
    produced, so a converter never holds more than one dequantized tensor in memory.
    """

    def __init__(
        self,
        path: Path,
        specs: Iterable[tuple[str, str, tuple[int, ...]]],
        metadata: dict[str, str] | None = None,
    ) -> None:
        header: dict[str, object] = {"__metadata__": {"format": "pt", **(metadata or {})}}
        self._order: list[tuple[str, str, tuple[int, ...]]] = []
        offset = 0
        for name, dtype, shape in specs:
            nbytes = math.prod(shape) * NUMPY_DTYPES[dtype].itemsize
            header[name] = {
                "dtype": dtype,
                "shape": list(shape),
                "data_offsets": [offset, offset + nbytes],
            }
            self._order.append((name, dtype, tuple(shape)))
            offset += nbytes
        blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
        blob += b" " * (-(8 + len(blob)) % _ALIGN)  # pad with spaces, as the reference does
        self._file = path.open("wb")
        self._file.write(struct.pack("<Q", len(blob)) + blob)
        self._next = 0

    def write(self, name: str, data: np.ndarray) -> None:
        """Write the next tensor (in the order given to the constructor), raw bytes as given."""
        want_name, dtype, shape = self._order[self._next]
        if name != want_name or tuple(data.shape) != shape or data.dtype != NUMPY_DTYPES[dtype]:
            raise ValueError(
                f"expected {want_name} {dtype}{list(shape)}, got {name} "
                f"{data.dtype}{list(data.shape)}"
            )
        self._file.write(np.ascontiguousarray(data).data)
        self._next += 1

    def close(self) -> None:
        """Finish the file; complains if a tensor was never written."""
        self._file.close()
        if self._next != len(self._order):
            raise ValueError(f"only {self._next} of {len(self._order)} tensors were written")

    def __enter__(self) -> SafetensorsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            self._file.close()


def save_tensors(
    path: Path, tensors: Iterable[Tensor], metadata: dict[str, str] | None = None
) -> None:
    """Write whole tensors to one safetensors file (each keeps its dtype)."""
    tensors = list(tensors)
    with SafetensorsWriter(path, [(t.name, t.dtype, t.shape) for t in tensors], metadata) as w:
        for t in tensors:
            w.write(t.name, np.asarray(t.data, dtype=NUMPY_DTYPES[t.dtype]))
