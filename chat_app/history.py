"""Every chat, kept in SQLite as it happens; and `tinychat history`, which lists them.

One file under the tinychat home, in WAL mode so that a write never waits for a reader and a
crash never leaves half a transaction. Every call commits at once: a chat is small, and a chat
that survives a crash is worth a few hundred microseconds a message.

Opening tells three failures apart, because only one of them means the file is lost:
- corrupt (not a database, a malformed page, a failed integrity check): the file is moved
  aside (never deleted) and a fresh one takes its place;
- locked or busy (another program holds it): waited for up to `busy_timeout`, then reported as
  `HistoryLocked`, the file untouched;
- read-only (the folder or the file can't be written): the history is copied into memory and
  the store runs without saving (`read_only`, with a `notice`), so the app still works and
  `tinychat history` still lists the chats.
"""

from __future__ import annotations

import argparse
import errno
import os
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from chat_app.chat_message import ChatMessage
from chat_app.paths import history_path

SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    title        TEXT NOT NULL DEFAULT '',
    settings     TEXT NOT NULL DEFAULT '{}',
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL,
    tab_position INTEGER                    -- NULL: not open in a tab
);
CREATE TABLE IF NOT EXISTS messages (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id    INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    role          TEXT NOT NULL,
    content       TEXT NOT NULL,
    finish_reason TEXT,                     -- NULL: still streaming (or the app died)
    error         TEXT,
    created_at    REAL NOT NULL,
    reset_pending INTEGER NOT NULL DEFAULT 0 -- cleared by a reset that can still be undone
);
CREATE INDEX IF NOT EXISTS messages_by_session ON messages (session_id, id);
"""


@dataclass
class SessionRecord:
    """A stored session, as the app reopens it."""

    id: int
    title: str
    settings: str  # JSON, read by ChatSettings.from_json
    messages: list[ChatMessage]


@dataclass
class SessionSummary:
    """One line of `tinychat history`."""

    id: int
    title: str
    updated_at: float
    num_messages: int


DEFAULT_BUSY_TIMEOUT = 5.0  # seconds to wait for another program's lock on the history


class HistoryError(Exception):
    """The history can't be opened, and the file was left as it is (the message says why)."""


class HistoryLocked(HistoryError):
    """Another program held the history locked for longer than the busy timeout."""


class _Corrupt(sqlite3.DatabaseError):
    """SQLite opened the file, but what is in it can't be used."""


