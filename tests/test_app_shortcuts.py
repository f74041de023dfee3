"""Every shortcut does what the help screen says, and every one can be remapped."""

from __future__ import annotations

from pathlib import Path

from app_doubles import FakeEngine, async_test, fake_app, open_tab, paste_text, wait_until
from rich.table import Table
from textual.command import CommandPalette
from textual.widgets import Static

from chat_app.commands import ChatCommands
from chat_app.help_screen import HelpScreen
from chat_app.history import HistoryStore
from chat_app.settings_screen import SettingsScreen
from chat_app.widgets.chat_pane import ChatPane

SIZE = (100, 32)


async def ready(pilot) -> None:
    await wait_until(pilot, lambda: pilot.app.client.ready, "the engine")


async def send(pilot, text: str) -> None:
    await paste_text(pilot, text)
    await pilot.press("enter")


def answered(pane: ChatPane, n: int = 1) -> bool:
    return not pane.replying and sum(m.role == "assistant" for m in pane.session.messages) >= n


def capture_notifications(app) -> list[str]:
    seen: list[str] = []
    original = app.notify

    def notify(message: str, **kwargs) -> None:
        seen.append(message)
        original(message, **kwargs)

    app.notify = notify
    return seen


@async_test
async def test_ctrl_n_opens_a_tab_and_ctrl_w_closes_it(tmp_path: Path) -> None:
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        screen = app.chat_screen
        (first,) = screen.panes
        await pilot.press("ctrl+n")
        await wait_until(pilot, lambda: len(screen.panes) == 2, "a second tab")
        second = screen.panes[1]
        await wait_until(pilot, lambda: screen.active_pane is second, "the new tab shown")
        assert second.input.has_focus
        await pilot.press("ctrl+w")
        await wait_until(pilot, lambda: screen.panes == [first], "the tab closed")
        assert screen.active_pane is first
        await pilot.press("ctrl+w")  # closing the last tab leaves a fresh empty one
        await wait_until(pilot, lambda: screen.panes and first not in screen.panes, "a fresh tab")
        assert len(screen.panes) == 1 and screen.active_pane.session.messages == []


@async_test
async def test_ctrl_w_aborts_the_reply_of_the_tab_it_closes(tmp_path: Path) -> None:
    app, engine = fake_app(tmp_path, FakeEngine(reply_words=30), manual=True)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "doomed")
        pane = app.chat_screen.active_pane
        engine.allow_steps(3)
        streamed = "You said: **doomed**."
        await wait_until(
            pilot, lambda: pane.session.messages[-1].content == streamed, "three tokens"
        )
        session_id = pane.session.id
        await pilot.press("ctrl+w")
        engine.allow_steps(1)
        await wait_until(pilot, lambda: engine.stats().num_running == 0, "the abort")
        assert engine.stats().kv_blocks_used == 0
        record = HistoryStore.open(tmp_path / "history.db").load_session(session_id)
        assert record.messages[-1].finish_reason == "abort"
        assert record.messages[-1].content == streamed


@async_test
async def test_alt_number_and_ctrl_page_keys_switch_tabs(tmp_path: Path) -> None:
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        screen = app.chat_screen
        await pilot.press("ctrl+n", "ctrl+n")
        await wait_until(pilot, lambda: len(screen.panes) == 3, "three tabs")
        first, second, third = screen.panes
        await wait_until(pilot, lambda: screen.active_pane is third, "the third tab shown")
        assert screen.active_pane is third
        await pilot.press("alt+1")
        assert screen.active_pane is first and first.input.has_focus
        await pilot.press("alt+3")
        assert screen.active_pane is third
        await pilot.press("alt+7")  # no seventh tab: nothing happens
        assert screen.active_pane is third
        await pilot.press("ctrl+pagedown")
        assert screen.active_pane is first  # wraps around
        await pilot.press("ctrl+pagedown")
        assert screen.active_pane is second
        await pilot.press("ctrl+pageup", "ctrl+pageup")
        assert screen.active_pane is third


@async_test
async def test_ctrl_s_settings_are_validated_and_applied(tmp_path: Path) -> None:
    app, engine = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        pane = app.chat_screen.active_pane
        await pilot.press("ctrl+s")
        dialog = app.screen
        assert isinstance(dialog, SettingsScreen)
        error = dialog.query_one("#settings-error")

        dialog.query_one("#top_p").value = "1.5"
        await pilot.click("#save")
        assert app.screen is dialog  # not applied, still open
        assert "top_p must be in (0, 1], got 1.5" in str(error.render())

        dialog.query_one("#top_p").value = "0.8"
        dialog.query_one("#temperature").value = "warm"
        await pilot.press("ctrl+s")
        assert app.screen is dialog
        assert "'warm' is not a valid number" in str(error.render())

        dialog.query_one("#temperature").value = "0"
        dialog.query_one("#seed").value = "42"
        dialog.query_one("#system_prompt").load_text("You are a pirate.")
        await pilot.press("ctrl+s")
        assert app.screen is app.chat_screen
        settings = pane.session.settings
        assert (settings.top_p, settings.temperature, settings.seed) == (0.8, 0.0, 42)
        await send(pilot, "ahoy")
        await wait_until(pilot, lambda: answered(pane), "the reply")
        _, prompt, params = engine.engine.requests[-1]
        assert (params.top_p, params.temperature, params.seed) == (0.8, 0.0, 42)
        assert "You are a pirate." in prompt

        await pilot.press("ctrl+s")
        dialog = app.screen
        dialog.query_one("#top_p").value = "0.5"
        await pilot.press("escape")  # cancel: nothing changes
        assert pane.session.settings.top_p == 0.8


