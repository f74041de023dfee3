"""The quantized weights cache (weights/quant_cache.py, CpuQuantBackend.use_weight_cache): a
load quantizes once and writes the file; the next load reads it and gives the same logits
without quantizing; a stale or corrupt file is rebuilt with a warning; a read-only model folder
puts the file under $TINYCHAT_HOME and never fails the load."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest

from gpu import EngineConfig, SamplingParams
from gpu.backends.cpu_quant import QuantizedMatrix
from gpu.loader import create_engine
from weights import ModelConfig, write_random_model
from weights.quant_cache import cache_paths

TINY = ModelConfig(
    model_type="llama", vocab_size=300, hidden_size=32, intermediate_size=48,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
    rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None, max_position_embeddings=256,
    tie_word_embeddings=True, bos_token_id=None, eos_token_ids=(258,), torch_dtype="bfloat16",
)  # fmt: skip


@pytest.fixture
def home(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("TINYCHAT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _tokens(folder: Path, precision: str) -> list[int]:
    engine = create_engine(
        str(folder), "cpu", EngineConfig(max_num_seqs=2, num_kv_blocks=16, precision=precision)
    )
    out = engine.add_request([5, 9, 2, 7], SamplingParams(temperature=0, max_tokens=6))
    tokens: list[int] = []
    while engine.has_unfinished_requests():
        for o in engine.step():
            if o.request_id == out and o.finished:
                tokens = list(o.outputs[0].token_ids)
    return tokens


def _count_quantizations(monkeypatch) -> list[int]:
    calls: list[int] = []
    original = QuantizedMatrix.quantize.__func__

    def counted(cls, w, fmt):
        calls.append(1)
        return original(cls, w, fmt)

    monkeypatch.setattr(QuantizedMatrix, "quantize", classmethod(counted))
    return calls


@pytest.mark.parametrize("precision", ["q8", "q4"])
def test_second_load_reads_the_cache(tmp_path, home, monkeypatch, precision):
    folder = write_random_model(tmp_path / "m", TINY, seed=1)
    calls = _count_quantizations(monkeypatch)
    first = _tokens(folder, precision)
    beside = cache_paths(folder, precision)[0]
    assert beside.is_file() and len(calls) == 4 * TINY.num_hidden_layers + 1  # + the tied embed
    calls.clear()
    assert _tokens(folder, precision) == first
    assert calls == []  # read back, not quantized again


def test_stale_and_corrupt_files_are_rebuilt(tmp_path, home, monkeypatch, caplog):
    folder = write_random_model(tmp_path / "m", TINY, seed=1)
    first = _tokens(folder, "q8")
    path = cache_paths(folder, "q8")[0]
    calls = _count_quantizations(monkeypatch)

    path.write_bytes(b"not a zip file")
    with caplog.at_level(logging.WARNING):
        assert _tokens(folder, "q8") == first
    assert "unreadable" in caplog.text and calls
    assert np.load(path)["key"]  # rewritten whole

    calls.clear()
    caplog.clear()
    st = (folder / "model.safetensors").stat()
    os.utime(folder / "model.safetensors", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with caplog.at_level(logging.WARNING):
        assert _tokens(folder, "q8") == first
    assert "stale" in caplog.text and calls


def test_hugging_face_snapshots_cache_under_home(tmp_path, home, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    folder = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "abc"
    (only,) = cache_paths(folder, "q8")
    assert only.is_relative_to(home)


def test_read_only_folder_caches_under_home(tmp_path, home, monkeypatch):
    if os.geteuid() == 0:  # root writes through a read-only mode bit: make the write fail
        import weights.quant_cache as qc

        real = qc.tempfile.mkstemp

        def refuse_beside_model(*args, dir=None, **kwargs):
            if Path(dir) == folder:
                raise PermissionError(13, "read-only")
            return real(*args, dir=dir, **kwargs)

        monkeypatch.setattr(qc.tempfile, "mkstemp", refuse_beside_model)
    folder = write_random_model(tmp_path / "m", TINY, seed=1)
    folder.chmod(0o555)
    try:
        first = _tokens(folder, "q8")
        beside, in_home = cache_paths(folder, "q8")
        assert not beside.exists() and in_home.is_file() and in_home.is_relative_to(home)
        calls = _count_quantizations(monkeypatch)
        assert _tokens(folder, "q8") == first and calls == []
    finally:
        folder.chmod(0o755)


def test_cache_files_are_read_member_by_member(tmp_path):
    """_read_npz gives what np.load gives for np.savez's files, and refuses a compressed one
    (which load_quantized then treats as unreadable)."""
    from weights.quant_cache import _read_npz

    arrays = {
        "key": np.array("the key"),
        "0.qs": np.arange(-60, 60, dtype=np.int8).reshape(8, 15),
        "0.d": np.linspace(0, 1, 8, dtype=np.float32),
        "0.shape": np.array([8, 15]),
    }
    np.savez(tmp_path / "c.npz", **arrays)
    got = _read_npz(tmp_path / "c.npz")
    assert got.keys() == arrays.keys()
    for name, a in arrays.items():
        assert got[name].dtype == a.dtype and np.array_equal(got[name], a)
    np.savez_compressed(tmp_path / "z.npz", **arrays)
    with pytest.raises(ValueError, match="stored"):
        _read_npz(tmp_path / "z.npz")
