"""History across restarts: tabs come back, --fresh and --resume, a corrupt file is reported, a
read-only one runs without saving."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from app_doubles import async_test, fake_app, open_tab, paste_text, wait_until

from chat_app import history
from chat_app.session import ChatSettings
from chat_app.widgets.messages import AssistantReply, UserMessage

SIZE = (100, 32)


async def chat(pilot, text: str) -> None:
    """Send a message in the shown tab and wait for the whole reply."""
    pane = pilot.app.chat_screen.active_pane
    n = len(pane.session.messages)
    await paste_text(pilot, text)
    await pilot.press("enter")
    await wait_until(
        pilot,
        lambda: len(pane.session.messages) == n + 2 and not pane.replying,
        f"the reply to {text!r}",
    )


async def first_run(tmp_path: Path) -> list[int]:
    """Two tabs, three tabs' worth of history (one closed); returns the open sessions' ids."""
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.client.ready, "the engine")
        await chat(pilot, "closed chat")
        await open_tab(pilot)
        await chat(pilot, "alpha one")
        await chat(pilot, "alpha two")
        screen = app.chat_screen
        screen.active_pane.session.update_settings(ChatSettings(temperature=0.0, top_k=3))
        await open_tab(pilot)
        await chat(pilot, "beta")
        await pilot.press("alt+1", "ctrl+w")  # close "closed chat"
        await wait_until(pilot, lambda: len(screen.panes) == 2, "the tab to close")
        ids = [p.session.id for p in screen.panes]
        await pilot.press("ctrl+q")
    return ids


@async_test
async def test_open_tabs_come_back_after_a_restart(tmp_path: Path) -> None:
    ids = await first_run(tmp_path)
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.client.ready, "the engine")
        screen = app.chat_screen
        panes = screen.panes
        assert [p.session.id for p in panes] == ids
        alpha, beta = panes
        assert [m.content for m in alpha.session.messages if m.role == "user"] == [
            "alpha one",
            "alpha two",
        ]
        assert len(alpha.query(UserMessage)) == 2 and len(alpha.query(AssistantReply)) == 2
        assert alpha.session.settings.top_k == 3 and alpha.session.settings.temperature == 0.0
        assert str(screen.tabs.get_tab(beta).label) == "2 beta"
        # A restored chat goes on where it stopped, with its whole history in the prompt.
        await pilot.press("alt+1")
        await chat(pilot, "alpha three")
        assert len(alpha.session.messages) == 6


@async_test
async def test_fresh_starts_empty_and_resume_reopens_a_chat(tmp_path: Path) -> None:
    ids = await first_run(tmp_path)
    app, _ = fake_app(tmp_path, fresh=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.client.ready, "the engine")
        (pane,) = app.chat_screen.panes
        assert pane.session.messages == [] and pane.session.id is None
        await pilot.press("ctrl+q")

    closed_id = 1  # the first chat of first_run, closed before quitting
    assert closed_id not in ids
    app, _ = fake_app(tmp_path, resume=closed_id)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.client.ready, "the engine")
        screen = app.chat_screen
        (pane,) = screen.panes  # --fresh left no open tabs behind
        assert pane.session.id == closed_id and screen.active_pane is pane
        assert pane.session.messages[0].content == "closed chat"


@async_test
async def test_resume_of_an_unknown_chat_says_so(tmp_path: Path) -> None:
    app, _ = fake_app(tmp_path, resume=99)
    notes: list[str] = []
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.client.ready, "the engine")
        notes = [n.message for n in app._notifications]
        assert len(app.chat_screen.panes) == 1
    assert any("no chat 99" in note for note in notes)


@async_test
async def test_a_corrupt_history_is_moved_aside_and_the_app_says_so(tmp_path: Path) -> None:
    (tmp_path / "history.db").write_bytes(b"garbage, not SQLite" * 50)
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.client.ready, "the engine")
        notes = [n.message for n in app._notifications]
        assert any("could not be read" in note and "moved to" in note for note in notes)
        (moved,) = tmp_path.glob("history.db.corrupt-*")
        assert moved.read_bytes().startswith(b"garbage")
        await chat(pilot, "a new history works")
        assert app.chat_screen.active_pane.session.id == 1


@async_test
async def test_a_read_only_history_restores_its_tabs_and_runs_without_saving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = await first_run(tmp_path)
    before = (tmp_path / "history.db").read_bytes()

    def read_only_connect(path: Path, busy_timeout: float) -> sqlite3.Connection:
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(history, "_connect", read_only_connect)
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.client.ready, "the engine")
        notes = [n.message for n in app._notifications]
        assert any("read-only" in note and "not be saved" in note for note in notes)
        assert [pane.session.id for pane in app.chat_screen.panes] == ids
        await chat(pilot, "this one is not saved")
    assert (tmp_path / "history.db").read_bytes() == before
    assert not list(tmp_path.glob("history.db.corrupt-*"))


@async_test
async def test_a_reply_interrupted_by_a_crash_comes_back_marked(tmp_path: Path) -> None:
    app, engine = fake_app(tmp_path, manual=True)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.client.ready, "the engine")
        pane = app.chat_screen.active_pane
        await paste_text(pilot, "crash soon")
        await pilot.press("enter")
        engine.allow_steps(3)
        await wait_until(pilot, lambda: pane.session.messages[-1].content, "a few tokens")
        reply = pane.session.messages[-1]
        reply.content = "what streamed"  # as the periodic save would have written it
        app.store.update_message(reply)
        app.store.set_open_tabs([pane.session.id])
        app.store = None  # "crash": nothing more reaches the store
        pane.session._store = None
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await wait_until(pilot, lambda: app.client.ready, "the engine")
        pane = app.chat_screen.active_pane
        last = pane.session.messages[-1]
        assert (last.content, last.finish_reason) == ("what streamed", "interrupted")
        ending = pane.query_one(AssistantReply).query_one(".ending")
        assert "interrupted" in str(ending.render())
