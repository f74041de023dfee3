"""Finding models: tinychat's cache dir, the local Hugging Face cache, paths and names."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import platformdirs
import pytest

from weights import ModelLoadError, resolve_model, tinychat_home
from weights.atomic import MARKER
from weights.gguf_convert import CONVERTER_VERSION
from weights.paths import hf_hub_cache, hf_snapshot


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("HF_HUB_CACHE", "HF_HOME", "TINYCHAT_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def test_tinychat_home_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TINYCHAT_HOME", str(tmp_path / "th"))
    assert tinychat_home() == tmp_path / "th"


def test_tinychat_home_default_is_the_user_cache_dir() -> None:
    assert tinychat_home() == Path(platformdirs.user_cache_dir("tinychat"))


def fake_snapshot(hub: Path, repo: str, commit: str, mtime: float | None = None) -> Path:
    snap = hub / ("models--" + repo.replace("/", "--")) / "snapshots" / commit
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    if mtime is not None:
        os.utime(snap, (mtime, mtime))
    return snap


def test_hub_cache_location(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert hf_hub_cache() == tmp_path / "home" / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hfhome"))
    assert hf_hub_cache() == tmp_path / "hfhome" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hubcache"))
    assert hf_hub_cache() == tmp_path / "hubcache"


def test_repo_id_in_default_hub_cache(tmp_path: Path) -> None:
    hub = tmp_path / "home" / ".cache" / "huggingface" / "hub"
    snap = fake_snapshot(hub, "meta-llama/Llama-3.2-1B-Instruct", "abc")
    assert resolve_model("meta-llama/Llama-3.2-1B-Instruct") == snap


def test_repo_id_with_hf_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    snap = fake_snapshot(tmp_path / "hf" / "hub", "org/model", "c1")
    assert resolve_model("org/model") == snap


def test_refs_main_picks_the_revision(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    now = time.time()
    old = fake_snapshot(tmp_path / "hub", "org/model", "old", mtime=now - 100)
    new = fake_snapshot(tmp_path / "hub", "org/model", "new", mtime=now)
    assert hf_snapshot("org/model") == new  # no ref: the newest
    refs = tmp_path / "hub" / "models--org--model" / "refs"
    refs.mkdir()
    (refs / "main").write_text("old\n")
    assert resolve_model("org/model") == old
    (refs / "main").write_text("gone")  # a ref to a snapshot that is not there
    assert resolve_model("org/model") == new


def test_repo_not_cached_says_where_it_looked(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ModelLoadError) as info:
        resolve_model("meta-llama/Llama-3.2-1B-Instruct")
    message = str(info.value)
    assert str(tmp_path / "hub" / "models--meta-llama--Llama-3.2-1B-Instruct") in message
    assert "huggingface-cli download meta-llama/Llama-3.2-1B-Instruct" in message
    assert "\n" not in message


def test_existing_folder_and_file(tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    assert resolve_model(str(folder)) == folder
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ModelLoadError, match="is a file"):
        resolve_model(str(tmp_path / "notes.txt"))


def test_unknown_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINYCHAT_HOME", str(tmp_path / "th"))
    with pytest.raises(ModelLoadError, match="no such folder or .gguf file"):
        resolve_model("/definitely/not/here")
    with pytest.raises(ModelLoadError, match="no model of that name"):
        resolve_model("not-a-model")


def test_name_of_a_converted_model_in_the_cache(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TINYCHAT_HOME", str(tmp_path / "th"))
    folder = tmp_path / "th" / "models" / "my-gguf"
    folder.mkdir(parents=True)
    with pytest.raises(ModelLoadError):  # no marker: an unfinished folder is not a model
        resolve_model("my-gguf")
    marker = {"name": "my-gguf", "converter_version": CONVERTER_VERSION}
    (folder / MARKER).write_text(json.dumps(marker))
    assert resolve_model("my-gguf") == folder