class HistoryStore:
    """The chat history database. Use `HistoryStore.open(path)`; read `notice` afterwards."""

    def __init__(
        self,
        connection: sqlite3.Connection,
        path: Path,
        notice: str | None,
        *,
        read_only: bool = False,
    ) -> None:
        self._db = connection
        self.path = path
        self.notice = notice  # set when the file was moved aside or is read-only: tell the user
        self.read_only = read_only  # True: the chats live in memory only, nothing is saved

    @classmethod
    def open(cls, path: Path | None = None, *, busy_timeout: float | None = None) -> HistoryStore:
        """Open (or create) the history; HistoryError if it is locked or unreadable for a
        reason other than corruption. Only a corrupt file is ever renamed. busy_timeout:
        seconds to wait for another program's lock (default: DEFAULT_BUSY_TIMEOUT)."""
        path = Path(path) if path is not None else history_path()
        if busy_timeout is None:
            busy_timeout = DEFAULT_BUSY_TIMEOUT
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            return cls(_connect(path, busy_timeout), path, None)
        except OSError as error:
            if error.errno not in _READ_ONLY_ERRNOS:
                raise HistoryError(
                    f"The chat history at {path} can't be opened: {error}"
                ) from error
            return cls._open_read_only(path, busy_timeout)
        except _Corrupt as error:
            reason = str(error)
        except sqlite3.DatabaseError as error:
            kind = _classify(error, path)
            if kind == "locked":
                raise HistoryLocked(
                    f"The chat history at {path} is locked by another program (waited "
                    f"{busy_timeout:g} s); it was left untouched. Try again once that program "
                    "is done with it."
                ) from error
            if kind == "read-only":
                return cls._open_read_only(path, busy_timeout)
            if kind != "corrupt":
                raise HistoryError(
                    f"The chat history at {path} can't be opened ({error}); it was left untouched."
                ) from error
            reason = str(error)
        moved = _move_aside(path)
        notice = (
            f"The chat history at {path} could not be read ({reason}); it was moved to "
            f"{moved} and a new history was started."
        )
        return cls(_connect(path, busy_timeout), path, notice)

    @classmethod
    def _open_read_only(cls, path: Path, busy_timeout: float) -> HistoryStore:
        """The history copied into memory (empty if there is none): the app runs, and
        nothing it writes reaches the disk."""
        memory = sqlite3.connect(":memory:", isolation_level=None)
        if path.exists():
            source = _connect_read_only(path, busy_timeout)
            try:
                source.backup(memory)
            finally:
                source.close()
        memory.execute("PRAGMA foreign_keys = ON")
        memory.executescript(SCHEMA)
        folder_ok = os.access(path.parent, os.W_OK)
        where = f"The chat history {path}" if folder_ok else f"The folder {path.parent}"
        notice = f"{where} is read-only, so this run's chats will not be saved."
        return cls(memory, path, notice, read_only=True)

    def close(self) -> None:
        self._db.close()

    # -- sessions ---------------------------------------------------------------------------

    def create_session(self, title: str, settings: str) -> int:
        now = time.time()
        cursor = self._db.execute(
            "INSERT INTO sessions (title, settings, created_at, updated_at) VALUES (?, ?, ?, ?)",
            (title, settings, now, now),
        )
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def update_session(
        self, session_id: int, *, title: str | None = None, settings: str | None = None
    ) -> None:
        if title is not None:
            self._db.execute("UPDATE sessions SET title = ? WHERE id = ?", (title, session_id))
        if settings is not None:
            self._db.execute(
                "UPDATE sessions SET settings = ? WHERE id = ?", (settings, session_id)
            )

    def delete_session(self, session_id: int) -> None:
        """Forget a session and its messages."""
        with self._db:
            self._db.execute("DELETE FROM messages WHERE session_id = ?", (session_id,))
            self._db.execute("DELETE FROM sessions WHERE id = ?", (session_id,))

    def load_session(self, session_id: int) -> SessionRecord | None:
        row = self._db.execute(
            "SELECT id, title, settings FROM sessions WHERE id = ?", (session_id,)
        ).fetchone()
        if row is None:
            return None
        rows = self._db.execute(
            "SELECT id, role, content, finish_reason, error FROM messages"
            " WHERE session_id = ? AND reset_pending = 0 ORDER BY id",
            (session_id,),
        ).fetchall()
        messages = [
            # A reply with no finish reason was streaming when the app stopped.
            ChatMessage(role, content, reason or "interrupted", error, message_id)
            for message_id, role, content, reason, error in rows
        ]
        return SessionRecord(row[0], row[1], row[2], messages)

    def list_sessions(self, limit: int | None = None) -> list[SessionSummary]:
        rows = self._db.execute(
            "SELECT s.id, s.title, s.updated_at, COUNT(m.id) FROM sessions s"
            " LEFT JOIN messages m ON m.session_id = s.id AND m.reset_pending = 0"
            " GROUP BY s.id ORDER BY s.updated_at DESC, s.id DESC LIMIT ?",
            (-1 if limit is None else limit,),
        ).fetchall()
        return [SessionSummary(*row) for row in rows]

    def set_open_tabs(self, session_ids: list[int]) -> None:
        """Remember which sessions are open, in tab order, for the next start."""
        with self._db:
            self._db.execute("UPDATE sessions SET tab_position = NULL")
            self._db.executemany(
                "UPDATE sessions SET tab_position = ? WHERE id = ?",
                [(position, sid) for position, sid in enumerate(session_ids)],
            )

    def open_tabs(self) -> list[int]:
        rows = self._db.execute(
            "SELECT id FROM sessions WHERE tab_position IS NOT NULL ORDER BY tab_position"
        ).fetchall()
        return [row[0] for row in rows]

    # -- messages ---------------------------------------------------------------------------

    def add_message(self, session_id: int, message: ChatMessage) -> int:
        now = time.time()
        with self._db:
            cursor = self._db.execute(
                "INSERT INTO messages (session_id, role, content, finish_reason, error,"
                " created_at) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    session_id,
                    message.role,
                    message.content,
                    message.finish_reason,
                    message.error,
                    now,
                ),
            )
            self._db.execute("UPDATE sessions SET updated_at = ? WHERE id = ?", (now, session_id))
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def update_message(self, message: ChatMessage) -> None:
        self._db.execute(
            "UPDATE messages SET content = ?, finish_reason = ?, error = ? WHERE id = ?",
            (message.content, message.finish_reason, message.error, message.id),
        )

    def delete_message(self, message_id: int) -> None:
        self._db.execute("DELETE FROM messages WHERE id = ?", (message_id,))

    def mark_reset(self, session_id: int) -> None:
        """Hide a session's messages after a reset, keeping them until the reset is final."""
        self._set_reset_pending(session_id, True)

    def unmark_reset(self, session_id: int) -> None:
        self._set_reset_pending(session_id, False)

    def _set_reset_pending(self, session_id: int, pending: bool) -> None:
        self._db.execute(
            "UPDATE messages SET reset_pending = ? WHERE session_id = ?", (int(pending), session_id)
        )

    def purge_reset(self, session_id: int | None = None) -> None:
        """Make resets final: for one session, or (at start-up) for all of them."""
        if session_id is None:
            self._db.execute("DELETE FROM messages WHERE reset_pending = 1")
        else:
            self._db.execute(
                "DELETE FROM messages WHERE session_id = ? AND reset_pending = 1", (session_id,)
            )


