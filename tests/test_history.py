"""HistoryStore and `tinychat history`: chats kept in SQLite, and a corrupt file moved aside."""

from __future__ import annotations

import argparse
import sqlite3
from pathlib import Path

import pytest

from chat_app.history import HistoryStore, add_history_arguments, print_history
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
