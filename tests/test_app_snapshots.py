"""Snapshots of the main screens (pytest-textual-snapshot; update with --snapshot-update).

Deterministic by construction: a fixed terminal size, the fake engine in manual mode with a
virtual clock (so TTFT and tokens/s are exact), no stats timer, no cursor blink.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from app_doubles import FakeEngine, fake_app, open_tab, paste_text, wait_until
from textual.widgets import TextArea

from chat_app.app import TinyChatApp
from chat_app.history import HistoryStore
from chat_app.keymap import load_keymap
from chat_app.session import ChatSession, ChatSettings
from chat_app.widgets.chat_pane import ChatPane

SIZE = (100, 30)

MARKDOWN_REPLY = (
    "Prefix caching keeps the **KV blocks** of a prompt's full blocks, keyed by a hash of "
    "their tokens:\n\n- a follow-up question reuses the earlier turns\n- only the new message "
    "is prefilled\n\n```python\nllm.chat(messages)\n```"
)


def reply(prompt: str) -> str:
    if "prefix caching" in prompt:
        return MARKDOWN_REPLY
    return "Tokens arrive one by one while the other tab is shown, and this one keeps going."


@pytest.fixture(autouse=True)
def fixed_home(monkeypatch) -> None:
    """The help screen shows the keymap path: make it the same on every machine."""
    monkeypatch.setenv("TINYCHAT_HOME", "/home/you/.cache/tinychat")


def snapshot_app(tmp_path: Path, **options):
    engine = FakeEngine(model_name="SmolLM2-135M-Instruct", reply=reply, step_time=0.05)
    return fake_app(tmp_path, engine, manual=True, step_delay=0, stats_interval=0, **options)


async def settle(pilot) -> None:
    """No blinking cursor, and a status bar read after everything happened."""
    for text_area in pilot.app.screen.query(TextArea):
        text_area.cursor_blink = False
    pilot.app.chat_screen.refresh_status()
    await pilot.pause()


async def ask(pilot, text: str) -> None:
    await paste_text(pilot, text)
    await pilot.press("enter")


def test_start_screen(tmp_path: Path, snap_compare) -> None:
    app, _ = snapshot_app(tmp_path)

    async def run_before(pilot) -> None:
        await wait_until(pilot, lambda: app.client.ready, "the engine")
        await settle(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_two_tabs_one_streaming_in_the_background(tmp_path: Path, snap_compare) -> None:
    app, engine = snapshot_app(tmp_path)

    async def run_before(pilot) -> None:
        await wait_until(pilot, lambda: app.client.ready, "the engine")
        first = app.chat_screen.active_pane
        await ask(pilot, "What does prefix caching do?")
        engine.allow_steps(200)
        await wait_until(pilot, lambda: not first.replying, "the first reply")
        engine.hold()
        await open_tab(pilot)
        second = app.chat_screen.active_pane
        await ask(pilot, "Keep talking while I look at the other tab")
        engine.allow_steps(6)
        await wait_until(
            pilot, lambda: len(second.session.messages[-1].content.split()) == 6, "6 tokens"
        )
        await pilot.press("alt+1")
        await wait_until(pilot, lambda: app.chat_screen.active_pane is first, "tab 1 shown")
        await settle(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


@pytest.mark.parametrize("size", [(160, 50), (80, 24)], ids=["160x50", "80x24"])
def test_help_screen(tmp_path: Path, snap_compare, size: tuple[int, int]) -> None:
    """Every row whole: the "Does" column wraps (at 160 columns a DataTable cut the last id)."""
    app, _ = snapshot_app(tmp_path)

    async def run_before(pilot) -> None:
        await wait_until(pilot, lambda: app.client.ready, "the engine")
        await settle(pilot)
        await pilot.press("f1")

    assert snap_compare(app, terminal_size=size, run_before=run_before)


def test_80_columns_reset_with_a_keymap_notice(tmp_path: Path, snap_compare) -> None:
    """The status bar's fields whole at 80 columns, the tab renamed by Ctrl+R, and two toasts
    at the top right, clear of the message box (the keymap's one notice names the bad
    entries)."""
    keymap = tmp_path / "keymap.json"
    keymap.write_text('{"new_chat": "ctrl+t", "close_chat": 5, "new_tab": "f9"}')
    good, notice = load_keymap(keymap, TinyChatApp.binding_ids())
    notice = notice.replace(str(tmp_path), "/home/you/.cache/tinychat")
    app, engine = snapshot_app(tmp_path, keymap=good, notices=[notice])

    async def run_before(pilot) -> None:
        await wait_until(pilot, lambda: app.client.ready, "the engine")
        pane = app.chat_screen.active_pane
        await ask(pilot, "Tell me about tokens")
        engine.allow_steps(200)
        await wait_until(pilot, lambda: not pane.replying and pane.session.messages, "reply")
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: not pane.session.messages, "the reset")
        await settle(pilot)

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_160_columns_a_restored_chat_re_reading(tmp_path: Path, snap_compare, monkeypatch) -> None:
    """After a restart, the first reply in a long chat waits while its history is read again:
    the status bar says so until the first token (the engine is held here). The toasts (a
    corrupt history moved aside, an export) show their whole paths, clear of the input."""
    exported = Path("/home/you/.cache/tinychat/exports/tinychat-1-what-does-prefix-caching-do.md")
    monkeypatch.setattr(ChatPane, "export", lambda self, folder, model: exported)
    store = HistoryStore.open(tmp_path / "history.db")
    session = ChatSession(ChatSettings(), store)
    session.add_user("What does prefix caching do?")
    session.begin_reply()
    session.extend_reply(MARKDOWN_REPLY)
    session.finish_reply("stop")
    store.set_open_tabs([session.id])
    store.close()
    notice = (
        "The chat history at /home/you/.cache/tinychat/history.db could not be read (file is "
        "not a database); it was moved to /home/you/.cache/tinychat/history.db.corrupt-"
        "20261206-150000 and a new history was started."
    )
    app, _ = snapshot_app(tmp_path, notices=[notice])

    async def run_before(pilot) -> None:
        await wait_until(pilot, lambda: app.client.ready, "the engine")
        await ask(pilot, "And without it?")
        pane = app.chat_screen.active_pane
        await wait_until(pilot, lambda: app.client.rereading(pane) is not None, "the request")
        await pilot.press("ctrl+e")
        await settle(pilot)

    assert snap_compare(app, terminal_size=(160, 50), run_before=run_before)


def test_settings_screen_refusing_an_invalid_value(tmp_path: Path, snap_compare) -> None:
    app, _ = snapshot_app(tmp_path)

    async def run_before(pilot) -> None:
        await wait_until(pilot, lambda: app.client.ready, "the engine")
        await settle(pilot)
        await pilot.press("ctrl+s")
        app.screen.query_one("#top_p").value = "1.5"
        app.screen.query_one("#system_prompt").load_text("You are a concise assistant.")
        await pilot.press("ctrl+s")
        for text_area in app.screen.query(TextArea):
            text_area.cursor_blink = False
        # No focus, so no cursor: a focused field's blinking cursor made the picture depend on
        # the moment it was taken.
        app.screen.set_focus(None)
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


def test_model_that_failed_to_load(tmp_path: Path, snap_compare) -> None:
    app, _ = snapshot_app(tmp_path)

    def broken():
        raise FileNotFoundError("no config.json in /models/missing")

    app._engine_factory = broken

    async def run_before(pilot) -> None:
        await wait_until(pilot, lambda: app.client.load_error is not None, "the failure")
        await pilot.pause()
        app.clear_notifications()
        await settle(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)
