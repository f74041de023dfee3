"""`resolve_model`: from what the user typed after --model to a model folder on disk.

In order:
  * nothing            -> the default model (downloaded and converted on first use);
  * an existing folder -> that folder;
  * a .gguf file       -> converted once into tinychat's cache, then that folder;
  * a name of a model in tinychat's cache (`tinychat_home()/models/<name>`);
  * "ORG/NAME"         -> the local Hugging Face cache (never the network).
"""

from __future__ import annotations

import re
from pathlib import Path

from .default_model import DEFAULT_MODEL_NAME, is_current, pull_default_model
from .errors import ModelLoadError, ProgressFn, fail
from .gguf_convert import convert_gguf
from .paths import hf_repo_folder, hf_snapshot, models_dir

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_model(name: str | None, progress: ProgressFn | None = None) -> Path:
    """The folder of model `name` (see the module doc for the lookup order)."""
    if name is None or name == DEFAULT_MODEL_NAME:
        return pull_default_model(progress)
    path = Path(name).expanduser()
    if path.is_dir():
        return path.absolute()
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return gguf_into_cache(path, progress)
        raise fail(path, "is a file; pass a model folder (with config.json) or a .gguf file")
    if "/" not in name and "\\" not in name and is_current(models_dir() / name):
        return models_dir() / name
    if _REPO_ID.match(name):
        snapshot = hf_snapshot(name)
        if snapshot is not None:
            return snapshot
        raise ModelLoadError(
            f"model {name!r} is not a folder and not in the Hugging Face cache (looked in "
            f"{hf_repo_folder(name)}); download it first (huggingface-cli download {name}), "
            "set HF_HOME or HF_HUB_CACHE to where it is, or pass its folder path"
        )
    raise ModelLoadError(
        f"model {name!r}: no such folder or .gguf file, and no model of that name in {models_dir()}"
    )


def gguf_into_cache(path: Path, progress: ProgressFn | None = None) -> Path:
    """Convert a .gguf into `models_dir()/<file stem>` unless that is already done."""
    dest = models_dir() / path.stem
    source = f"{path.resolve()}:{path.stat().st_size}"
    if not is_current(dest, source):
        convert_gguf(path, dest, progress, name=path.stem, source=source)
    return dest
