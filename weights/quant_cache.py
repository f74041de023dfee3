"""Quantized weights kept in a file beside the model they came from, so a load quantizes once.

The engine's CPU path quantizes every matrix at load; this module only stores and finds the
resulting arrays (it knows no format: the caller names the arrays and says which format and
layout version they are). A cache file is an uncompressed .npz with a `key` entry: the model's
files (name, size, modification time), the format and its version. It lives beside the model
(`.tinychat-quantized-<format>.npz`) or, where that folder cannot be written or is a snapshot in
the Hugging Face cache, under `$TINYCHAT_HOME/quantized/`. A stale or unreadable file is
rebuilt, with one warning; a cache that cannot be written anywhere costs only the next load's
quantization. Measured on the default model (2-core host): a q8 load took 0.33 s from the cache
against 0.52 s quantizing, a q4 load 0.31 against 1.1-1.35 s. The file is read member by
member straight into arrays (`_read_npz`), not through np.load, whose zip reader copies in
chunks and checks every member's CRC: the default model's q8 file (135 MB, 364 arrays) in
0.11-0.14 s against 0.20-0.30 s, and the whole q8 engine load 0.25 s against 0.36 s.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import struct
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from .paths import hf_hub_cache, tinychat_home

log = logging.getLogger(__name__)

# The files whose change makes a cache stale: the tensors and the config that shapes them.
_SOURCES = ("*.safetensors", "*.safetensors.index.json", "config.json")


def source_key(folder: Path, fmt: str, version: int) -> str:
    """What a cache file must have been made from: the model's files, the format, its version."""
    files = sorted({p for pattern in _SOURCES for p in folder.glob(pattern) if p.is_file()})
    stats = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    return json.dumps({"files": stats, "format": fmt, "version": version})


def cache_paths(folder: Path, fmt: str) -> list[Path]:
    """Where a cache file may be: beside the model, then under $TINYCHAT_HOME (only there for
    a snapshot in the Hugging Face cache, which is the hub library's to manage)."""
    digest = hashlib.sha256(str(folder.absolute()).encode()).hexdigest()[:16]
    in_home = tinychat_home() / "quantized" / f"{digest}-{fmt}.npz"
    if folder.absolute().is_relative_to(hf_hub_cache().absolute()):
        return [in_home]
    return [folder / f".tinychat-quantized-{fmt}.npz", in_home]


def load_quantized(folder: Path, fmt: str, version: int) -> dict[str, np.ndarray] | None:
    """The cached arrays made from this folder's current files in this format, or None."""
    key = source_key(folder, fmt, version)
    for path in cache_paths(folder, fmt):
        if not path.is_file():
            continue
        try:
            data = _read_npz(path)
            if str(data["key"]) != key:
                log.warning("%s is stale (the model's files changed): quantizing again", path)
                return None
            return {name: a for name, a in data.items() if name != "key"}
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
            log.warning("%s is unreadable (%s): quantizing again", path, e)
            return None
    return None


def save_quantized(
    folder: Path, fmt: str, version: int, arrays: dict[str, np.ndarray]
) -> Path | None:
    """Write the cache file (whole or not at all: a temporary file renamed into place) in the
    first place that takes it; None if none does."""
    key = np.array(source_key(folder, fmt, version))
    for path in cache_paths(folder, fmt):
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
            with os.fdopen(fd, "wb") as f:
                np.savez(f, key=key, **arrays)
            os.chmod(tmp, 0o644)  # as readable as the model's own files (mkstemp made it 0600)
            os.replace(tmp, path)
            return path
        except OSError:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
    return None


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an uncompressed .npz (np.savez's), each read from its offset in one call.
    A member that is compressed, holds objects or ends early raises ValueError."""
    arrays = {}
    with zipfile.ZipFile(path) as zf, path.open("rb") as f:
        for info in zf.infolist():
            if info.compress_type != zipfile.ZIP_STORED or not info.filename.endswith(".npy"):
                raise ValueError(f"{info.filename}: not a stored .npy member")
            f.seek(info.header_offset)
            local = f.read(30)  # the member's local header: its name and extra field follow
            if len(local) != 30 or local[:4] != b"PK\x03\x04":
                raise ValueError(f"{info.filename}: no local header")
            name_len, extra_len = struct.unpack("<HH", local[26:30])
            f.seek(info.header_offset + 30 + name_len + extra_len)
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"{info.filename}: .npy version {version}")
            if dtype.hasobject or fortran:
                raise ValueError(f"{info.filename}: not a plain C-ordered array")
            count = math.prod(shape)
            a = np.fromfile(f, dtype=dtype, count=count)
            if a.size != count:
                raise ValueError(f"{info.filename}: ends early")
            arrays[info.filename[:-4]] = a.reshape(shape)
    return arrays
