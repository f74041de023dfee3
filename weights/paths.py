"""Where models live on disk: tinychat's own cache and the Hugging Face hub cache.

tinychat keeps the models it makes (the converted default model, converted GGUFs) under
`tinychat_home()/models/<name>`. Models downloaded by Hugging Face tools are found where those
tools put them, `<hub cache>/models--ORG--NAME/snapshots/<commit>/`, without any network access:
`refs/main` names the commit a plain `from_pretrained("ORG/NAME")` would use.
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"  # the model tinychat fetches and converts itself
REPAIR_HINT = "run `tinychat pull` to fetch and convert the default model again"


def tinychat_home() -> Path:
    """`$TINYCHAT_HOME`, else the user's cache dir for tinychat (e.g. ~/.cache/tinychat)."""
    env = os.environ.get("TINYCHAT_HOME")
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_cache_dir("tinychat"))


def models_dir() -> Path:
    """The folder holding tinychat's converted models, one sub-folder per model."""
    return tinychat_home() / "models"


def is_default_model(folder: Path) -> bool:
    """True if `folder` is the default model's folder in tinychat's cache."""
    try:
        return folder.resolve() == (models_dir() / DEFAULT_MODEL_NAME).resolve()
    except OSError:
        return False


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache: `$HF_HUB_CACHE`, `$HF_HOME/hub`, or ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path("~/.cache/huggingface/hub").expanduser()


def hf_repo_folder(repo_id: str) -> Path:
    """`models--ORG--NAME` inside the hub cache for repo id "ORG/NAME"."""
    return hf_hub_cache() / ("models--" + repo_id.replace("/", "--"))


def hf_snapshot(repo_id: str) -> Path | None:
    """The snapshot folder for a cached repo (refs/main's commit, else the newest), or None."""
    repo = hf_repo_folder(repo_id)
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = repo / "refs" / "main"
    if ref.is_file():
        commit = ref.read_text(encoding="utf-8").strip()
        if (snapshots / commit).is_dir():
            return snapshots / commit
    candidates = [p for p in snapshots.iterdir() if p.is_dir()]
    if not candidates:
        return None
    return max(candidates, key=lambda p: p.stat().st_mtime)


def hf_repo_id_of(folder: Path) -> str | None:
    """The repo id ("ORG/NAME") when `folder` is a snapshot in a hub cache, else None."""
    parts = folder.resolve().parts
    if len(parts) >= 3 and parts[-2] == "snapshots" and parts[-3].startswith("models--"):
        return parts[-3].removeprefix("models--").replace("--", "/", 1)
    return None
