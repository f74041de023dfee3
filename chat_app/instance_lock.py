"""One `tinychat` app per home: a lock file (`tinychat.lock`, holding the pid) in $TINYCHAT_HOME.

Two apps on one history would restore the same tabs and write the same chats, so a second one
stops with a message naming the first one's pid. The lock itself is an flock on the file, which
the kernel drops when its process dies however it dies: a lock file left by a crash (its pid
no longer alive) is simply taken over. Where the filesystem has no flock, the pid in the file
decides (alive: held). A home that can't be written gets no lock: the history is read-only
there, so a second app can't overwrite anything.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

LOCK_NAME = "tinychat.lock"


class AlreadyRunning(Exception):
    """Another live tinychat app holds the lock; `pid` is its process id (None: unknown)."""

    def __init__(self, path: Path, pid: int | None) -> None:
        who = f"another tinychat (pid {pid})" if pid else "another tinychat"
        super().__init__(
            f"{who} is already using the chat history in {path.parent}; quit it first, "
            "or run this one with TINYCHAT_HOME set to another folder."
        )
        self.path = path
        self.pid = pid


class InstanceLock:
    """Held from `acquire` until `release` (or the process ends)."""

    def __init__(self, path: Path, fd: int | None) -> None:
        self.path = path
        self._fd = fd  # None: no lock could be taken (read-only home)

    @classmethod
    def acquire(cls, folder: Path) -> InstanceLock:
        """Take the lock in `folder`; AlreadyRunning if a live app holds it."""
        path = folder / LOCK_NAME
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            if error.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                return cls(path, None)
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise AlreadyRunning(path, pid) from None
        except OSError:  # no flock on this filesystem: trust the pid
            pid = _read_pid(fd)
            if pid is not None and pid != os.getpid() and _alive(pid):
                os.close(fd)
                raise AlreadyRunning(path, pid) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(path, fd)

    def release(self) -> None:
        """Let the next app in. The file stays (removing it would race with a starting app)."""
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)
        os.close(self._fd)  # closing drops the flock
        self._fd = None


def _read_pid(fd: int) -> int | None:
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return int(text) if text.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True