@async_test
async def test_ctrl_e_exports_markdown_and_says_where(tmp_path: Path) -> None:
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        notes = capture_notifications(app)
        pane = app.chat_screen.active_pane
        await send(pilot, "export me")
        await wait_until(pilot, lambda: answered(pane), "the reply")
        await pilot.press("ctrl+e")
        (path,) = (tmp_path / "exports").glob("*.md")
        assert any(str(path) in note for note in notes)
        text = path.read_text()
        assert text.startswith("# export me\n")
        assert "## You\n\nexport me\n" in text
        assert "## Assistant\n\nYou said: **export me**." in text
        assert "model: fake-echo" in text


@async_test
async def test_ctrl_e_exports_into_the_home_not_the_current_folder(tmp_path: Path, monkeypatch):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.setenv("TINYCHAT_HOME", str(home))
    monkeypatch.chdir(cwd)
    app, _ = fake_app(tmp_path, export_dir=None)  # what `tinychat` runs: no folder given
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        notes = capture_notifications(app)
        pane = app.chat_screen.active_pane
        await send(pilot, "where to")
        await wait_until(pilot, lambda: answered(pane), "the reply")
        await pilot.press("ctrl+e")
        (path,) = (home / "exports").glob("*.md")
        assert list(cwd.iterdir()) == []
        assert path.is_absolute() and f"Chat exported to {path}" in notes


@async_test
async def test_ctrl_y_copies_the_last_reply(tmp_path: Path) -> None:
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        pane = app.chat_screen.active_pane
        await send(pilot, "copy me")
        await wait_until(pilot, lambda: answered(pane), "the reply")
        await pilot.press("ctrl+y")
        assert app.clipboard == pane.session.messages[-1].content
        assert app.clipboard.startswith("You said: **copy me**.")


@async_test
async def test_f1_lists_every_binding_with_its_id(tmp_path: Path) -> None:
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        rows = app.chat_screen.shortcuts()
        ids = {binding_id for _, _, binding_id in rows}
        expected = {
            "send", "newline", "recall_last", "scroll_up", "scroll_down", "new_chat",
            "close_chat", "stop_reply", "regenerate", "reset_chat", "undo_reset", "settings",
            "export", "copy_reply", "restart_engine",
            "help", "next_tab", "previous_tab", "tab_1 … tab_9", "quit", "command_palette",
        }  # fmt: skip
        assert ids == expected
        table = app.screen.query_one("#help-table", Static).content
        assert isinstance(table, Table) and table.row_count == len(rows)
        assert ("^n", "Open a new chat tab", "new_chat") in rows
        await pilot.press("escape")
        assert app.screen is app.chat_screen


@async_test
async def test_ctrl_p_palette_lists_every_action_and_runs_them(tmp_path: Path) -> None:
    app, _ = fake_app(tmp_path)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        screen = app.chat_screen
        provider = ChatCommands(screen)
        titles = [hit.text async for hit in provider.discover()]
        for title in ["New", "Close", "Stop", "Regenerate", "Reset", "Undo reset", "Settings",
                      "Export", "Copy reply", "Help", "Next tab", "Previous tab",
                      "Go to tab 1: New chat"]:  # fmt: skip
            assert title in titles
        await pilot.press("ctrl+p")
        assert isinstance(app.screen, CommandPalette)
        await paste_text(pilot, "New")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_until(pilot, lambda: len(screen.panes) == 2, "a new tab from the palette")


@async_test
async def test_ctrl_q_stops_replies_and_saves_them(tmp_path: Path) -> None:
    app, engine = fake_app(tmp_path, FakeEngine(reply_words=30), manual=True)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "first tab")
        await open_tab(pilot)
        await send(pilot, "second tab")
        engine.allow_steps(2)
        panes = app.chat_screen.panes
        await wait_until(
            pilot,
            lambda: all(p.session.messages[-1].content == "You said:" for p in panes),
            "two tokens in both",
        )
        ids = [p.session.id for p in panes]
        await pilot.press("ctrl+q")
        await wait_until(pilot, lambda: not app.is_running, "the app to exit")
    assert app.return_code == 0
    store = HistoryStore.open(tmp_path / "history.db")
    assert store.open_tabs() == ids
    for session_id in ids:  # saved at once on quitting, not a second later
        last = store.load_session(session_id).messages[-1]
        assert (last.content, last.finish_reason) == ("You said:", "abort")


@async_test
async def test_a_keymap_moves_a_shortcut(tmp_path: Path) -> None:
    app, _ = fake_app(tmp_path, keymap={"new_chat": "ctrl+t", "close_chat": "f8"})
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        screen = app.chat_screen
        await pilot.press("ctrl+n")
        await pilot.pause(0.1)
        assert len(screen.panes) == 1
        await pilot.press("ctrl+t")
        await wait_until(pilot, lambda: len(screen.panes) == 2, "ctrl+t to open a tab")
        await pilot.press("f8")
        await wait_until(pilot, lambda: len(screen.panes) == 1, "f8 to close it")
        assert ("^t", "Open a new chat tab", "new_chat") in screen.shortcuts()
