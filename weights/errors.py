"""The one error type of `weights/`, and the progress callback type.

Every problem with a model folder, a file in it or a download ends as a `ModelLoadError` whose
message is one line naming the file and what is wrong, so the CLI can print it as is (no
traceback) and the user knows which file to fix.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

ProgressFn = Callable[[str, int, int], None]
"""`progress(stage, done, total)`: what is happening, how far, out of how much (0 = unknown)."""


class ModelLoadError(Exception):
    """A model folder, file or download that tinychat cannot use; the message is one line."""

    def __init__(self, message: str) -> None:
        # One line, always: the CLI prints str(error) after "error: ".
        super().__init__(" ".join(str(message).split("\n")))


def fail(path: Path | str, what: str) -> ModelLoadError:
    """A `ModelLoadError` saying `<path>: <what>` (raise the result)."""
    return ModelLoadError(f"{path}: {what}")


def report(progress: ProgressFn | None, stage: str, done: int, total: int) -> None:
    """Call `progress` when there is one (most callers pass None)."""
    if progress is not None:
        progress(stage, done, total)
