"""Reading safetensors ourselves: round trips in BF16/F16/F32, single and sharded files, and
every way a checkpoint can be broken (each a one-line ModelLoadError naming the file)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from weights import ModelLoadError, Tensor, load_checkpoint, save_tensors
from weights.safetensors_format import read_header


def sample_tensors(dtype: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        "a.weight": rng.standard_normal((5, 7)).astype(np.float32),
        "b.bias": rng.standard_normal(3).astype(np.float32),
        "c.scalar": np.array(2.5, dtype=np.float32),
        "d.empty": np.zeros((0, 4), dtype=np.float32),
    }


def write(path: Path, values: dict[str, np.ndarray], dtype: str) -> None:
    save_tensors(path, [Tensor.from_float32(k, v, dtype) for k, v in values.items()])


@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
def test_single_file_round_trip(tmp_path: Path, dtype: str) -> None:
    values = sample_tensors(dtype)
    write(tmp_path / "model.safetensors", values, dtype)
    tensors = load_checkpoint(tmp_path)
    assert set(tensors) == set(values)
    for name, want in values.items():
        t = tensors[name]
        assert t.name == name and t.dtype == dtype and t.shape == want.shape
        tolerance = {"BF16": 2**-8, "F16": 2**-11, "F32": 0}[dtype]
        np.testing.assert_allclose(t.float32(), want, rtol=tolerance, atol=1e-30)
        assert t.float32().dtype == np.float32
        bits = t.bf16_bits()
        assert bits.dtype == np.uint16 and bits.shape == want.shape


def test_bf16_is_kept_raw_and_memory_mapped(tmp_path: Path) -> None:
    write(tmp_path / "model.safetensors", sample_tensors("BF16"), "BF16")
    t = load_checkpoint(tmp_path)["a.weight"]
    assert t.data.dtype == np.uint16
    assert isinstance(t.data.base, np.memmap) or isinstance(t.data, np.memmap)
    assert not t.data.flags.writeable  # a read-only view of the file, not a copy
    assert t.bf16_bits() is t.data


def test_written_file_is_readable_by_the_safetensors_package(tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    values = sample_tensors("F32")
    write(tmp_path / "model.safetensors", values, "F32")
    loaded = load_file(tmp_path / "model.safetensors")
    for name, want in values.items():
        np.testing.assert_array_equal(loaded[name], want)


def test_reads_files_written_by_the_safetensors_package(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    a = np.arange(12, dtype=np.float16).reshape(3, 4)
    save_file({"x": a, "y": a.astype(np.float32)}, tmp_path / "model.safetensors")
    tensors = load_checkpoint(tmp_path)
    np.testing.assert_array_equal(tensors["x"].data, a)
    assert tensors["y"].dtype == "F32"


def write_sharded(folder: Path, dtype: str = "BF16") -> dict[str, np.ndarray]:
    values = sample_tensors(dtype)
    names = list(values)
    shards = {
        "model-00001-of-00002.safetensors": names[:2],
        "model-00002-of-00002.safetensors": names[2:],
    }
    weight_map = {}
    for shard, shard_names in shards.items():
        write(folder / shard, {n: values[n] for n in shard_names}, dtype)
        weight_map.update({n: shard for n in shard_names})
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map})
    )
    return values


def test_sharded_round_trip(tmp_path: Path) -> None:
    values = write_sharded(tmp_path)
    tensors = load_checkpoint(tmp_path)
    assert set(tensors) == set(values)
    np.testing.assert_allclose(tensors["c.scalar"].float32(), 2.5)


def test_missing_shard(tmp_path: Path) -> None:
    write_sharded(tmp_path)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="model-00002-of-00002.safetensors: shard listed"):
        load_checkpoint(tmp_path)


def test_tensor_missing_from_its_shard(tmp_path: Path) -> None:
    write_sharded(tmp_path)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    index["weight_map"]["ghost.weight"] = "model-00001-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match="'ghost.weight' listed in .* is not in it"):
        load_checkpoint(tmp_path)


def test_bad_index(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(ModelLoadError, match="no weight_map"):
        load_checkpoint(tmp_path)


def test_no_checkpoint_at_all(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="no model.safetensors"):
        load_checkpoint(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(ModelLoadError, match="pytorch_model.bin: PyTorch pickles"):
        load_checkpoint(tmp_path)
    with pytest.raises(ModelLoadError, match="no such model folder"):
        load_checkpoint(tmp_path / "nope")


@pytest.mark.parametrize("keep", [0, 5, 8, 20, -1])
def test_truncated_file(tmp_path: Path, keep: int) -> None:
    path = tmp_path / "model.safetensors"
    write(path, sample_tensors("F32"), "F32")
    data = path.read_bytes()
    path.write_bytes(data[:keep] if keep >= 0 else data[:-3])
    with pytest.raises(ModelLoadError, match=r"truncated") as info:
        load_checkpoint(tmp_path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_corrupt_header_json(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    header = b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]'  # no closing brace
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    with pytest.raises(ModelLoadError, match="header is not valid JSON"):
        load_checkpoint(tmp_path)


def test_garbage_file(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ModelLoadError, match="corrupt or truncated"):
        load_checkpoint(tmp_path)


def raw_file(path: Path, header: dict, data: bytes) -> None:
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


def test_offsets_that_do_not_match_the_shape(tmp_path: Path) -> None:
    raw_file(
        tmp_path / "model.safetensors",
        {"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}},
        b"\0" * 16,
    )
    with pytest.raises(ModelLoadError, match="does not match its byte range"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("dtype", ["F64", "I8", "F8_E4M3", "U8"])
def test_unsupported_dtype(tmp_path: Path, dtype: str) -> None:
    raw_file(
        tmp_path / "model.safetensors",
        {"a": {"dtype": dtype, "shape": [1], "data_offsets": [0, 8]}},
        b"\0" * 8,
    )
    with pytest.raises(ModelLoadError, match=f"unsupported dtype {dtype}"):
        load_checkpoint(tmp_path)


def test_header_lists_metadata_and_alignment(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    write(path, {"odd": np.ones(3, np.float32)}, "BF16")
    (header_len,) = struct.unpack("<Q", path.read_bytes()[:8])
    assert (8 + header_len) % 8 == 0
    header = json.loads(path.read_bytes()[8 : 8 + header_len])
    assert header["__metadata__"] == {"format": "pt"}
    assert read_header(path)["odd"].shape == (3,)