_READ_ONLY_ERRNOS = (errno.EROFS, errno.EACCES, errno.EPERM)
_CORRUPT_CODES = ("SQLITE_NOTADB", "SQLITE_CORRUPT")


def _connect(path: Path, busy_timeout: float) -> sqlite3.Connection:
    """Open (or create) the database, check that SQLite can really read it, and take the
    write lock once (schema and version in one transaction) so a lock shows up here."""
    # autocommit; `with db:` groups writes. timeout: SQLite's busy handler waits for locks.
    db = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute("PRAGMA foreign_keys = ON")
        (status,) = db.execute("PRAGMA quick_check").fetchone()
        if status != "ok":
            raise _Corrupt(f"integrity check failed: {status}")
        (version,) = db.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            raise _Corrupt(f"written by a newer tinychat (schema {version})")
        db.executescript(
            f"BEGIN IMMEDIATE; {SCHEMA}; PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
        )
    except sqlite3.DatabaseError:
        db.close()
        raise
    return db


def _connect_read_only(path: Path, busy_timeout: float) -> sqlite3.Connection:
    """Open the file for reading only. A WAL database needs its -shm file, which a read-only
    folder may not let SQLite create: then read it as immutable (no one else can write it
    either, since the folder is read-only)."""
    uri = path.resolve().as_uri()
    try:
        db = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=busy_timeout)
        db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        return db
    except sqlite3.OperationalError:
        return sqlite3.connect(f"{uri}?immutable=1", uri=True, timeout=busy_timeout)


def _classify(error: sqlite3.DatabaseError, path: Path) -> str:
    """ "corrupt", "locked", "read-only" or "other": only "corrupt" may move the file aside."""
    name = getattr(error, "sqlite_errorname", "") or ""
    text = str(error).lower()
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in text:
        return "locked"
    if name.startswith("SQLITE_READONLY") or "readonly" in text or "read-only" in text:
        return "read-only"
    if name.startswith("SQLITE_CANTOPEN") and not _writable(path):
        return "read-only"
    if name.startswith(_CORRUPT_CODES) or "not a database" in text or "malformed" in text:
        return "corrupt"
    return "other"


def _writable(path: Path) -> bool:
    """Whether SQLite can write the file and create its -wal and -shm files beside it."""
    folder_ok = os.access(path.parent, os.W_OK | os.X_OK)
    return folder_ok and (not path.exists() or os.access(path, os.W_OK))


def _move_aside(path: Path) -> Path:
    """Rename the database (and its WAL files) to `<name>.corrupt-<time>`; returns the name."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    path.rename(target)
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.rename(target.with_name(target.name + suffix))
    return target


# -- `tinychat history` -------------------------------------------------------------------


def add_history_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `tinychat history`."""
    parser.add_argument("--limit", type=int, default=None, help="show only the N latest chats")


def print_history(args: argparse.Namespace) -> int:
    """List past chats, newest first: id (for --resume), title, when, number of messages."""
    try:
        store = HistoryStore.open(getattr(args, "history_path", None))
    except HistoryError as error:
        print(f"tinychat: error: {error}", file=sys.stderr)
        return 1
    try:
        if store.notice:
            print(f"tinychat: {store.notice}", file=sys.stderr)
        sessions = store.list_sessions(getattr(args, "limit", None))
    finally:
        store.close()
    if not sessions:
        print("No chats yet. Start one with: tinychat")
        return 0
    width = max(len(str(s.id)) for s in sessions)
    print(f"{'ID':>{width}}  {'WHEN':16}  {'MSGS':>4}  TITLE")
    for s in sessions:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(s.updated_at))
        print(f"{s.id:>{width}}  {when:16}  {s.num_messages:>4}  {s.title or '(untitled)'}")
    print("\nReopen one with: tinychat --resume ID")
    return 0
