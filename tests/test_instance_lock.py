"""One tinychat app per home: a second one stops with a clear message; a stale lock is taken
over."""

from __future__ import annotations

import argparse
import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chat_app import instance_lock
from chat_app.history import HistoryStore
from chat_app.instance_lock import LOCK_NAME, AlreadyRunning, InstanceLock
from chat_app.launch import add_app_arguments, run_app


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_second_lock_on_the_same_home_is_refused_until_the_first_is_released(
    tmp_path: Path,
) -> None:
    first = InstanceLock.acquire(tmp_path)
    assert (tmp_path / LOCK_NAME).read_text().strip() == str(os.getpid())
    with pytest.raises(AlreadyRunning, match=f"pid {os.getpid()}") as caught:
        InstanceLock.acquire(tmp_path)
    assert caught.value.pid == os.getpid()
    InstanceLock.acquire(tmp_path / "other-home").release()  # another home is free
    first.release()
    second = InstanceLock.acquire(tmp_path)
    second.release()


def test_a_stale_lock_file_is_taken_over(tmp_path: Path) -> None:
    dead = _dead_pid()
    (tmp_path / LOCK_NAME).write_text(f"{dead}\n")
    lock = InstanceLock.acquire(tmp_path)
    assert (tmp_path / LOCK_NAME).read_text().strip() == str(os.getpid())
    lock.release()


def test_a_lock_held_by_a_process_that_was_killed_is_taken_over(tmp_path: Path) -> None:
    script = (
        "import pathlib, sys, time\n"
        "from chat_app.instance_lock import InstanceLock\n"
        "lock = InstanceLock.acquire(pathlib.Path(sys.argv[1]))\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(AlreadyRunning, match=f"pid {holder.pid}"):
            InstanceLock.acquire(tmp_path)
    finally:
        holder.kill()  # as kill -9: no release ran
        holder.wait()
    assert (tmp_path / LOCK_NAME).read_text().strip() == str(holder.pid)
    InstanceLock.acquire(tmp_path).release()


def test_without_flock_the_pid_in_the_file_decides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_flock(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "no locks on this filesystem")

    monkeypatch.setattr(instance_lock.fcntl, "flock", no_flock)
    (tmp_path / LOCK_NAME).write_text(f"{_dead_pid()}\n")
    InstanceLock.acquire(tmp_path).release()  # dead: taken over
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        (tmp_path / LOCK_NAME).write_text(f"{alive.pid}\n")
        with pytest.raises(AlreadyRunning, match=f"pid {alive.pid}"):
            InstanceLock.acquire(tmp_path)
    finally:
        alive.kill()
        alive.wait()


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_app_arguments(parser)
    return parser.parse_args(list(argv))


def test_a_second_app_on_the_same_home_says_so_and_leaves_the_history_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TINYCHAT_HOME", str(tmp_path))
    store = HistoryStore.open(tmp_path / "history.db")
    a, b = store.create_session("a", "{}"), store.create_session("b", "{}")
    store.set_open_tabs([b, a])
    store.close()
    first = InstanceLock.acquire(tmp_path)  # the first app, still running
    try:
        assert run_app(_parse()) == 1
    finally:
        first.release()
    err = capsys.readouterr().err
    assert "another tinychat" in err and f"pid {os.getpid()}" in err
    assert str(tmp_path) in err
    assert HistoryStore.open(tmp_path / "history.db").open_tabs() == [b, a]


def test_the_app_reports_a_locked_history_without_starting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sqlite3

    monkeypatch.setenv("TINYCHAT_HOME", str(tmp_path))
    monkeypatch.setattr("chat_app.history.DEFAULT_BUSY_TIMEOUT", 0.1)
    HistoryStore.open(tmp_path / "history.db").close()
    holder = sqlite3.connect(tmp_path / "history.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        assert run_app(_parse()) == 1
    finally:
        holder.close()
    assert "locked" in capsys.readouterr().err
    InstanceLock.acquire(tmp_path).release()  # run_app let its instance lock go
    assert not list(tmp_path.glob("history.db.corrupt-*"))
