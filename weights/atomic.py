"""Write a folder all at once: build it under a temporary name, then rename it into place.

A conversion takes seconds to minutes and may be interrupted (Ctrl-C, a killed process, a full
disk). Building `.NAME.tmp-<pid>-<random>` next to the destination and renaming it at the end
means the destination either does not exist or is complete: a rename within one directory is
atomic. The temporary name carries the writer's pid, so a later run can tell a leftover of a
dead process (removed) from a conversion that another live process is doing right now (left
alone).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

MARKER = ".tinychat-complete"
"""Written last inside a finished folder; its content says what the folder was made from."""


def _left_by_a_dead_process(path: Path) -> bool:
    """True if the temp folder's writer (the pid in its name) no longer runs."""
    pid_text = path.name.rsplit(".tmp-", 1)[1].split("-", 1)[0]
    if not pid_text.isdigit():
        return True
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    if os.name == "nt":
        # os.kill(pid, 0) would send Ctrl-C on Windows: go by age instead.
        return time.time() - path.stat().st_mtime > 24 * 3600
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # exists but is not ours, or we cannot tell: leave it alone
    return False


def clean_stale_temps(dest: Path) -> None:
    """Remove temporary folders for `dest` left behind by processes that no longer run."""
    if not dest.parent.is_dir():
        return
    for path in dest.parent.glob(f".{dest.name}.tmp-*"):
        if _left_by_a_dead_process(path):
            shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def atomic_folder(dest: Path, marker_text: str) -> Iterator[Path]:
    """Yield an empty temporary folder; on success write the marker and move it to `dest`.

    An existing `dest` is replaced. On an exception the temporary folder is removed.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temps(dest)
    tmp = dest.parent / f".{dest.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
        (tmp / MARKER).write_text(marker_text, encoding="utf-8")
        if dest.exists():
            # Move the old folder aside first: a directory cannot be renamed onto a non-empty one.
            old = dest.parent / f".{dest.name}.tmp-{os.getpid()}-old-{uuid.uuid4().hex[:8]}"
            dest.rename(old)
            tmp.rename(dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            try:
                tmp.rename(dest)
            except OSError:
                if read_marker(dest) is None:
                    raise
                shutil.rmtree(tmp, ignore_errors=True)  # another process finished first
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_marker(folder: Path) -> str | None:
    """The marker text of a finished folder, or None if the folder is absent or unfinished."""
    try:
        return (folder / MARKER).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


@contextlib.contextmanager
def scratch_folder(near: Path, label: str) -> Iterator[Path]:
    """A temporary working folder inside `near`, always removed afterwards (stale ones too)."""
    near.mkdir(parents=True, exist_ok=True)
    clean_stale_temps(near / label)
    tmp = near / f".{label}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
