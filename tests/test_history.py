"""HistoryStore and `tinychat history`: chats kept in SQLite; a corrupt file moved aside, a
locked or read-only one never."""

from __future__ import annotations

import argparse
import os
import sqlite3
import time
from pathlib import Path

import pytest

from chat_app import history
from chat_app.history import HistoryLocked, HistoryStore, add_history_arguments, print_history
from chat_app.session import ChatMessage


def test_sessions_and_messages_round_trip(tmp_path: Path) -> None:
    store = HistoryStore.open(tmp_path / "h.db")
    sid = store.create_session("Title", '{"temperature": 0.1}')
    store.add_message(sid, ChatMessage("user", "hi", "stop"))
    reply = ChatMessage("assistant", "hel", None)
    reply.id = store.add_message(sid, reply)
    reply.content, reply.finish_reason = "hello", "length"
    store.update_message(reply)
    store.close()

    record = HistoryStore.open(tmp_path / "h.db").load_session(sid)
    assert record is not None
    assert (record.title, record.settings) == ("Title", '{"temperature": 0.1}')
    assert [(m.role, m.content, m.finish_reason) for m in record.messages] == [
        ("user", "hi", "stop"),
        ("assistant", "hello", "length"),
    ]


def test_the_database_is_in_wal_mode(tmp_path: Path) -> None:
    HistoryStore.open(tmp_path / "h.db").close()
    with sqlite3.connect(tmp_path / "h.db") as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_open_tabs_are_remembered_in_order(tmp_path: Path) -> None:
    store = HistoryStore.open(tmp_path / "h.db")
    a, b, c = (store.create_session(t, "{}") for t in "abc")
    store.set_open_tabs([c, a])
    assert store.open_tabs() == [c, a]
    store.set_open_tabs([b])
    assert store.open_tabs() == [b]


def test_a_corrupt_database_is_moved_aside_with_a_notice(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    path.write_bytes(b"this is not a database, just some bytes\n" * 100)
    store = HistoryStore.open(path)
    assert store.notice is not None and "moved to" in store.notice
    moved = list(tmp_path.glob("history.db.corrupt-*"))
    assert len(moved) == 1
    assert moved[0].read_bytes().startswith(b"this is not a database")
    assert str(moved[0]) in store.notice
    # ...and the new history works.
    sid = store.create_session("fresh", "{}")
    assert store.load_session(sid) is not None


def test_a_database_damaged_inside_is_also_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    store = HistoryStore.open(path)
    sid = store.create_session("x", "{}")
    for i in range(300):
        store.add_message(sid, ChatMessage("user", f"message {i} " * 20, "stop"))
    store.close()
    data = bytearray(path.read_bytes()) if path.stat().st_size else None
    if data is None or len(data) < 8192:  # everything may still be in the WAL: checkpoint
        with sqlite3.connect(path) as db:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        data = bytearray(path.read_bytes())
    data[4096:8192] = b"\xff" * 4096  # wreck the second page
    path.write_bytes(bytes(data))
    store = HistoryStore.open(path)
    assert store.notice is not None
    assert list(tmp_path.glob("history.db.corrupt-*"))


def test_reset_messages_are_hidden_then_purged(tmp_path: Path) -> None:
    store = HistoryStore.open(tmp_path / "h.db")
    sid = store.create_session("x", "{}")
    store.add_message(sid, ChatMessage("user", "gone", "stop"))
    store.mark_reset(sid)
    assert store.load_session(sid).messages == []
    assert store.list_sessions()[0].num_messages == 0
    store.unmark_reset(sid)
    assert len(store.load_session(sid).messages) == 1
    store.mark_reset(sid)
    store.purge_reset()
    store.unmark_reset(sid)
    assert store.load_session(sid).messages == []


def _history_args(tmp_path: Path, *argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_history_arguments(parser)
    args = parser.parse_args(list(argv))
    args.history_path = tmp_path / "h.db"
    return args


def test_print_history_lists_id_title_when_and_message_count(tmp_path: Path, capsys) -> None:
    store = HistoryStore.open(tmp_path / "h.db")
    first = store.create_session("First chat", "{}")
    store.add_message(first, ChatMessage("user", "a", "stop"))
    store.add_message(first, ChatMessage("assistant", "b", "stop"))
    second = store.create_session("Second chat", "{}")
    store.add_message(second, ChatMessage("user", "c", "stop"))
    store.close()

    assert print_history(_history_args(tmp_path)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["ID", "WHEN", "MSGS", "TITLE"]
    rows = [line.split(None, 4) for line in lines[1:3]]
    assert [(r[0], r[3], r[4]) for r in rows] == [
        (str(second), "1", "Second chat"),
        (str(first), "2", "First chat"),
    ]
    assert "--resume" in lines[-1]

    assert print_history(_history_args(tmp_path, "--limit", "1")) == 0
    assert "First chat" not in capsys.readouterr().out


def test_print_history_with_no_chats(tmp_path: Path, capsys) -> None:
    assert print_history(_history_args(tmp_path)) == 0
    assert "No chats yet" in capsys.readouterr().out


@pytest.mark.parametrize("garbage", [b"\x00" * 10, b"SQLite format 3\x00" + b"\x01" * 200])
def test_print_history_survives_a_corrupt_file(tmp_path: Path, capsys, garbage: bytes) -> None:
    (tmp_path / "h.db").write_bytes(garbage)
    assert print_history(_history_args(tmp_path)) == 0
    captured = capsys.readouterr()
    assert "moved to" in captured.err


# -- only real corruption moves a file aside ------------------------------------------------


def _history_with_a_chat(path: Path) -> int:
    store = HistoryStore.open(path)
    sid = store.create_session("kept", "{}")
    store.add_message(sid, ChatMessage("user", "still here", "stop"))
    store.close()
    return sid


def test_a_locked_history_is_waited_for_then_reported_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    sid = _history_with_a_chat(path)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    started = time.monotonic()
    with pytest.raises(HistoryLocked, match="locked"):
        HistoryStore.open(path, busy_timeout=0.3)
    assert time.monotonic() - started >= 0.25  # it waited for the lock first
    holder.execute("COMMIT")
    holder.close()
    assert not list(tmp_path.glob("history.db.corrupt-*"))
    record = HistoryStore.open(path).load_session(sid)
    assert record is not None and record.messages[0].content == "still here"


def test_tinychat_history_reports_a_locked_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "history.db"
    _history_with_a_chat(path)
    monkeypatch.setattr("chat_app.history.DEFAULT_BUSY_TIMEOUT", 0.1)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")  # readers wait too, as the issue saw
    holder.execute("BEGIN EXCLUSIVE")
    try:
        args = argparse.Namespace(history_path=path, limit=None)
        assert print_history(args) == 1
    finally:
        holder.close()
    err = capsys.readouterr().err
    assert "locked" in err and "No chats yet" not in err
    assert not list(tmp_path.glob("history.db.corrupt-*"))


def _refuse_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite's answer for a history it can't write (chmod can't make one for root): the
    store must fall back to reading it."""

    def read_only_connect(path: Path, busy_timeout: float) -> sqlite3.Connection:
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(history, "_connect", read_only_connect)


def test_a_read_only_history_runs_without_saving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "history.db"
    sid = _history_with_a_chat(path)
    before = path.read_bytes()
    _refuse_writes(monkeypatch)
    store = HistoryStore.open(path)
    assert store.read_only
    assert store.notice is not None and "read-only" in store.notice
    assert "not be saved" in store.notice
    record = store.load_session(sid)  # the old chats still read...
    assert record is not None and record.messages[0].content == "still here"
    new = store.create_session("new", "{}")  # ...and new ones work, in memory only
    store.add_message(new, ChatMessage("user", "unsaved", "stop"))
    store.close()
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert not list(tmp_path.glob("history.db.corrupt-*"))
    assert HistoryStore.open(path).load_session(new) is None


def test_a_read_only_folder_with_no_history_yet_still_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _refuse_writes(monkeypatch)
    store = HistoryStore.open(tmp_path / "history.db")
    assert store.read_only and "read-only" in (store.notice or "")
    assert store.list_sessions() == []
    assert not (tmp_path / "history.db").exists()


def test_tinychat_history_lists_a_read_only_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "history.db"
    _history_with_a_chat(path)
    _refuse_writes(monkeypatch)
    assert print_history(argparse.Namespace(history_path=path, limit=None)) == 0
    out, err = capsys.readouterr()
    assert "kept" in out and "read-only" in err
    assert not list(tmp_path.glob("history.db.corrupt-*"))


@pytest.mark.skipif(
    os.geteuid() == 0 if hasattr(os, "geteuid") else True,
    reason="as root chmod does not make a folder read-only",
)
def test_a_chmod_read_only_folder_is_not_called_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    _history_with_a_chat(path)
    for side in tmp_path.glob("history.db-*"):
        side.unlink()
    tmp_path.chmod(0o555)
    try:
        store = HistoryStore.open(path)
        assert store.read_only and "read-only" in (store.notice or "")
        assert [s.title for s in store.list_sessions()] == ["kept"]
        store.close()
        assert not list(tmp_path.glob("history.db.corrupt-*"))
    finally:
        tmp_path.chmod(0o755)
